#pragma once
// communicator<Transport>: a rank's handle on a job, or on a group of its ranks split from it
// (features/groups.hpp). It owns the transport, the options, the sequence number of collective calls
// (every rank numbers its calls the same way, so the number identifies a call across ranks in
// error messages), scratch memory reused across calls, and the order of its calls: blocking and
// nonblocking ones (features/async.hpp) run one at a time in the order issued (comm/call_queue.hpp).
//
// It is a move-only handle on state that stays put, so a call in flight on the progress thread
// is not disturbed by the handle moving. A default-constructed one is null: what split() gives a
// rank that passes collx::no_color; every call on it fails with errc::invalid_argument.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <utility>
#include <vector>

#include <algorithm>
#include <array>
#include <mutex>
#include <memory>
#include <thread>
#include <unordered_map>

#include "../algo/profile.hpp"
#include "../core/call_info.hpp"
#include "../core/concepts.hpp"
#include "../core/debug.hpp"
#include "../core/error.hpp"
#include "../core/options.hpp"
#include "../core/schedule.hpp"
#include "../core/settings.hpp"
#include "../core/split_plan.hpp"
#include "call_queue.hpp"
#include "flight.hpp"
#include "schedule_cache.hpp"

namespace collx {

namespace detail {
/// The name the model's parameters are kept under: the transport's own ("inproc", "shm",
/// "tcp"), looking through transport::any and decorators.
template <class T>
const char* transport_kind(const T& t) {
  if constexpr (requires { t.kind(); }) return t.kind();
  else if constexpr (requires { t.inner(); }) return transport_kind(t.inner());
  else return T::name;
}
}  // namespace detail

/// split()'s color for a rank that joins no new communicator (MPI_UNDEFINED, NCCL_SPLIT_NOCOLOR):
/// it takes part in the split on the parent and gets a null communicator.
inline constexpr int no_color = -1;

template <class T>
class communicator {
  static_assert(check_transport<T>());

 public:
  using transport_type = T;

  explicit communicator(T t, options o = {}) : s_(std::make_unique<state>(std::move(t), o)) { s_->bind_observers(""); }
  /// A null communicator (see the top).
  communicator() = default;
  communicator(communicator&&) noexcept = default;
  communicator& operator=(communicator&& o) noexcept {
    if (this != &o) {
      retire();  // finishes this one's calls first (state's destructor)
      s_ = std::move(o.s_);
    }
    return *this;
  }
  ~communicator() { retire(); }

  /// False for a null communicator.
  bool valid() const noexcept { return s_ != nullptr; }
  explicit operator bool() const noexcept { return valid(); }

  /// This rank's number and the number of ranks (-1 and 0 when null).
  int rank() const noexcept { return s_ ? s_->t.rank() : -1; }
  int size() const noexcept { return s_ ? s_->t.size() : 0; }
  const options& opts() const noexcept { return s_->opts; }
  T& transport() noexcept { return s_->t; }
  const T& transport() const noexcept { return s_->t; }

  /// Which communicator this is, for messages: its name ("" for the job's own) and the job rank
  /// of each of its ranks.
  const comm_identity& identity() const noexcept { return s_->id; }
  /// The name split() gave it ("" for the job's own communicator).
  const std::string& name() const noexcept { return s_->id.name; }
  /// The job rank of rank r of this communicator (r itself on the job's own).
  int job_rank(int r) const noexcept { return s_->id.job_rank(r); }

