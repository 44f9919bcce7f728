#pragma once
// The flight recorder: every communicator keeps its last K calls (COLLX_FLIGHT_RECORDER=K,
// default 512, 0 = off) as this rank saw them — sequence number, collective, policy, count,
// element size, op, root, state, when it was issued, started and ended, and how long it waited on
// which peers — and, over its whole life, how long this rank waited on each peer and how much of
// that each peer's late arrival explains (the straggler accounting: core/flight_record.hpp).
//
// It is dumped as JSON, one file per job rank holding every communicator of that rank, into
// COLLX_DUMP_DIR: on any failed call (a timeout, a mismatch, a lost peer, a bad argument), on
// demand (flight::dump), and on SIGUSR2 when asked for (COLLX_DUMP_ON_SIGUSR2=1 or
// flight::dump_on_signal()). tools/collx_trace.cpp reads a job's dumps and says what happened.
//
//   collx::flight::waits(comm)        this rank's wait table on comm (per peer: waited, late)
//   collx::flight::records(comm)      the recorded calls, oldest first
//   collx::flight::json(comm)         one communicator as JSON
//   collx::flight::dump(job_rank)     writes COLLX_DUMP_DIR/collx-rank<R>.json now
//
// The thread running a communicator's calls writes its records; a dump may read them from any
// thread (a lock per communicator, taken twice per call: record_lock).
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "../core/debug.hpp"
#include "../core/flight_record.hpp"
#include "../core/settings.hpp"
#include "../core/error.hpp"
#include "../core/call_info.hpp"

namespace collx {

enum class call_state : std::uint8_t { running, done, failed };

inline const char* to_string(call_state s) noexcept {
  switch (s) {
    case call_state::running: return "running";
    case call_state::done: return "done";
    case call_state::failed: return "failed";
  }
  return "?";
}

/// Time this rank waited on one peer, and the part of it the peer's late entry explains.
struct peer_wait {
  int peer = -1;
  std::int64_t waited_ns = 0;
  std::int64_t late_ns = 0;
};

/// One recorded call.
struct flight_entry {
  std::uint64_t index = 0;  // this communicator's calls, point to point included, from 0
  call_signature sig;       // collective, policy, op, seq (0: point to point), count, element size, root
  call_state state = call_state::running;
  std::int64_t issued_ns = 0, start_ns = 0, end_ns = 0;  // wall clock (end 0 while running)
  std::int64_t waited_ns = 0;                            // blocked in all
  int waiting_for = -1;                                  // running: the peer its wait is on now
  static constexpr std::size_t kPeers = 4;
  std::array<peer_wait, kPeers> peers{};  // the peers waited on longest, longest first
  int n_peers = 0;
  int code = 0;  // collx::errc of a failed call
  std::string error;
};

/// This rank's waits on one communicator over its life, indexed by peer rank.
struct wait_table {
  std::vector<std::int64_t> waited_ns;  // blocked on each peer
  std::vector<std::int64_t> late_ns;    // of which the peer's late entry explains
  std::uint64_t calls = 0;
  std::int64_t busy_ns = 0;  // in calls, from entry to return
};

namespace detail {

inline std::size_t flight_capacity() {
  return std::size_t(env_int("COLLX_FLIGHT_RECORDER", 0ll, 1ll << 20, 512));
}

class flight_recorder;

/// A recorder's lock: taken twice a call by the thread that runs it, and now and then by a
/// dump, so almost never contended (core/wait.hpp).
using record_lock = yield_lock;

/// Every recorder of this process (dumps gather a job rank's communicators). Never destroyed:
/// a communicator that outlives static destruction still finds it.
struct flight_registry {
  std::mutex mu;
  std::vector<flight_recorder*> all;
  std::atomic<bool> signal_thread{false};
  int pipe_w = -1;
};
inline flight_registry& flight_recorders() {
  static flight_registry* r = new flight_registry;
  return *r;
}

inline std::string_view sig_text(const char* p, std::size_t n) { return {p, strnlen(p, n)}; }

void dump_job_rank_noexcept(int job_rank, const char* reason) noexcept;

class flight_recorder {
 public:
  flight_recorder() : cap_(flight_capacity()) {
    auto& r = flight_recorders();
    std::lock_guard g(r.mu);
    r.all.push_back(this);
  }
  flight_recorder(const flight_recorder&) = delete;
  flight_recorder& operator=(const flight_recorder&) = delete;
  ~flight_recorder() {
    auto& r = flight_recorders();
    std::lock_guard g(r.mu);
    r.all.erase(std::remove(r.all.begin(), r.all.end(), this), r.all.end());
  }

