#pragma once
// What every rank of a collective must agree on, and how disagreements are reported. Each message
// carries its sender's call_signature; the receiver compares it with its own, so ranks that make
// different calls (collective, sequence number, count, element size, root, op, policy) fail with
// errc::mismatch and a message that prints both sides, instead of exchanging wrong data.
//
// Calls with zero elements exchange nothing (they return at once, as in MPI and NCCL), so they
// cannot be compared when they are made. Each rank folds them into a digest that the signature of
// its next exchanging call carries: ranks whose zero-element calls differed (collective, root,
// op, element size) fail there with errc::mismatch. A zero-element call on one rank against a
// non-empty one on another shifts the sequence numbers and fails the same way.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "flight_record.hpp"
#include "wait.hpp"
#include "error.hpp"

namespace collx {

namespace detail {
template <class T>
constexpr std::string_view type_name() {
  std::string_view p = __PRETTY_FUNCTION__;
  const auto b = p.find("T = ") + 4;
  const auto e = p.find_first_of(";]", b);
  return p.substr(b, e - b);
}

constexpr std::uint64_t fnv1a(std::string_view s) {
  std::uint64_t h = 1469598103934665603ull;
  for (char c : s) h = (h ^ std::uint64_t(static_cast<unsigned char>(c))) * 1099511628211ull;
  return h;
}

template <std::size_t N>
void set_name(char (&dst)[N], std::string_view s) {
  std::memset(dst, 0, N);
  if (s.size() >= N) s = s.substr(s.size() - (N - 1));  // keep the tail: the most specific part of a type name
  std::memcpy(dst, s.data(), s.size());
}

/// `s` in at most `max` bytes: whole, or its head (what failed here) and its tail, since a chain
/// of failures ("lost rank 1: it failed: ... lost rank 5: it died") ends with the cause.
inline std::string head_and_tail(const std::string& s, std::size_t max) {
  if (s.size() <= max) return s;
  if (max < 16) return s.substr(0, max);
  const std::size_t head = max / 4;
  return s.substr(0, head) + " ... " + s.substr(s.size() - (max - head - 5));
}

/// Ranks as ranges, in order: "0-2, 4, 6-7" (the desync report and collx-trace write them so).
inline std::string rank_ranges(std::vector<int> v) {
  std::sort(v.begin(), v.end());
  std::string s;
  for (std::size_t i = 0; i < v.size();) {
    std::size_t k = i;
    while (k + 1 < v.size() && v[k + 1] == v[k] + 1) ++k;
    if (!s.empty()) s += ", ";
    s += std::to_string(v[i]);
    if (k > i) s += (k == i + 1 ? ", " : "-") + std::to_string(v[k]);
    i = k + 1;
  }
  return s;
}

inline std::string format_seconds(std::chrono::nanoseconds d) {
  const double s = std::chrono::duration<double>(d).count();
  char b[32];
  std::snprintf(b, sizeof b, s >= 1 ? "%.0f s" : "%.3g s", s);
  return b;
}
}  // namespace detail

/// Which communicator a call is on, for messages: its name and, for a communicator split from
/// another (communicator::split), the job rank of each of its ranks. The job's own communicator
/// has an empty name and no map: its ranks are the job's.
struct comm_identity {
  std::string name;
  std::vector<int> job_ranks;
  std::uint64_t hash = 0;  // of the name: carried in every signature (0 for the job's own)
  bool is_job() const noexcept { return job_ranks.empty(); }
  int job_rank(int r) const noexcept {
    return job_ranks.empty() || r < 0 || std::size_t(r) >= job_ranks.size() ? r : job_ranks[std::size_t(r)];
  }
  /// "rank 2" on the job's communicator, "rank 2 (job rank 5)" on a split one.
  std::string rank_name(int r) const {
    std::string s = "rank " + std::to_string(r);
    if (!is_job()) s += " (job rank " + std::to_string(job_rank(r)) + ")";
    return s;
  }
};

/// Trivially copyable, fixed size: it travels in message headers on wire transports.
struct call_signature {
  char collective[16] = {};
  char policy[24] = {};
  char op[24] = {};
  std::uint64_t seq = 0;
  std::uint64_t empty_calls = 0;  // digest of this rank's earlier zero-element calls (see the top)
  std::uint64_t count = 0;
  std::uint64_t op_hash = 0;
  std::uint64_t comm = 0;  // comm_identity::hash of the communicator
  std::uint32_t elem_size = 0;
  std::int32_t root = -1;
  /// When the sender entered the call (wall clock, ns; 0 when not recorded): not compared, it
  /// tells a receiver that waited how late the sender came (core/flight_record.hpp).
  std::int64_t entered_ns = 0;

