#pragma once
// transport::mpi: collx's schedules over MPI point-to-point, so a job reaches whatever fabric its
// MPI does (Open MPI over UCX for InfiniBand and RoCE, over libfabric for EFA and Slingshot;
// shared memory and TCP anywhere). A channel of the progress engine (transport/engine.hpp): the
// engine orders, waits, blames and times out as on every transport; this file only moves one send
// or one receive a little further with MPI's nonblocking calls.
//
//   collx::communicator comm{collx::transport::mpi{MPI_COMM_WORLD}};   // inside an MPI program
//   collx::communicator comm{collx::transport::mpi::world()};          // collx starts MPI itself
//
// collx works on its own duplicate of the communicator it is given (MPI_Comm_dup), with
// MPI_ERRORS_RETURN, so its messages never meet the application's and an MPI error comes back as a
// collx::error carrying MPI's own words.
//
// A message is a header (the call's signature, core/call_info.hpp, and the byte count), carrying
// the payload with it when it is at most kInline bytes; a larger payload follows as a message of
// its own, sent from and received into the caller's memory where no reduction needs a staging
// buffer.
//
// Tags: every communicator has a salt (rank 0 draws it; a split's is its parent's mixed with the
// split's id), and its tags are derived from it: one for headers, one for failure notices, and a
// running one per pair of ranks for large payloads. A message a failed call left behind is never
// taken by a later communicator, though MPI reuses the context of a freed one. A split needs no
// MPI collective (MPI_Comm_create_group has no deadline): the new communicator sends on its
// parent's duplicate, its ranks mapped to the parent's, apart by its salt. The receiver checks the header first: a peer in another call, or sending
// another size, is a mismatch naming both, never wrong data. Point-to-point sends (synchronous,
// collectives/p2p.hpp) use MPI_Issend: done once the receiver has matched it.
//
// MPI never times out a receive: the engine's deadline does (options::timeout), polling with
// MPI_Test and sleeping in short, growing naps so a waiting rank leaves the core to its peer. A
// rank that fails sends each peer a notice before it throws, which ends their waits
// at once with its reason. A rank whose process dies is Open MPI's to handle: without ULFM (Open
// MPI 4.1), mpirun ends the whole job (docs/mpi.md); the survivors never return wrong data.
//
// Link with the CMake target collx::mpi (find_package(MPI)); nothing else in collx needs MPI.
// (MPI's C interface only: the C++ bindings, gone from MPI-3, would come in with it)
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "../core/call_info.hpp"
#include "../core/concepts.hpp"
#include "../core/deliver.hpp"
#include "../core/error.hpp"
#include "../core/flight_record.hpp"
#include "../core/options.hpp"
#include "../core/split_plan.hpp"
#include "../core/wait.hpp"
#include "engine.hpp"