  /// Which communicator this records (set by the communicator; the identity stays put).
  void bind(const comm_identity* id, int rank, int size, const char* transport, const debug_log* dbg = nullptr,
            position_board board = {}) {
    std::lock_guard g(mu_);
    board_ = board;
    pos_ = board.base != nullptr && rank >= 0 && rank < board.n ? board.at(rank) : nullptr;
    if (pos_ != nullptr) pos_->user.store(caller_language.load(std::memory_order_relaxed), std::memory_order_relaxed);
    dbg_ = dbg != nullptr && dbg->on(debug_level::warn) ? dbg : nullptr;
    if (cap() == 0 && dbg != nullptr && dbg->on(debug_level::trace)) cap_.store(1, std::memory_order_relaxed);  // TRACE prints the record's timings
    id_ = id;
    rank_ = rank;
    size_ = size;
    transport_ = transport;
    cum_.waited_ns.assign(std::size_t(size > 0 ? size : 0), 0);
    cum_.late_ns.assign(std::size_t(size > 0 ? size : 0), 0);
  }
  bool enabled() const noexcept { return cap() != 0; }
  /// The position board of the communicator (empty when its transport has none).
  const position_board& board() const noexcept { return board_; }

  /// Job rank `job_rank` is blocked in call c on another communicator (on), or no longer (off):
  /// this recorder's position says so, if it is that rank's (note_blocked).
  void mark_elsewhere(int job_rank, const call_info& c, int peer, bool on) noexcept {
    std::lock_guard g(mu_);
    if (pos_ == nullptr || id_ == nullptr || id_ == c.comm || job_rank_locked() != job_rank) return;
    const std::uint64_t seq = c.sig.seq == 0 ? 1 : c.sig.seq;
    char comm[16] = {};
    const bool job = c.comm == nullptr || c.comm->is_job();
    const char* name = job ? "world" : c.comm->name.c_str();
    std::memcpy(comm, name, std::min(std::strlen(name), sizeof comm));
    if (!on) {  // only its own note (another thread of the rank may be blocked on a third one)
      char now[16];
      position::get16(pos_->else_comm, now);
      if (pos_->else_seq.load(std::memory_order_relaxed) == seq && std::memcmp(now, comm, sizeof comm) == 0)
        pos_->else_seq.store(0, std::memory_order_relaxed);
      return;
    }
    position::put16(pos_->else_comm, comm);
    static_assert(sizeof c.sig.collective == 16);
    position::put16(pos_->else_call, c.sig.collective);
    pos_->else_waiting_job.store(peer < 0 ? -1 : (c.comm == nullptr ? peer : c.comm->job_rank(peer)), std::memory_order_relaxed);
    pos_->else_seq.store(seq, std::memory_order_relaxed);
  }
  /// The continuations of a call of this communicator run now (in), or have returned: user
  /// code, not collx (comm/call_queue.hpp). The position says so, for the peers' desync
  /// report, and a dump meanwhile.
  void in_user_code(bool in) noexcept {
    const std::int64_t now = wall_ns();
    user_since_.store(in ? now : 0, std::memory_order_relaxed);
    if (pos_ == nullptr) return;
    pos_->user_since_ns.store(in ? now : 0, std::memory_order_relaxed);
    pos_->user.store((in ? position::kInCallback : 0) | caller_language.load(std::memory_order_relaxed), std::memory_order_relaxed);
    if (!in) pos_->alive_ns.store(now, std::memory_order_relaxed);  // back in collx: a sign of life
  }
  /// Since when this rank runs continuations of this communicator's calls (wall_ns), or 0.
  std::int64_t user_since() const noexcept { return user_since_.load(std::memory_order_relaxed); }
  std::size_t capacity() const noexcept { return cap(); }
  /// The job rank of this communicator's own rank (any thread may ask: a dump does).
  int job_rank() const {
    std::lock_guard g(mu_);
    return job_rank_locked();
  }