  /// MPI_Comm_split: a collective call on this communicator. The ranks that pass the same color
  /// form a new communicator, ranked by (key, rank here); a rank that passes collx::no_color
  /// gets a null one. `name` names the new communicator in messages (default: its place among
  /// the splits: "s<k>c<color>"). Defined in features/groups.hpp.
  communicator split(int color, int key, const std::string& name = {});
  /// MPI_Comm_create_group, torch's new_group: a communicator of the ranks `members` (ranks here,
  /// in their new order), made by those ranks only; the others take no part and need not know.
  /// The members agree through the caller's channel instead of this communicator:
  /// `agree(blob)` is given this rank's transport offer and returns every member's, in the new
  /// order (a store serves: set yours, get the others'). `id` must be the same on every member
  /// and unique among the job's communicators. Defined in features/groups.hpp.
  template <class Agree>
  communicator create_group(const std::vector<int>& members, const std::string& id, Agree&& agree, const std::string& name = {});
  /// ncclCommShrink, ULFM's MPI_Comm_revoke + MPI_Comm_shrink: after a failure
  /// (errc::peer_lost: a rank died), the ranks still alive call it, agree on who they are, and
  /// get a new, working communicator of them, ranked as here (rank i of the new one is the i-th
  /// survivor by rank here). This one is revoked first, on every rank: a rank still in a call
  /// on it fails at once (and comes to shrink) rather than at its deadline. A collective call
  /// among the survivors (each transport finds them its own way: core/split_plan.hpp,
  /// shrink_request); a rank that has not called it by options::timeout is counted lost, and a
  /// rank the others went on without fails with errc::peer_lost. The survivors rebuild their
  /// sub-communicators from the new one (split, mesh). Defined in features/groups.hpp.
  communicator shrink(const std::string& name = {});
  /// What split() and create_group() end with: the new communicator of an agreed plan, over
  /// this transport's split, named `name` (default: the plan's id). Defined in features/groups.hpp.
  communicator child_of(split_plan plan, split_offer&& offer, const std::string& name);
  /// The new communicator over transport t of the ranks `members` here, with id `uid` (a
  /// split's plan id, a shrink's): its identity, named `name` (default: uid). Defined in features/groups.hpp.
  communicator adopt(T t, const std::string& uid, const std::vector<int>& members, const std::string& name);

  /// The sequence number of the next collective call (1-based).
  std::uint64_t next_seq() noexcept { return ++s_->seq; }
  std::uint64_t calls() const noexcept { return s_->seq; }

  /// The digest of this rank's zero-element calls so far (core/call_info.hpp): such calls return at
  /// once and are checked against the peers' at the next call that exchanges.
  std::uint64_t empty_calls() const noexcept { return s_->empty; }
  void set_empty_calls(std::uint64_t d) noexcept { s_->empty = d; }

  using schedule_key = detail::schedule_key;

  /// The schedule of key k, from this communicator's cache (comm/schedule_cache.hpp), built by
  /// build() when not there: good until two more have been got (comm/schedule_cache.hpp).
  template <class Build>
  const schedule* cached_schedule(const schedule_key& k, Build&& build) {
    return s_->cache.get(k, build);
  }
  detail::schedule_cache& schedules() noexcept { return s_->cache; }

  /// algo::automatic's state for this communicator (collectives/common.hpp fills and reads it):
  /// the cost model's parameters and COLLX_ALGO's overrides as rank 0 has them (every rank then
  /// decides alike), and the last decisions.
  struct automatic_state {
    /// model::params' numbers, trivially copyable: rank 0 broadcasts them as they are.
    struct numbers {
      double alpha = 0, beta = 0, gamma = 0, delta = 0;
      std::int32_t cores = 0, ranks = 0;  // model::params' sharing of cores
      algo::step_curve curve;             // measured step times, if any (algo/model.hpp)
      algo::policy_fit fit;               // measured / predicted per policy, if any
    };
    bool ready = false;
    numbers n;
    numbers node, net;  // on a communicator laid out on nodes: each level's (algo/nodes_model.hpp)
    bool levels = false;
    std::string source;
    std::array<std::int8_t, algo::kCollectives> forced = unset();  // per algo::collective: a choice, -1, or -2 (the model)
    std::int8_t forced_all = -1;                                    // COLLX_ALGO's global policy, or -1
    static constexpr std::array<std::int8_t, algo::kCollectives> unset() {
      std::array<std::int8_t, algo::kCollectives> a{};
      a.fill(-1);
      return a;
    }
    /// The model's choice per call shape (collective, commutativity, count, element size):
    /// a training step's shapes are a few hundred at most; past kMaxDecisions they start over.
    struct shape_hash {
      std::size_t operator()(const std::array<std::uint64_t, 4>& k) const noexcept {
        std::uint64_t h = 0x9e3779b97f4a7c15ull;
        for (std::uint64_t x : k) h = (h ^ x) * 0x100000001b3ull + (h >> 31);
        return std::size_t(h);
      }
    };
    static constexpr std::size_t kMaxDecisions = std::size_t(1) << 16;
    std::unordered_map<std::array<std::uint64_t, 4>, std::int8_t, shape_hash> decisions;
    /// The last decision, looked at before the map: a loop of one shape hashes nothing.
    std::array<std::uint64_t, 4> last_shape{};
    std::int8_t last_choice = -1;
    /// Learning from the calls (COLLX_AUTOTUNE=1, algo/automatic.hpp): the first calls of a new
    /// shape run the model's closest candidates in turn, timed; then the ranks agree on the
    /// fastest. Rank 0's setting counts (the setup's broadcast), so every rank does alike.
    bool tune = false;
    static constexpr int kMaxTried = 3;
    struct trial {
      std::array<std::int8_t, kMaxTried> cand{};  // the policies tried, in turn: the model's pick last
      std::int8_t k = 0;                          // how many
      std::int8_t reps = 1;                       // calls each
      std::int16_t done = -1;                     // calls timed so far (-1: the first, untimed, to come)
      std::int8_t model = 0;                      // the model's pick's place in cand
      std::array<double, kMaxTried> fastest{};    // this rank's fastest call of each, in seconds
      double predicted = 0;                       // the model's time for its pick
    };
    /// The shapes still being tried; a settled one goes to `decisions`.
    std::unordered_map<std::array<std::uint64_t, 4>, trial, shape_hash> trials;
  };
  automatic_state& automatic() noexcept { return s_->auto_; }