  friend bool operator==(const call_signature& a, const call_signature& b) {
    return a.seq == b.seq && a.comm == b.comm && a.empty_calls == b.empty_calls && a.count == b.count && a.op_hash == b.op_hash && a.elem_size == b.elem_size &&
           a.root == b.root && std::strncmp(a.collective, b.collective, sizeof a.collective) == 0 &&
           std::strncmp(a.policy, b.policy, sizeof a.policy) == 0;
  }

  /// A hash of every field that must match (the wire transports compare it first). The names
  /// are taken a word at a time, as they lie (detail::set_name pads them with zeros): every call
  /// hashes its signature once, and a byte-wise hash of the two names was most of its cost.
  std::uint64_t hash() const noexcept {
    static_assert(sizeof collective % 8 == 0 && sizeof policy % 8 == 0);
    std::uint64_t h = 14695981039346656037ull;
    auto mix = [&](std::uint64_t x) { h = (h ^ x) * 1099511628211ull; };
    auto words = [&](const char* p, std::size_t n) {
      for (std::size_t i = 0; i < n; i += 8) {
        std::uint64_t w;
        std::memcpy(&w, p + i, 8);
        mix(w);
      }
    };
    words(collective, sizeof collective);
    words(policy, sizeof policy);
    for (std::uint64_t x : {seq, empty_calls, count, op_hash, comm, std::uint64_t(elem_size), std::uint64_t(std::uint32_t(root))})
      mix(x);
    return h;
  }

  /// This call folded into a digest of zero-element calls (one that returned without exchanging).
  std::uint64_t fold_empty(std::uint64_t digest) const noexcept {
    auto mix = [&](std::uint64_t x) { digest = (digest ^ x) * 1099511628211ull; };
    mix(detail::fnv1a({collective, strnlen(collective, sizeof collective)}));
    mix(seq);
    mix(op_hash);
    mix(elem_size);
    mix(std::uint64_t(std::int64_t(root)));
    return digest == 0 ? 1 : digest;
  }

  /// "all_reduce #42 (ring, sum, 1000 x 4 B)"
  std::string describe() const {
    std::string s = std::string(collective, strnlen(collective, sizeof collective)) + " #" + std::to_string(seq) + " (" +
                    std::string(policy, strnlen(policy, sizeof policy));
    if (op[0] != 0) s += ", " + std::string(op, strnlen(op, sizeof op));
    s += ", " + std::to_string(count) + " x " + std::to_string(elem_size) + " B";
    if (root >= 0) s += ", root " + std::to_string(root);
    return s + ")";
  }
};

/// One call of a collective on one rank: its signature, this rank, and the deadline of each wait.
struct call_info {
  call_signature sig;
  int rank = 0;
  /// The communicator (names it and its job ranks in messages); null: the job's own.
  const comm_identity* comm = nullptr;
  std::chrono::nanoseconds timeout{};
  /// options::call_timeout (0: none), and when this call first waited (deadline()).
  std::chrono::nanoseconds call_timeout{};
  mutable std::chrono::steady_clock::time_point first_wait{};
  /// Sends complete only once their receivers have taken them (point to point: collectives/p2p.hpp).
  bool synchronous = false;
  /// The call's flight record (comm/flight.hpp), or null when the recorder is off; `mark` closes it
  /// when this call_info goes.
  detail::call_record* rec = nullptr;
  detail::record_mark mark;