  /// A call starts: its record, or nullptr when off (or nested too deep). Stamps sig.entered_ns.
  call_record* open(call_signature& sig, std::int64_t issued_ns) {
    if (cap() == 0 || depth_ == kDepth) return nullptr;
    open_call& o = open_[depth_];
    if (o.w.size() != std::size_t(size_)) size_up(o);
    call_record& r = o.rec;  // (close() left its per-peer state empty)
    r.code = 0;
    if (!r.error.empty()) r.error.clear();
    r.policy = nullptr;
    r.pos = sig.seq != 0 ? pos_ : nullptr;  // collectives only: point to point has no place in a sequence
    r.waited_live.store(0, std::memory_order_relaxed);
    r.waiting_for.store(-1, std::memory_order_relaxed);
    r.entered_ns = wall_ns();
    sig.entered_ns = r.entered_ns;
    if (dbg_ != nullptr) o.sig = sig;
    if (r.pos != nullptr) o.published = publish(*r.pos, sig, position::kIn);
    {
      std::lock_guard g(mu_);
      if (head_ == ring_.size()) grow();  // (a throw leaves the ring as it was)
      flight_entry& e = ring_[head_];
      o.index = next_++;
      o.slot = head_;
      if (++head_ == cap()) head_ = 0;  // head_ is next_ % cap(), without a division a call
      e.index = o.index;
      e.sig = sig;
      e.state = call_state::running;
      // (issued on another thread, whose clock may be a little ahead: never after the start)
      e.issued_ns = issued_ns != 0 && issued_ns < r.entered_ns ? issued_ns : r.entered_ns;
      e.start_ns = r.entered_ns;
      e.end_ns = 0;
      e.waited_ns = 0;
      e.n_peers = 0;
      e.code = 0;
      if (!e.error.empty()) e.error.clear();
      o.live = true;
    }
    ++depth_;
    return &r;
  }

  /// A call ends (its call_info goes): done, or failed when an exception is leaving it.
  void close(call_record* rp, bool failed) noexcept {
    int d = depth_ - 1;
    while (d >= 0 && &open_[d].rec != rp) --d;
    if (d < 0) return;
    open_call& o = open_[d];
    call_record& r = o.rec;
    const std::int64_t end = wall_ns();
    if (r.pos != nullptr) {
      // A nested call ending puts the call around it back on the board (still in it).
      if (d > 0 && open_[d - 1].live && open_[d - 1].rec.pos != nullptr) {
        put(*r.pos, open_[d - 1].published, end);
      } else {
        r.pos->waiting_for.store(-1, std::memory_order_relaxed);
        r.pos->alive_ns.store(end, std::memory_order_relaxed);  // when it left collx (the report's "not in collx for")
        r.pos->seq_state.store((o.published.seq_state & ~std::uint64_t(3)) | (failed ? position::kFailed : position::kDone),
                               std::memory_order_relaxed);
      }
    }
    // The peers waited on longest, and what each one's late entry explains (none, in a call
    // that no wait of which outlasted its spin: the common case, kept short).
    std::array<peer_wait, flight_entry::kPeers> top;  // (n_top of them are set)
    int n_top = 0;
    if (r.n_touched > 0) rank_waits(o, top, n_top);
    bool dump = false;
    int job = 0;
    {
      std::lock_guard g(mu_);
      for (int i = 0; i < r.n_touched; ++i) {
        const int p = r.touched[i];
        cum_.waited_ns[std::size_t(p)] += o.w[std::size_t(p)];
        cum_.late_ns[std::size_t(p)] += o.late_blame[std::size_t(i)];
      }
      ++cum_.calls;
      cum_.busy_ns += end - r.entered_ns;
      if (next_ - o.index <= cap()) {  // not overwritten by later calls (nested ones)
        flight_entry& e = ring_[o.slot];
        e.state = failed ? call_state::failed : call_state::done;
        if (r.policy != nullptr) set_name(e.sig.policy, r.policy);
        e.end_ns = end;
        e.waited_ns = r.waited_live.load(std::memory_order_relaxed);
        std::copy_n(top.begin(), n_top, e.peers.begin());  // (readers read n_peers of them)
        e.n_peers = n_top;
        e.code = r.code;
        if (failed) e.error = r.error.empty() ? "failed (an exception left the call)" : r.error;
      }
      o.live = false;
      dump = failed && dump_on_error_;
      if (dump) job = job_rank_locked();
    }
    for (int i = 0; i < r.n_touched; ++i) o.w[std::size_t(r.touched[i])] = 0;
    for (int i = 0; i < r.n_heard; ++i) o.late[std::size_t(r.heard[i])] = -1;
    r.n_touched = 0;
    r.n_heard = 0;
    if (!o.late_blame.empty()) o.late_blame.clear();
    if (d == depth_ - 1) {
      --depth_;
      while (depth_ > 0 && !open_[depth_ - 1].live) --depth_;
    }
    if (dump && depth_ == 0) dump_job_rank_noexcept(job, "a call failed");
    if (dbg_ != nullptr && (failed || dbg_->on(debug_level::trace))) debug_line(d, failed, end, top, n_top);
  }
  static void close_fn(void* self, call_record* r, bool failed) noexcept {
    static_cast<flight_recorder*>(self)->close(r, failed);
  }