  /// Scratch memory for schedules that need it; grows, never shrinks, reused across calls.
  std::byte* scratch(std::size_t bytes) { return s_->scratch.at_least(bytes); }

  /// Memory a fused batch packs its all-reduces in (features/fuse.hpp): kept apart from scratch(), which
  /// the packed all_reduce itself may use; grows, never shrinks.
  std::byte* pack_buffer(std::size_t bytes) { return s_->pack.at_least(bytes); }

  /// Memory algo::compressed encodes into and decodes from (collectives/compressed.hpp): kept
  /// apart from scratch(), which its exchanges may use; grows, never shrinks.
  std::byte* wire_buffer(std::size_t bytes) { return s_->wire.at_least(bytes); }

  /// This communicator's flight recorder (comm/flight.hpp): its last calls and its wait table.
  detail::flight_recorder& recorder() noexcept { return s_->rec; }
  const detail::flight_recorder& recorder() const noexcept { return s_->rec; }
  /// Its debug output (COLLX_DEBUG: core/debug.hpp).
  const detail::debug_log& debug() const noexcept { return s_->dbg; }

  /// The order of this communicator's calls (comm/call_queue.hpp).
  detail::call_queue& calls_queue() { return s_->queue; }
  /// Splits made on this communicator so far (names the next one).
  std::uint32_t& splits() noexcept { return s_->splits; }

  /// Makes a communicator over transport t that the split of this one created.
  communicator make_child(T t, comm_identity id) const {
    // The identity is in place before the recorder is bound and registered: a dump on another
    // thread may read it from then on.
    communicator c;
    c.s_ = std::make_unique<state>(std::move(t), s_->opts);
    c.s_->id = std::move(id);
    c.s_->bind_observers(s_->id.is_job() ? "world" : s_->id.name);
    c.s_->in = s_->kids;
    std::lock_guard g(s_->kids->mu);
    s_->kids->all.push_back(c.s_.get());
    return c;
  }

  /// shrink's revoke (features/groups.hpp) of the communicators made from this one (split from it, shrunk
  /// from it, and theirs): their transports fail with `why`, so a peer waiting in a call on
  /// one of them, for a rank that has gone to shrink, fails at once and comes to the shrink. A
  /// communicator whose own call runs on another thread now is left to fail by itself.
  void revoke_children(const std::string& why) { s_->revoke_children(why); }