  /// The communicator's position board (core/flight_record.hpp), where its transport has one.
  detail::position_board board;

  /// A transport that runs part of a step over a transport of its own (transport::two_level: a
  /// node's ranks over shared memory) hands that one this call with `rank` and the peers
  /// numbered as there, and `up[r]`: the rank here of its rank r. Messages, the flight record
  /// and the desync report name ranks here.
  const int* up = nullptr;
  int here(int p) const noexcept { return up == nullptr || p < 0 ? p : up[p]; }

  /// Transports say where their waits go: waiting(p) before a blocking wait on peer p,
  /// waited(p, ns) after it, heard(p, sig) for each message taken from p.
  void waiting(int peer) const noexcept {
    if (rec != nullptr) rec->waiting(here(peer));
  }
  void waited(int peer, std::chrono::nanoseconds d) const noexcept {
    if (rec != nullptr) rec->add_wait(here(peer), d.count());
  }
  void heard(int peer, const call_signature& theirs) const noexcept {
    if (rec != nullptr) rec->note_heard(here(peer), theirs.entered_ns);
  }

  /// "all_reduce #42 (ring): rank 3", or on a split communicator
  /// "all_reduce #42 (ring) on communicator tp: rank 1 (job rank 3)"
  std::string prefix() const {
    std::string s = std::string(sig.collective, strnlen(sig.collective, sizeof sig.collective)) + " #" + std::to_string(sig.seq) +
                    " (" + std::string(sig.policy, strnlen(sig.policy, sizeof sig.policy)) + ")";
    if (comm != nullptr && !comm->is_job()) s += " on communicator " + comm->name;
    return s + ": " + peer(rank);
  }

  /// "rank 2", or "rank 2 (job rank 5)" on a split communicator: every message names peers so.
  std::string peer(int p) const { return rank_name(here(p)); }
  /// Rank q of the communicator (never mapped through `up`).
  std::string rank_name(int q) const { return comm == nullptr ? "rank " + std::to_string(q) : comm->rank_name(q); }

  [[noreturn]] void fail(errc e, const std::string& what) const {
    std::string m = prefix() + " " + what;
    if (rec != nullptr) rec->set_error(int(e), m);
    detail::note_last_error(m);
    throw error(e, std::move(m));
  }

  /// "rank 1, rank 2 (job rank 5)": the ranks a receive from any source waits for.
  std::string peers(std::span<const int> ps) const {
    std::string s;
    for (int p : ps) s += (s.empty() ? "" : ", ") + peer(p);
    return s;
  }
  /// Whether a receive from any source (collectives/p2p.hpp, recv_any) may take a message of
  /// signature `theirs` at the head of a peer's stream: a point-to-point message (sequence
  /// number 0) of this communicator. Whether its size and element type fit, its receive checks.
  bool takes_any_source(const call_signature& theirs) const noexcept { return theirs.seq == 0 && theirs.comm == sig.comm; }
  [[noreturn]] void timed_out_any(std::span<const int> ps, bool whole = false) const {
    timed_out_waiting("a message from any of " + peers(ps), whole);
  }
  [[noreturn]] void timed_out(int peer, const char* waiting_for, bool whole = false) const {
    timed_out_waiting(this->peer(peer) + " (" + waiting_for + ")", whole);
  }
  /// "timed out after 3 s (the whole call's deadline, options::call_timeout) waiting for
  /// <what>", and where the ranks are.
  [[noreturn]] void timed_out_waiting(const std::string& what, bool whole) const {
    fail(errc::timeout, "timed out after " + detail::format_seconds(whole ? call_timeout : timeout) +
                            (whole ? " (the whole call's deadline, options::call_timeout)" : "") + " waiting for " + what + positions());
  }

  /// The deadline of a wait that starts at `now`: options::timeout from now, or the whole call's
  /// (options::call_timeout from its first wait) when that comes first (`whole` says which).
  std::chrono::steady_clock::time_point deadline(std::chrono::steady_clock::time_point now, bool& whole) const {
    const auto d = now + timeout;
    whole = false;
    if (call_timeout.count() <= 0) return d;
    if (first_wait == std::chrono::steady_clock::time_point{}) first_wait = now;
    const auto w = first_wait + call_timeout;
    whole = w < d;
    return whole ? w : d;
  }