  std::vector<flight_entry> entries() const {
    std::lock_guard g(mu_);
    std::vector<flight_entry> v;
    const std::uint64_t first = next_ > cap() ? next_ - cap() : 0;
    for (std::uint64_t i = first; i < next_; ++i) v.push_back(snapshot(i));
    return v;
  }
  wait_table waits() const {
    std::lock_guard g(mu_);
    return cum_;
  }

  /// This communicator as a JSON object (comm/flight/json.hpp).
  std::string json() const;

  void set_dump_on_error(bool on) noexcept {
    std::lock_guard g(mu_);
    dump_on_error_ = on;
  }

 private:
  static constexpr int kDepth = 4;  // calls made inside calls (automatic's setup inside its first call)
  struct open_call {
    call_record rec;
    std::vector<std::int64_t> w, late;
    std::vector<int> touched, heard;
    std::vector<std::int64_t> late_blame;  // per touched peer, filled at close
    std::uint64_t index = 0;
    std::size_t slot = 0;  // its entry in ring_ (index % cap())
    call_signature sig;  // kept only for debug lines (dbg_)
    position_words published;  // what open() put on the board: put back when a nested call ends
    bool live = false;  // guarded by mu_
    void touched_late(int, std::int64_t late) { late_blame.push_back(late); }
  };

  /// WARN for a failed call, TRACE for every call: what it was, how long it took and waited.
  void debug_line(int d, bool failed, std::int64_t end, const std::array<peer_wait, flight_entry::kPeers>& top, int n_top) noexcept {
    try {
      const call_record& r = open_[d].rec;
      if (r.policy != nullptr) set_name(open_[d].sig.policy, r.policy);
      std::string m = sig_text(open_[d].sig.collective, sizeof open_[d].sig.collective).empty() ? "call" : open_[d].sig.describe();
      if (id_ != nullptr && !id_->is_job()) m += " on " + id_->name;
      char b[96];
      std::snprintf(b, sizeof b, ": %s in %.1f us, waited %.1f us", failed ? "failed" : "done", double(end - r.entered_ns) / 1e3,
                    double(r.waited_live.load(std::memory_order_relaxed)) / 1e3);
      m += b;
      for (int k = 0; k < n_top; ++k) {
        std::snprintf(b, sizeof b, "%s rank %d %.1f us", k == 0 ? " (on" : ",", top[std::size_t(k)].peer,
                      double(top[std::size_t(k)].waited_ns) / 1e3);
        m += b;
      }
      if (n_top > 0) m += ")";
      if (failed) m += ": " + (r.error.empty() ? std::string("an exception left the call") : r.error);
      dbg_->write(failed ? debug_level::warn : debug_level::trace, m);
    } catch (...) {
    }
  }
  static position_words publish(position& p, const call_signature& sig, std::uint64_t state) noexcept {
    position_words w;
    static_assert(sizeof sig.collective == sizeof w.name);
    std::memcpy(w.name, sig.collective, sizeof w.name);
    w.seq_state = sig.seq << 2 | state;
    put(p, w, sig.entered_ns);
    return w;
  }
  static void put(position& p, const position_words& w, std::int64_t alive) noexcept {
    p.name[0].store(w.name[0], std::memory_order_relaxed);
    p.name[1].store(w.name[1], std::memory_order_relaxed);
    p.waiting_for.store(-1, std::memory_order_relaxed);
    p.alive_ns.store(alive, std::memory_order_relaxed);
    p.seq_state.store(w.seq_state, std::memory_order_relaxed);
  }
  int job_rank_locked() const noexcept { return id_ == nullptr ? rank_ : id_->job_rank(rank_); }
  /// The ring takes its cap() entries at the communicator's first call, all at once: grown by
  /// doubling as calls came, its copies and first touches fell inside the first few hundred
  /// calls of a job (shm 8 B broadcast, 2 ranks, 1000 calls: 0.53-0.59 us a call against 0.33
  /// steady, docs/performance.md). A communicator that never calls takes none.
  void grow() { ring_.resize(cap()); }
  /// An open call's per-peer state, sized to the communicator (once a depth).
  void size_up(open_call& o) {
    o.w.assign(std::size_t(size_), 0);
    o.late.assign(std::size_t(size_), -1);
    o.touched.assign(std::size_t(size_), 0);
    o.heard.assign(std::size_t(size_), 0);
    o.late_blame.reserve(std::size_t(size_));  // close() must not allocate
    call_record& r = o.rec;
    r.wait_by_peer = o.w.data();
    r.late_by_peer = o.late.data();
    r.touched = o.touched.data();
    r.n_touched = 0;
    r.heard = o.heard.data();
    r.n_heard = 0;
    r.size = size_;
  }
  /// The peers a closing call waited on longest (top, longest first), and what each one's late
  /// entry explains (o.late_blame, per touched peer).
  static void rank_waits(open_call& o, std::array<peer_wait, flight_entry::kPeers>& top, int& n_top) noexcept {
    const call_record& r = o.rec;
    for (int i = 0; i < r.n_touched; ++i) {
      const int p = r.touched[i];
      const std::int64_t w = o.w[std::size_t(p)];
      const std::int64_t late = o.late[std::size_t(p)] > 0 ? std::min(w, o.late[std::size_t(p)]) : 0;
      const peer_wait pw{p, w, late};
      int at = n_top;
      while (at > 0 && top[std::size_t(at - 1)].waited_ns < w) --at;
      if (at < int(top.size())) {
        for (int k = std::min(n_top, int(top.size()) - 1); k > at; --k) top[std::size_t(k)] = top[std::size_t(k - 1)];
        top[std::size_t(at)] = pw;
        n_top = std::min(n_top + 1, int(top.size()));
      }
      o.touched_late(p, late);
    }
  }
  /// Entry i under mu_, with a running call's live wait state.
  flight_entry snapshot(std::uint64_t i) const {
    flight_entry e = ring_[std::size_t(i % cap())];
    if (e.state == call_state::running)
      for (int d = 0; d < kDepth; ++d)
        if (open_[d].live && open_[d].index == i) {
          e.waiting_for = open_[d].rec.waiting_for.load(std::memory_order_relaxed);
          e.waited_ns = open_[d].rec.waited_live.load(std::memory_order_relaxed);
        }
    return e;
  }