namespace collx::transport {

namespace mpi_detail {

/// MPI's words for an error code.
inline std::string words(int rc) {
  char b[MPI_MAX_ERROR_STRING];
  int n = 0;
  if (MPI_Error_string(rc, b, &n) != MPI_SUCCESS) return "MPI error " + std::to_string(rc);
  return std::string(b, std::size_t(std::max(n, 0)));
}

inline constexpr std::uint32_t kMagic = 0x31584d43;  // "CMX1"
enum class kind : std::uint32_t { data = 1, failed = 2 };

/// What precedes every message (and is all of a small one, with its payload after it).
struct header {
  std::uint32_t magic = kMagic;
  kind what = kind::data;
  std::uint64_t bytes = 0;
  call_signature sig;
};

/// A failed rank's notice to its peers: which communicator (its salt) and why.
struct notice {
  std::uint32_t magic = kMagic;
  kind what = kind::failed;
  std::uint64_t comm = 0;  // the communicator's salt
  std::uint32_t len = 0;
  char reason[1000] = {};
};


/// collx's duplicate of the communicator it was given, shared by every collx transport made from
/// that communicator and the communicators split from them; freed by the last of them and the
/// given communicator's attribute (unless MPI has been finalized).
struct shared_comm {
  MPI_Comm c = MPI_COMM_NULL;
  long tag_ub = 32767;  // the largest tag (MPI_TAG_UB: at least 32767)
  int on_host = 1;      // ranks on this rank's host (by processor name): how long a wait spins
  shared_comm() = default;
  shared_comm(const shared_comm&) = delete;
  shared_comm& operator=(const shared_comm&) = delete;
  ~shared_comm() {
    int done = 0;
    MPI_Finalized(&done);
    if (!done && c != MPI_COMM_NULL) MPI_Comm_free(&c);
  }
};

/// The attribute that keeps a communicator's collx duplicate on it: made once a process, its
/// value a heap copy of the shared pointer, let go when the communicator is freed.
inline int dup_keyval() {
  static const int k = [] {
    int kv = MPI_KEYVAL_INVALID;
    MPI_Comm_create_keyval(
        MPI_COMM_NULL_COPY_FN,
        [](MPI_Comm, int, void* v, void*) -> int {
          delete static_cast<std::shared_ptr<shared_comm>*>(v);
          return MPI_SUCCESS;
        },
        &kv, nullptr);
    return kv;
  }();
  return k;
}
inline std::shared_ptr<shared_comm> kept_on(MPI_Comm c) {
  void* v = nullptr;
  int has = 0;
  if (MPI_Comm_get_attr(c, dup_keyval(), &v, &has) != MPI_SUCCESS || !has || v == nullptr) return {};
  return *static_cast<std::shared_ptr<shared_comm>*>(v);
}
inline void keep_on(MPI_Comm c, const std::shared_ptr<shared_comm>& sc) {
  auto* v = new std::shared_ptr<shared_comm>(sc);
  if (MPI_Comm_set_attr(c, dup_keyval(), v) != MPI_SUCCESS) delete v;
}

/// A request that did not complete by its deadline, and what it writes into: let go, the memory
/// kept for good (MPI may still complete it).
template <class T>
void abandon(std::shared_ptr<T> memory, MPI_Request& r) {
  static auto* kept = new std::vector<std::shared_ptr<void>>;
  kept->push_back(std::move(memory));
  MPI_Request_free(&r);
}

/// Waits for request r until `deadline` (MPI's collectives have none of their own).
inline bool wait_until(MPI_Request& r, std::chrono::steady_clock::time_point deadline) {
  int flag = 0;
  while (!flag) {
    if (MPI_Test(&r, &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS) return false;
    if (flag) break;
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  return true;
}

}  // namespace mpi_detail

class mpi {
 public:
  using transport_concept = transport_tag;
  using memory_space = host_memory;
  static constexpr const char* name = "mpi";

  /// Payloads of at most this many bytes travel inside their header: one message, one match.
  static constexpr std::size_t kInline = 4096;

  /// This process's rank of `comm` (which stays the caller's: collx duplicates it). Collective
  /// over `comm`, as MPI_Comm_dup is; it waits at most options::timeout's default
  /// (COLLX_TIMEOUT_S) for the others.
  explicit mpi(MPI_Comm comm) {
    int ready = 0;
    MPI_Initialized(&ready);
    if (!ready) throw error(errc::invalid_argument, "mpi: MPI is not initialized (call MPI_Init first, or use transport::mpi::world())");
    const auto deadline = std::chrono::steady_clock::now() + detail::default_timeout();
    MPI_Request rq;
    // One duplicate per communicator given, kept on it (an MPI attribute) and reused by every
    // collx transport made from it, freed when the caller frees theirs: a message a failed call
    // left behind stays in a communicator that lives, never in a freed one whose context MPI hands
    // to the next (Open MPI's ob1 then mixes the two's sequence numbers, and a later receive
    // never matches).
    std::shared_ptr<mpi_detail::shared_comm> sc = mpi_detail::kept_on(comm);
    if (!sc) {
      sc = std::make_shared<mpi_detail::shared_comm>();
      check(MPI_Comm_idup(comm, &sc->c, &rq), "MPI_Comm_idup");
      if (!mpi_detail::wait_until(rq, deadline)) {
        mpi_detail::abandon(sc, rq);
        throw error(errc::timeout, "mpi: MPI_Comm_idup did not complete in time: does every rank of the communicator make its collx transport?");
      }
      check(MPI_Comm_set_errhandler(sc->c, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
      void* ub = nullptr;
      int has = 0;
      if (MPI_Comm_get_attr(sc->c, MPI_TAG_UB, &ub, &has) == MPI_SUCCESS && has && ub != nullptr) sc->tag_ub = *static_cast<int*>(ub);
      // ranks on this host: those whose processor name hashes alike (a gather under the
      // deadline; MPI_Comm_split_type would block without one)
      int me = 0, size = 1;
      MPI_Comm_rank(sc->c, &me);
      MPI_Comm_size(sc->c, &size);
      char host[MPI_MAX_PROCESSOR_NAME] = {};
      int len = 0;
      MPI_Get_processor_name(host, &len);
      auto hashes = std::make_shared<std::vector<std::uint64_t>>(std::size_t(size) + 1);
      (*hashes)[std::size_t(size)] = detail::fnv1a(std::string_view(host, std::size_t(std::max(len, 0))));
      check(MPI_Iallgather(hashes->data() + size, 1, MPI_UINT64_T, hashes->data(), 1, MPI_UINT64_T, sc->c, &rq), "MPI_Iallgather");
      if (!mpi_detail::wait_until(rq, deadline)) {
        mpi_detail::abandon(hashes, rq);
        throw error(errc::timeout, "mpi: the ranks' host names did not all come in time");
      }
      sc->on_host = int(std::count(hashes->begin(), hashes->begin() + size, (*hashes)[std::size_t(size)]));
      mpi_detail::keep_on(comm, sc);
    }
    check(MPI_Comm_rank(sc->c, &rank_), "MPI_Comm_rank");
    check(MPI_Comm_size(sc->c, &n_), "MPI_Comm_size");
    // the salt: rank 0's draw, for every rank
    auto salt = std::make_shared<std::uint64_t>(0);
    if (rank_ == 0) *salt = std::chrono::steady_clock::now().time_since_epoch().count() ^ (std::uint64_t(::getpid()) << 32) ^ detail::fnv1a("collx/mpi");
    check(MPI_Ibcast(salt.get(), 1, MPI_UINT64_T, 0, sc->c, &rq), "MPI_Ibcast");
    if (!mpi_detail::wait_until(rq, deadline)) {
      mpi_detail::abandon(salt, rq);
      throw error(errc::timeout, "mpi: the communicator's salt did not come from rank 0 in time");
    }
    comm_ = std::move(sc);
    salt_ = *salt;
    setup();
  }

  /// MPI_COMM_WORLD, MPI started by collx if nobody has (MPI_Init_thread, MPI_THREAD_MULTIPLE:
  /// collx::async's progress thread calls MPI) and finalized at exit: for a program launched by
  /// mpirun or srun that does not use MPI itself.
  static mpi world() {
    int ready = 0;
    MPI_Initialized(&ready);
    if (!ready) {
      int provided = 0;
      const int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
      if (rc != MPI_SUCCESS) throw error(errc::transport_error, "mpi: MPI_Init_thread failed: " + mpi_detail::words(rc));
      if (provided < MPI_THREAD_MULTIPLE)
        throw error(errc::transport_error, "mpi: this MPI gives thread level " + std::to_string(provided) +
                                               ", not MPI_THREAD_MULTIPLE, which collx's progress thread (collx::async) needs");
      std::atexit([] {
        int done = 0;
        MPI_Finalized(&done);
        if (!done) MPI_Finalize();
      });
    }
    return mpi(MPI_COMM_WORLD);
  }

  mpi(mpi&& o) noexcept { take(o); }
  mpi& operator=(mpi&& o) noexcept {
    if (this != &o) {
      release();
      take(o);
    }
    return *this;
  }
  mpi(const mpi&) = delete;
  mpi& operator=(const mpi&) = delete;
  ~mpi() { release(); }

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return n_; }
  /// collx's own duplicate, which communicators split from this one share (for tests and
  /// tools: never send on it).
  MPI_Comm handle() const noexcept { return comm_ ? comm_->c : MPI_COMM_NULL; }
  /// Where the desync report reads this rank's position (its peers' are not asked over MPI).
  detail::position_board positions() const noexcept { return {board_.get(), sizeof(detail::position), n_}; }

  void exchange(std::span<const send_desc> s, std::span<const recv_desc> r, const exchange_context& ctx) {
    engage(*ctx.call, [&](auto& c, auto& st) { engine::exchange(c, st, s, r, ctx); });
  }
  /// The engine's view of this transport: f(channel, step state) between the checks a step
  /// makes first and last (engine.hpp: exchange, and exchange_pair for a step shared with
  /// another transport).
  template <class F>
  void engage(const call_info& call, F&& f) {
    if (notified_) call.fail(errc::peer_lost, "the mpi transport of this rank already failed: " + failed_why_);
    try {
      large_in_ = false;
      f(*this, st_);
      // A peer that failed while this step ran may have let go a large send from memory it no
      // longer vouches for (its notice comes before it goes): what came from it is not taken.
      // (Only after a large payload: a small one came in the header, from MPI's own copy; and a
      // look costs a small step as much again under oversubscription, where MPI yields.)
      if (large_in_) {
        poll_notices();
        for (int q = 0; q < n_; ++q)
          if (failed_[std::size_t(q)] && q != rank_)
            call.fail(errc::peer_lost, std::string(call_info::kAbortedWhile) + " this step ran: " + call.peer(q) + " failed: " + reason_[std::size_t(q)]);
      }
    } catch (...) {
      cancel_pending();
      throw;
    }
  }
  /// recv_any: the first of `peers` whose next message is a point-to-point one of this call's
  /// communicator (engine::wait_any).
  int probe(std::span<const int> peers, const call_info& call) { return engine::wait_any(*this, peers, call); }

  /// This rank failed: each peer gets a notice with the reason, which ends its waits at once.
  void abort(const std::string& why) noexcept {
    if (!comm_ || notified_) return;
    notified_ = true;
    failed_why_ = why;
    for (int q = 0; q < n_; ++q) {
      if (q == rank_) continue;
      auto& nb = notices_out_.emplace_back();
      nb.comm = salt_;
      nb.len = std::uint32_t(std::min(why.size(), sizeof nb.reason));
      std::memcpy(nb.reason, why.data(), nb.len);
      MPI_Request rq;
      if (MPI_Isend(&nb, int(sizeof nb), MPI_BYTE, at(q), notice_tag(), comm_->c, &rq) == MPI_SUCCESS) sent_.push_back(rq);
    }
  }
  /// Leaves the communicator: nothing to tell (a peer still waiting for this rank meets its
  /// deadline; see the top).
  void leave() noexcept {}

  /// Before a split: nothing to bring (the new communicator sends on this one's duplicate).
  split_offer prepare_split() { return {}; }
  /// The new communicator's transport: the members' ranks on the duplicate, and a salt of its own.
  mpi split(const split_plan& p, split_offer&&) const {
    mpi t;
    t.comm_ = comm_;
    t.rank_ = p.rank;
    t.n_ = p.size;
    t.salt_ = detail::fnv1a(std::to_string(salt_) + "/" + p.id);
    t.map_.resize(p.members.size());
    for (std::size_t i = 0; i < p.members.size(); ++i) t.map_[i] = at(p.members[i]);
    t.setup();
    return t;
  }

  // ---- the channel (transport/engine.hpp) -----------------------------------------------------
  struct send_state {
    MPI_Request rq[2];
    int posted = 0;  // requests in rq
  };
  struct recv_state {
    MPI_Request rq;
    bool head_posted = false, head_done = false, data_posted = false;
    bool staged = false;  // the payload lands in a staging buffer (a reduction, a spread operand)
    std::size_t got = 0;  // bytes of the header message (its buffer keeps its size: no refill)
  };
  using step = engine::step<send_state, recv_state>;
  struct token {};

  engine::moved try_send(step& s, std::size_t i) {
    send_state& st = s.so[i].s;
    const send_desc& d = s.sends[i];
    const call_info& call = *s.call;
    bool posted_now = false;
    if (st.posted == 0) {
      fits_int(call, d.bytes, d.peer);
      if (out_.size() <= i) out_.resize(i + 1);
      std::vector<std::byte>& b = out_[i];
      const bool inline_ = d.bytes <= kInline;
      // (a spread payload is packed after the header, in the one buffer sized here: nothing
      // resizes it while MPI holds the header)
      b.resize(sizeof(mpi_detail::header) + (inline_ || d.data == nullptr ? d.bytes : 0));
      const std::size_t head_bytes = sizeof(mpi_detail::header) + (inline_ ? d.bytes : 0);
      mpi_detail::header h;
      h.bytes = d.bytes;
      h.sig = call.sig;
      std::memcpy(b.data(), &h, sizeof h);
      if (inline_ && d.bytes != 0) detail::gather(b.data() + sizeof h, d, 0, d.bytes);
      const bool sync = s.ctx->synchronous;
      check_call(call, (sync && inline_ ? MPI_Issend : MPI_Isend)(b.data(), int(head_bytes), MPI_BYTE, at(d.peer), head_tag(), comm_->c, &st.rq[0]),
                 "MPI_Isend", d.peer);
      st.posted = 1;
      posted_now = true;
      if (!inline_) {
        const std::byte* from = d.data;
        if (from == nullptr) {  // spread: packed after the header
          detail::gather(b.data() + sizeof h, d, 0, d.bytes);
          from = b.data() + sizeof h;
        }
        check_call(call, (sync ? MPI_Issend : MPI_Isend)(from, int(d.bytes), MPI_BYTE, at(d.peer), data_tag(out_seq_[std::size_t(d.peer)]++), comm_->c, &st.rq[1]),
                   "MPI_Isend", d.peer);
        st.posted = 2;
      }
    }
    int flag = 0;
    check_call(call, MPI_Testall(st.posted, st.rq, &flag, MPI_STATUSES_IGNORE), "MPI_Test", d.peer);
    // (`some` only when it was posted now: an answer of `some` while MPI still holds it would
    // keep the engine sweeping, never waiting, never meeting its deadline or a peer's notice)
    return flag ? engine::moved::done : engine::some_if(posted_now);
  }

  engine::moved try_recv(step& s, std::size_t i) {
    recv_state& st = s.ro[i].s;
    const recv_desc& d = s.recvs[i];
    const call_info& call = *s.call;
    if (in_.size() <= i) in_.resize(i + 1);
    std::vector<std::byte>& b = in_[i];
    bool moved = false;
    if (!st.head_done) {
      if (!aside_[std::size_t(d.peer)].empty()) {  // recv_any took it already
        const std::vector<std::byte>& a = aside_[std::size_t(d.peer)].front();
        if (b.size() < a.size()) b.resize(a.size());  // (copied in: b keeps what it has grown to)
        std::copy(a.begin(), a.end(), b.begin());
        st.got = a.size();
        aside_[std::size_t(d.peer)].pop_front();
      } else {
        if (!st.head_posted) {
          // (the buffer only grows: a resize down and up again would zero 4 KiB per receive)
          if (b.size() < sizeof(mpi_detail::header) + kInline) b.resize(sizeof(mpi_detail::header) + kInline);
          check_call(call, MPI_Irecv(b.data(), int(sizeof(mpi_detail::header) + kInline), MPI_BYTE, at(d.peer), head_tag(), comm_->c, &st.rq), "MPI_Irecv", d.peer);
          st.head_posted = true;
        }
        int flag = 0;
        MPI_Status status;
        check_call(call, MPI_Test(&st.rq, &flag, &status), "MPI_Test", d.peer);
        if (!flag) return engine::moved::nothing;
        int got = 0;
        MPI_Get_count(&status, MPI_BYTE, &got);
        st.got = std::size_t(std::max(got, 0));
      }
      const mpi_detail::header h = head_of({b.data(), st.got}, d.peer, call);
      call.check_match(d.peer, h.sig, std::size_t(h.bytes), d.bytes);  // a peer in another call: mismatch
      call.heard(d.peer, h.sig);
      st.head_done = true;
      moved = true;
      if (d.bytes <= kInline) {
        if (st.got != sizeof h + d.bytes) garbage(call, d.peer, "a header whose payload is not the size it says");
        if (d.bytes != 0) detail::deliver(d, 0, b.data() + sizeof h, d.bytes, s.ctx->comb);
        return engine::moved::done;
      }
    }
    if (!st.data_posted) {
      fits_int(call, d.bytes, d.peer);
      std::size_t room = d.bytes;
      std::byte* to = d.how == combine::copy ? detail::recv_target(d, 0, room) : nullptr;
      st.staged = to == nullptr || room < d.bytes;
      if (st.staged) {
        if (b.size() < d.bytes) b.resize(d.bytes);
        to = b.data();
      }
      check_call(call, MPI_Irecv(to, int(d.bytes), MPI_BYTE, at(d.peer), data_tag(in_seq_[std::size_t(d.peer)]++), comm_->c, &st.rq), "MPI_Irecv", d.peer);
      large_in_ = true;
      st.data_posted = true;
      moved = true;
    }
    int flag = 0;
    MPI_Status status;
    check_call(call, MPI_Test(&st.rq, &flag, &status), "MPI_Test", d.peer);
    if (!flag) return engine::some_if(moved);
    int got = 0;
    MPI_Get_count(&status, MPI_BYTE, &got);
    if (std::size_t(got) != d.bytes) garbage(call, d.peer, "a payload of " + std::to_string(got) + " B where its header said " + std::to_string(d.bytes));
    if (st.staged) detail::deliver(d, 0, b.data(), d.bytes, s.ctx->comb);
    return engine::moved::done;
  }

  token arm() {
    poll_notices();
    return {};
  }
  /// MPI has nothing to sleep on: a nap that grows from 2 us to 50 us while nothing moves (a step
  /// starts it short again), so a waiting rank leaves the core to the peer it waits for. No
  /// longer: MPI moves a large message only inside its calls (ob1 over tcp has no progress thread),
  /// and naps of up to 1 ms made a 16 MiB all_reduce of 4 ranks over tcp 4.8 times MPI's time.
  void sleep(const step&, token, std::chrono::nanoseconds d) { nap(d); }
  void sleep_any(std::span<const int>, token, std::chrono::nanoseconds d) { nap(d); }
  void open(step&) { nap_ = kFirstNap; }
  engine::waiting spinning() const noexcept { return {spins_, std::chrono::nanoseconds(0), detail::kYieldIterations}; }
  engine::fate fate_of(int p) const noexcept { return failed_[std::size_t(p)] ? engine::fate::failed : engine::fate::live; }
  std::string why(int p) const { return "it failed: " + reason_[std::size_t(p)]; }
  int failed_rank() {
    poll_notices();
    for (int q = 0; q < n_; ++q)
      if (failed_[std::size_t(q)]) return q;
    return -1;
  }
  std::string failure(int f) const { return reason_[std::size_t(f)]; }
  const char* waiting_for(const step& s, bool send, std::size_t i) const {
    if (send) return s.ctx->synchronous ? "it to receive this rank's message" : "it to take this rank's data";
    return s.ro[i].s.head_done ? "the rest of its data" : "its data";
  }
  int probe_head(std::span<const int> peers, const call_info& call, bool slow) {
    for (int q : peers) {
      auto& a = aside_[std::size_t(q)];
      if (a.empty()) {
        int flag = 0;
        MPI_Message m;
        MPI_Status status;
        check_call(call, MPI_Improbe(at(q), head_tag(), comm_->c, &flag, &m, &status), "MPI_Improbe", q);
        if (!flag) continue;
        int got = 0;
        MPI_Get_count(&status, MPI_BYTE, &got);
        std::vector<std::byte> b(std::size_t(std::max(got, 0)));
        check_call(call, MPI_Mrecv(b.data(), got, MPI_BYTE, &m, MPI_STATUS_IGNORE), "MPI_Mrecv", q);
        a.push_back(std::move(b));
      }
      if (call.takes_any_source(head_of(a.front(), q, call).sig)) return q;
    }
    if (slow) poll_notices();
    return -1;
  }

 private:
  mpi() = default;
  /// Peer q's rank on the duplicate.
  int at(int q) const noexcept { return map_.empty() ? q : map_[std::size_t(q)]; }
  // Tags: [16, 16 + 2R) holds each communicator's header and notice tags (a pair chosen by its
  // salt among R), the rest its large payloads' (a window starting at its salt, stepped by the
  // running count of the pair's payloads). A header or notice never meets a payload's tag.
  std::uint64_t pairs() const noexcept { return std::uint64_t(comm_->tag_ub - 16) / 4; }
  int head_tag() const noexcept { return int(16 + 2 * (salt_ % pairs())); }
  int notice_tag() const noexcept { return head_tag() + 1; }
  int data_tag(std::uint64_t k) const noexcept {
    const std::uint64_t first = 16 + 2 * pairs(), room = std::uint64_t(comm_->tag_ub) - first;
    return int(first + (salt_ / 7 + k) % room);
  }
  /// MPI counts in int: a larger message is refused, naming the limit (tcp and shm take it).
  static void fits_int(const call_info& call, std::size_t bytes, int peer) {
    if (bytes > std::size_t(INT_MAX))
      call.fail(errc::invalid_argument, "a message of " + std::to_string(bytes) + " B to or from " + call.peer(peer) +
                                            " is more than MPI's int count takes (2 GiB): transport::mpi moves messages up to 2 GiB "
                                            "(a collective's largest message is a block of its buffer: its size over the ranks for "
                                            "ring and recursive_halving)");
  }
  void setup() {
    failed_.assign(std::size_t(n_), false);
    reason_.assign(std::size_t(n_), {});
    aside_.assign(std::size_t(n_), {});
    out_seq_.assign(std::size_t(n_), 0);
    in_seq_.assign(std::size_t(n_), 0);
    board_ = std::make_unique<detail::position[]>(std::size_t(n_));
    spins_ = detail::spin_for(comm_->on_host);  // ranks that outnumber the host's cores barely spin
  }
  void take(mpi& o) noexcept {
    comm_ = std::move(o.comm_);
    map_ = std::move(o.map_);
    rank_ = o.rank_;
    n_ = o.n_;
    salt_ = o.salt_;
    spins_ = o.spins_;
    notified_ = o.notified_;
    failed_why_ = std::move(o.failed_why_);
    let_go_ = o.let_go_;
    failed_ = std::move(o.failed_);
    reason_ = std::move(o.reason_);
    aside_ = std::move(o.aside_);
    out_seq_ = std::move(o.out_seq_);
    in_seq_ = std::move(o.in_seq_);
    board_ = std::move(o.board_);
    notices_out_ = std::move(o.notices_out_);
    sent_ = std::move(o.sent_);
    out_ = std::move(o.out_);
    in_ = std::move(o.in_);
  }
  void release() noexcept {
    if (!comm_) return;
    int done = 0;
    MPI_Finalized(&done);
    if (!done && (!sent_.empty() || let_go_)) {
      // Notices not delivered yet, and the operations of a failed step, go on without this rank
      // waiting: MPI may still use their buffers, which are kept (a failing process does not
      // live long). A send let go from the caller's memory may still be read from it: its
      // receiver's step fails all the same (this rank's notice comes first; exchange).
      for (MPI_Request& r : sent_) MPI_Request_free(&r);
      struct left { std::deque<mpi_detail::notice> notices; std::vector<std::vector<std::byte>> out, in; };
      static auto* kept = new std::vector<left>;
      kept->push_back({std::move(notices_out_), std::move(out_), std::move(in_)});
    }
    comm_.reset();
  }
  /// Notices of failed peers that have come.
  void poll_notices() {
    if (!comm_) return;
    for (;;) {
      int flag = 0;
      MPI_Status status;
      if (MPI_Iprobe(MPI_ANY_SOURCE, notice_tag(), comm_->c, &flag, &status) != MPI_SUCCESS || !flag) return;
      mpi_detail::notice nb;
      int got = 0;
      MPI_Get_count(&status, MPI_BYTE, &got);
      if (MPI_Recv(&nb, int(sizeof nb), MPI_BYTE, status.MPI_SOURCE, notice_tag(), comm_->c, MPI_STATUS_IGNORE) != MPI_SUCCESS) return;
      if (got != int(sizeof nb) || nb.magic != mpi_detail::kMagic || nb.what != mpi_detail::kind::failed || nb.comm != salt_) continue;
      int q = status.MPI_SOURCE;
      if (!map_.empty()) q = int(std::find(map_.begin(), map_.end(), q) - map_.begin());
      if (q < 0 || q >= n_ || failed_[std::size_t(q)]) continue;
      failed_[std::size_t(q)] = true;
      reason_[std::size_t(q)] = std::string(nb.reason, std::min<std::size_t>(nb.len, sizeof nb.reason));
    }
  }
  /// The failed step's operations still under way: receives cancelled (waited for a second at
  /// most, else let go), sends let go.
  void cancel_pending() noexcept {
    std::vector<MPI_Request*> recvs;
    for (std::size_t i = 0; i < st_.ro.size(); ++i) {
      recv_state& r = st_.ro[i].s;
      if (!st_.ro[i].done && ((r.head_posted && !r.head_done) || r.data_posted) && r.rq != MPI_REQUEST_NULL) {
        MPI_Cancel(&r.rq);
        recvs.push_back(&r.rq);
      }
    }
    // (all at once, a second in all: a receive already matched cannot be cancelled and ends
    // when its data has come)
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(1);
    for (bool open = !recvs.empty(); open && std::chrono::steady_clock::now() < until;) {
      open = false;
      for (MPI_Request* r : recvs) {
        int flag = 0;
        if (*r != MPI_REQUEST_NULL && MPI_Test(r, &flag, MPI_STATUS_IGNORE) == MPI_SUCCESS && !flag) open = true;
      }
      if (open) std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
    for (MPI_Request* r : recvs)
      if (*r != MPI_REQUEST_NULL) {
        MPI_Request_free(r);  // still under way: its staging buffer is kept (release)
        let_go_ = true;
      }
    for (std::size_t i = 0; i < st_.so.size(); ++i) {
      send_state& t = st_.so[i].s;
      if (!st_.so[i].done && t.posted > 0) {
        for (int k = 0; k < t.posted; ++k)
          if (t.rq[k] != MPI_REQUEST_NULL) MPI_Request_free(&t.rq[k]);
        let_go_ = true;
      }
    }
  }
  mpi_detail::header head_of(std::span<const std::byte> b, int q, const call_info& call) const {
    mpi_detail::header h;
    if (b.size() < sizeof h) garbage(call, q, "a message shorter than a header (" + std::to_string(b.size()) + " B)");
    std::memcpy(static_cast<void*>(&h), b.data(), sizeof h);
    if (h.magic != mpi_detail::kMagic || h.what != mpi_detail::kind::data) garbage(call, q, "a message that is not collx's");
    return h;
  }
  [[noreturn]] static void garbage(const call_info& call, int q, const std::string& why) {
    call.fail(errc::transport_error, "garbage from " + call.peer(q) + " over MPI: " + why);
  }
  static void check(int rc, const char* what) {
    if (rc != MPI_SUCCESS) throw error(errc::transport_error, std::string("mpi: ") + what + " failed: " + mpi_detail::words(rc));
  }
  static void check_call(const call_info& call, int rc, const char* what, int peer) {
    if (rc != MPI_SUCCESS) call.fail(errc::transport_error, std::string(what) + " with " + call.peer(peer) + " failed: " + mpi_detail::words(rc));
  }
  static constexpr std::chrono::nanoseconds kFirstNap{2000}, kLongestNap{50000};
  void nap(std::chrono::nanoseconds d) {
    const auto t = std::min(d, nap_);
    if (t.count() <= 0) return;
    timespec ts{time_t(t.count() / 1000000000), long(t.count() % 1000000000)};
    ::nanosleep(&ts, nullptr);
    nap_ = std::min(nap_ * 2, kLongestNap);
  }

  std::shared_ptr<mpi_detail::shared_comm> comm_;
  std::vector<int> map_;  // a split's: each rank's rank on the duplicate (empty: the same)
  int rank_ = 0, n_ = 1;
  std::uint64_t salt_ = 0;  // this communicator's tags (see the top)
  int spins_ = detail::kSpinIterations;
  bool notified_ = false;  // this rank failed (abort): later calls fail at once
  bool large_in_ = false;  // the step received a large payload
  std::string failed_why_;
  bool let_go_ = false;  // a failed step's operations were let go under way (their buffers are kept)
  std::chrono::nanoseconds nap_ = kFirstNap;
  std::vector<bool> failed_;
  std::vector<std::string> reason_;
  std::vector<std::deque<std::vector<std::byte>>> aside_;  // headers recv_any took, per peer
  std::vector<std::uint64_t> out_seq_, in_seq_;            // large payloads sent to, received from each peer
  std::unique_ptr<detail::position[]> board_;
  std::deque<mpi_detail::notice> notices_out_;
  std::vector<MPI_Request> sent_;
  std::vector<std::vector<std::byte>> out_, in_;  // per operation of a step: headers, small payloads, staging
  step st_;
};

}  // namespace collx::transport