  /// The desync report a timeout ends with, where the board says where every rank is: "; where
  /// the ranks are: rank 1 (job rank 5) is done with all_reduce #41; ranks 0, 2-3 are in
  /// all_reduce #42, waiting for rank 1". Empty without a board.
  std::string positions() const {
    const int me = here(rank);
    auto peer = [this](int q) { return rank_name(q); };
    if (board.base == nullptr || board.n <= 0) return {};
    struct place {
      std::uint64_t seq_state;
      std::string name;
      std::vector<int> ranks, waits;
    };
    std::vector<place> places;
    const std::int64_t now = detail::wall_ns();
    std::vector<std::pair<int, std::int64_t>> silent;  // blocked in a call, yet no sign of life
    std::vector<int> mute, gone;  // asked, and no answer (tcp: tcp/desync.hpp)
    for (int r = 0; r < board.n; ++r) {
      const detail::position& p = *board.at(r);
      const std::uint64_t ss = p.seq_state.load(std::memory_order_relaxed);
      if (const int wf = p.waiting_for.load(std::memory_order_relaxed); r != me && (wf == detail::position::kSilent || wf == detail::position::kGone)) {
        (wf == detail::position::kGone ? gone : mute).push_back(r);
        continue;
      }
      const std::string name = detail::position::text16(p.name);
      place* at = nullptr;
      for (place& q : places)
        if (q.seq_state == ss && q.name == name) at = &q;
      if (at == nullptr) at = &places.emplace_back(place{ss, name, {}, {}});
      at->ranks.push_back(r);
      const int wf = (ss & 3) == detail::position::kIn ? p.waiting_for.load(std::memory_order_relaxed) : -1;
      at->waits.push_back(wf);
      // A blocked wait shows life every sleep slice (50 ms): one silent for 4 of them is not
      // running (stopped, or starved of a core).
      const std::int64_t quiet = now - p.alive_ns.load(std::memory_order_relaxed);
      if (wf >= 0 && r != me && quiet > 4 * std::chrono::nanoseconds(detail::kSleepSlice).count()) silent.emplace_back(r, quiet);
    }
    std::sort(places.begin(), places.end(), [](const place& a, const place& b) { return a.seq_state < b.seq_state; });
    std::string o = "; where the ranks are:";
    for (std::size_t k = 0; k < places.size(); ++k) {
      const place& q = places[k];
      const std::string who = q.ranks.size() == 1 ? peer(q.ranks.front()) : detail::rank_ranges(q.ranks);
      o += std::string(k ? ";" : "") + " " + (q.ranks.size() == 1 ? who : "ranks " + who) + (q.ranks.size() == 1 ? " is " : " are ");
      const std::string call = q.name + " #" + std::to_string(q.seq_state >> 2);
      switch (q.seq_state & 3) {
        case detail::position::kNone: o += "in no collective yet"; break;
        case detail::position::kIn: o += "in " + call; break;
        case detail::position::kDone: o += "done with " + call; break;
        default: o += "failed in " + call; break;
      }
      bool same = true;
      for (int w : q.waits) same = same && w == q.waits.front();
      if (same && q.waits.front() >= 0) {
        o += ", waiting for " + peer(q.waits.front());
      } else if (!same) {
        for (std::size_t i = 0; i < q.waits.size(); ++i)
          if (q.waits[i] >= 0) o += std::string(", ") + std::to_string(q.ranks[i]) + " waiting for " + std::to_string(q.waits[i]);
      }
    }
    for (const auto& [r, quiet] : silent)
      o += "; " + peer(r) + " shows no sign of life for " + detail::format_seconds(std::chrono::nanoseconds(quiet)) +
           " (stopped, or not given a core)";
    // Ranks outside collx: in the callbacks of a call's work (a future's, under torch), or in
    // their own code since their last call, for longer than a rank takes between two calls.
    for (int r = 0; r < board.n; ++r) {
      const detail::position& p = *board.at(r);
      if (r == me) continue;
      const std::uint64_t ss = p.seq_state.load(std::memory_order_relaxed);
      const std::int32_t wf = p.waiting_for.load(std::memory_order_relaxed);
      if (wf == detail::position::kSilent || wf == detail::position::kGone) continue;
      const std::uint32_t u = p.user.load(std::memory_order_relaxed);
      const char* lang = u & detail::position::kPython ? "Python" : "its own code";
      const std::int64_t since = p.user_since_ns.load(std::memory_order_relaxed);
      const std::int64_t alive = p.alive_ns.load(std::memory_order_relaxed);
      // (in a call, here or on another of its communicators, a call its callbacks made
      // included: in collx)
      if ((ss & 3) == detail::position::kIn || p.else_seq.load(std::memory_order_relaxed) != 0) continue;
      if ((u & detail::position::kInCallback) && since != 0) {
        o += "; " + peer(r) + " is not in collx: in " + lang +
             ", in the callbacks of its last call's work (continuations; a future's under torch) for " +
             detail::format_seconds(std::chrono::nanoseconds(now - since));
      } else if (ss != 0 && alive != 0 && now - alive > 4 * std::chrono::nanoseconds(detail::kSleepSlice).count()) {
        o += "; " + peer(r) + " is not in collx: in " + lang + " for " + detail::format_seconds(std::chrono::nanoseconds(now - alive)) +
             " (since its last call)";
      }
    }
    auto some = [&](const std::vector<int>& v) { return v.size() == 1 ? peer(v.front()) : "ranks " + detail::rank_ranges(v); };
    if (!mute.empty())
      o += "; " + some(mute) + (mute.size() == 1 ? " does" : " do") + " not answer (its process is stopped, or hung)";
    if (!gone.empty()) o += "; " + some(gone) + (gone.size() == 1 ? " is" : " are") + " gone (its process refuses connections)";
    // Ranks stuck in a call on another of their communicators (comm/flight.hpp, note_blocked).
    for (int r = 0; r < board.n; ++r) {
      const detail::position& p = *board.at(r);
      const std::uint64_t es = p.else_seq.load(std::memory_order_relaxed);
      if (r == me || es == 0) continue;
      const std::string other = detail::position::text16(p.else_comm);
      const int wj = p.else_waiting_job.load(std::memory_order_relaxed);
      o += "; " + peer(r) + " is blocked in " + detail::position::text16(p.else_call) + " #" + std::to_string(es) +
           (other == "world" ? std::string(" on the job's communicator") : " on communicator " + other) +
           (wj >= 0 ? ", waiting for job rank " + std::to_string(wj) : std::string());
    }
    return o;
  }