  std::atomic<std::size_t> cap_;  // set before the first call (bind); a dump may read it meanwhile
  std::size_t cap() const noexcept { return cap_.load(std::memory_order_relaxed); }
  position_board board_;      // the communicator's, where its transport has one
  position* pos_ = nullptr;   // this rank's on it
  const debug_log* dbg_ = nullptr;  // the communicator's, when it prints WARN or more
  mutable record_lock mu_;
  std::vector<flight_entry> ring_;
  std::uint64_t next_ = 0;
  std::size_t head_ = 0;  // next_ % cap(): where the next call's entry goes
  std::array<open_call, kDepth> open_{};
  int depth_ = 0;  // the runner's own
  wait_table cum_;
  const comm_identity* id_ = nullptr;
  std::atomic<std::int64_t> user_since_{0};
  int rank_ = 0, size_ = 0;
  const char* transport_ = nullptr;
  bool dump_on_error_ = true;
};

/// note_blocked_hook (core/call_info.hpp): the blocked rank's positions on its other communicators.
/// (c and peer may be numbered as a transport within the communicator numbers them: call_info::up)
inline void note_blocked(const call_info& c, int peer, bool on) noexcept {
  const int here = c.here(c.rank);
  const int me = c.comm == nullptr ? here : c.comm->job_rank(here);
  auto& r = flight_recorders();
  std::lock_guard g(r.mu);
  for (flight_recorder* x : r.all) x->mark_elsewhere(me, c, c.here(peer), on);
}
inline const bool note_blocked_installed = (note_blocked_hook = &note_blocked, true);

}  // namespace detail

namespace flight {

/// This rank's wait table on comm: per peer, the time waited on it and the part its late entry
/// explains (core/flight_record.hpp), with the calls counted and the time spent in them.
template <class Comm>
wait_table waits(const Comm& comm) {
  return comm.recorder().waits();
}

/// comm's recorded calls, oldest first (the last COLLX_FLIGHT_RECORDER of them).
template <class Comm>
std::vector<flight_entry> records(const Comm& comm) {
  return comm.recorder().entries();
}

/// The language this process's collx calls come from, for the desync report: a peer that
/// finds this rank outside collx says "in its own code (Python)", or "in the callbacks of ... 's
/// work (Python)". The torch backend calls it with true as it loads.
inline void set_caller_python(bool python) noexcept {
  detail::caller_language.store(python ? detail::position::kPython : 0, std::memory_order_relaxed);
}

/// comm's record as one JSON object (as in a dump's "communicators").
template <class Comm>
std::string json(const Comm& comm) {
  return comm.recorder().json();
}

}  // namespace flight

}  // namespace collx

// Defined apart, by responsibility: the record as JSON, its dump files and the dump signal,
// and the analysis of the wait tables.
#include "flight/json.hpp"
#include "flight/dumps.hpp"
#include "flight/analysis.hpp"