 private:
  // aligned storage: max_align_t-sized elements
  struct alignas(64) line { std::byte b[64]; };
  struct bytes_vec {
    std::vector<line> v;
    std::size_t size() const { return v.size() * sizeof(line); }
    void resize(std::size_t n) { v.resize((n + sizeof(line) - 1) / sizeof(line)); }
    std::byte* data() { return v.empty() ? nullptr : v.front().b; }
    /// At least `n` bytes: grows, never shrinks.
    std::byte* at_least(std::size_t n) {
      if (size() < n) resize(n);
      return data();
    }
  };
  struct state;
  /// A communicator's children (made from it by split or shrink), for the revoke of shrink.
  struct family {
    std::mutex mu;
    std::vector<state*> all;
  };
  struct state {
    state(T x, options o) : t(std::move(x)), opts(o), uncaught(detail::uncaught_exceptions()) {
      detail::queue_observer obs;
      obs.ctx = this;
      obs.where = [](void* c) {
        const state& s = *static_cast<const state*>(c);
        return (s.id.is_job() ? std::string("the job's communicator") : "communicator " + s.id.name) + ": " + s.id.rank_name(s.t.rank());
      };
      obs.in_continuation = [](void* c, bool in) noexcept { static_cast<state*>(c)->rec.in_user_code(in); };
      queue.configure(opts.timeout, obs);
    }
    ~state() {
      if (in) {
        std::lock_guard g(in->mu);
        in->all.erase(std::remove(in->all.begin(), in->all.end(), this), in->all.end());
      }
      queue.shutdown();  // outstanding calls finish before the transport goes
      // Gone because an error is leaving its scope (a call on another communicator of this
      // rank failed, or the rank's own code threw): its peers learn that this rank failed,
      // not that it left having made fewer calls (a transport that already failed ignores it).
      if (detail::uncaught_exceptions() > uncaught)
        t.abort((id.is_job() ? std::string("the job's communicator") : "communicator " + id.name) +
                " went with an error leaving its scope on " + id.rank_name(t.rank()) +
                (detail::tl_last_error.empty() ? std::string(" (its own code threw)")
                                               : ": its last failed call: " + detail::tl_last_error));
    }
    void revoke_children(const std::string& why) {
      std::lock_guard g(kids->mu);  // a child going meanwhile waits (its destructor takes it)
      for (state* c : kids->all)
        (void)c->queue.run_if_idle([&] {
          c->t.abort(why);
          c->revoke_children(why);
        });
    }
    /// The flight recorder and the debug output, as the communicator is made (`parent`: the
    /// name of the communicator it was split from, "" for the job's own).
    void bind_observers(const std::string& parent) {
      dbg.level = detail::debug_level_from_env();
      dbg.job_rank = id.job_rank(t.rank());
      dbg.sink = detail::debug_sink::open(dbg.level, dbg.job_rank);
      detail::position_board board;
      if constexpr (requires { t.positions(); }) board = t.positions();
      rec.bind(&id, t.rank(), t.size(), detail::transport_kind(t), &dbg, board);
      if (rec.enabled() && detail::env_int("COLLX_DUMP_ON_SIGUSR2", 0ll, 1ll, 0) == 1) flight::dump_on_signal();
      if (!dbg.on(debug_level::info)) return;
      std::string m = "communicator " + (id.is_job() ? std::string("world") : id.name) + ": rank " + std::to_string(t.rank()) +
                      " of " + std::to_string(t.size());
      if (!id.is_job()) {
        m += " (job ranks";
        for (std::size_t k = 0; k < id.job_ranks.size(); ++k) m += (k ? "," : " ") + std::to_string(id.job_ranks[k]);
        m += "), split from " + parent;
      }
      m += ", transport " + std::string(detail::transport_kind(t)) + ", host " + detail::host_name() + ", pid " +
           std::to_string(::getpid());
      if constexpr (requires { t.peer_address(0); }) {
        m += ", peers:";
        for (int p = 0; p < t.size(); ++p)
          if (p != t.rank()) m += " " + std::to_string(p) + "=" + t.peer_address(p);
      }
      char b[48];
      std::snprintf(b, sizeof b, ", timeout %g s", std::chrono::duration<double>(opts.timeout).count());
      m += b;
      dbg.write(debug_level::info, m);
    }
    T t;
    options opts;
    int uncaught;  // the exceptions in flight as it was made (detail::uncaught_exceptions): more as it goes means an error is leaving
    std::uint64_t seq = 0;
    std::uint64_t empty = 0;
    std::uint32_t splits = 0;
    std::uint32_t shrinks = 0;
    std::shared_ptr<family> kids = std::make_shared<family>();  // made from this one
    std::shared_ptr<family> in;  // the family this one is in (its parent's), if any
    comm_identity id;
    std::string uid;  // unique among the job's communicators ("" for the job's own): split_plan::id
    automatic_state auto_;
    detail::schedule_cache cache;
    bytes_vec scratch;
    bytes_vec pack;
    bytes_vec wire;
    detail::debug_log dbg;
    detail::flight_recorder rec;  // after dbg: it writes TRACE lines to it
    detail::call_queue queue;  // last: its thread may use everything above
  };
  /// Lets the state go: its destructor finishes the calls queued and stops the progress
  /// thread. A communicator dropped from inside its own calls or their continuations (the last
  /// reference to a torch process group, say, let go by a future's callback) is finished on a
  /// thread of its own: this thread is in the middle of the queue it would tear down.
  void retire() noexcept {
    if (!s_) return;
    if (s_->queue.inside()) {
      try {
        std::thread([p = s_.release()] { delete p; }).detach();
        return;
      } catch (...) {  // no thread to be had: let go here, as before
      }
    }
    s_.reset();
  }

  std::unique_ptr<state> s_;
};

}  // namespace collx