  /// The job rank a timed_out() message names, or -1 (launchers follow chains of timeouts with
  /// it): "waiting for rank 2 (job rank 5)" names job rank 5.
  static int waited_for(const std::string& what) {
    const auto at = what.find(kWaitingFor);
    if (at == std::string::npos) return -1;
    auto number = [&](std::size_t i) {
      int r = 0;
      bool any = false;
      for (; i < what.size() && what[i] >= '0' && what[i] <= '9' && r < 1 << 24; ++i) {
        r = r * 10 + (what[i] - '0');
        any = true;
      }
      return std::pair{any ? r : -1, i};
    };
    const auto [r, end] = number(at + std::strlen(kWaitingFor));
    static constexpr std::string_view job = " (job rank ";
    if (r >= 0 && what.compare(end, job.size(), job) == 0) return number(end + job.size()).first;
    return r;
  }
  static constexpr const char* kWaitingFor = " waiting for rank ";
  /// How a rank still waiting when another rank's failure aborted the job says so (engine.hpp):
  /// "the job was aborted while waiting for rank 2 (its data over tcp): rank 1 failed: ...".
  static constexpr const char* kAbortedWhile = "the job was aborted while";

  /// Whether `what` is such an aborted wait of its own rank: the abort comes before any message
  /// it quotes (after "failed: " or "lost rank 1: "), and its first "waiting for rank" is the
  /// abort's. (A rank whose peer timed out first says that, not a timeout of its own, though it
  /// waited as long; launchers follow chains of waits through it.)
  static bool aborted_wait(const std::string& what) {
    const auto a = what.find(kAbortedWhile);
    return a != std::string::npos && a < what.find("failed") && a < what.find("lost ") &&
           what.find(kWaitingFor) == a + std::strlen(kAbortedWhile);
  }

  /// Compares the signature and size of a message from `peer` with what this rank expects.
  void check_match(int peer, const call_signature& theirs, std::size_t their_bytes, std::size_t my_bytes) const {
    if (theirs.comm != sig.comm)
      fail(errc::mismatch, "got a message from " + this->peer(peer) + " of a call on another communicator: " + theirs.describe());
    if (theirs.empty_calls != sig.empty_calls && theirs.seq == sig.seq)
      fail(errc::mismatch, "and " + this->peer(peer) +
                               " made different calls with zero elements before this one (those exchange nothing, "
                               "so they are compared here): this rank calls " +
                               sig.describe() + ", " + this->peer(peer) + " " + theirs.describe());
    if (!(theirs == sig))
      fail(errc::mismatch, "and " + this->peer(peer) + " made different calls: this rank called " + sig.describe() + ", " +
                               this->peer(peer) + " called " + theirs.describe());
    if (their_bytes != my_bytes)
      fail(errc::mismatch, "expected " + std::to_string(my_bytes) + " B from " + this->peer(peer) +
                               " but it sent " + std::to_string(their_bytes) + " B (counts differ between ranks)");
  }
};

namespace detail {
/// A wait of call c on `peer` has been blocked for a sleep slice (on) or has ended (off): the
/// rank's positions on its other communicators say so (comm/flight.hpp installs it).
inline void (*note_blocked_hook)(const call_info& c, int peer, bool on) noexcept = nullptr;

/// Times one blocking wait of a transport on `peer` (-1: any of several) into the call's flight
/// record (nothing when the record is off): `timed_wait tw(call, p);` before the wait, and
/// either tw.hook() passed to wait_on, which starts the clock once its spin phase is over (a
/// wait that the spin ends is not counted: it reads no clock), or tw.start() where the wait
/// blocks at once. A started wait ends when tw goes.
class timed_wait {
 public:
  timed_wait(const call_info& c, int peer) noexcept : c_(c.rec != nullptr ? &c : nullptr), peer_(peer) {}
  ~timed_wait() {
    if (t0_ != 0) c_->waited(peer_, std::chrono::nanoseconds(wall_ns() - t0_));
    if (noted_ && note_blocked_hook != nullptr) note_blocked_hook(*c_, peer_, false);
  }
  timed_wait(const timed_wait&) = delete;
  timed_wait& operator=(const timed_wait&) = delete;

  /// The wait blocks: its timing starts (once), and the rank's position says it is alive.
  void start() noexcept {
    if (c_ == nullptr) return;
    const std::int64_t now = wall_ns();
    if (c_->rec->pos != nullptr) c_->rec->pos->alive_ns.store(now, std::memory_order_relaxed);
    if (t0_ != 0) {
      // Blocked a sleep slice (start() comes again every slice): the rank's other
      // communicators' positions say where it is stuck. Waits that short never pay for it.
      if (!noted_ && now - t0_ >= std::chrono::nanoseconds(kSleepSlice).count() && note_blocked_hook != nullptr) {
        noted_ = true;
        note_blocked_hook(*c_, peer_, true);
      }
      return;
    }
    c_->waiting(peer_);
    t0_ = now;
  }
  on_block hook() noexcept { return c_ == nullptr ? on_block{} : on_block{&start_fn, this}; }

 private:
  static void start_fn(void* self) noexcept { static_cast<timed_wait*>(self)->start(); }
  const call_info* c_;
  int peer_;
  std::int64_t t0_ = 0;
  bool noted_ = false;
};
}  // namespace detail

}  // namespace collx
