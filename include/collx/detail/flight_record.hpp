#pragma once
// One call in flight, as the flight recorder (flight.hpp) keeps it while it runs: when this rank
// entered it, how long it has been blocked and on which peers, and how much later than this rank
// each of those peers entered the call. Transports feed it through call_info (signature.hpp):
//   call.waiting(p); ...wait...; call.waited(p, ns)   around every blocking wait, on the peer
//                                                     the wait is for;
//   call.heard(p, their_signature)                    on every message taken from p (its
//                                                     signature says when p entered the call).
// What a peer is blamed for (its `late` time) is the part of this rank's wait on it that its late
// arrival explains: min(waited on p, p's entry - this rank's entry). A rank that is slow only
// because it waited on someone else entered on time, so in a ring where one rank is late its
// successors wait on their predecessors but only the late rank is blamed (docs/diagnostics.md).
//
// Plain data, no locks. Written only by the thread running the communicator's calls.
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

#if defined(__x86_64__)
#include <x86intrin.h>
#endif

namespace collx {
enum class errc;
}

namespace collx::detail {

/// Wall-clock nanoseconds since the epoch, read the slow way (clock_gettime, ~25 ns here).
inline std::int64_t system_wall_ns() noexcept {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

/// The recorder's clock: wall-clock nanoseconds since the epoch, the one clock of records
/// (comparable across the processes of one host, and across hosts as far as their clocks
/// agree). A call reads it twice, and a blocking wait twice more, so on x86-64 it counts the
/// time stamp counter (~10 ns a read here, against clock_gettime's ~25) where the kernel keeps
/// time by it too (its clocksource is "tsc": the counter is invariant and in step across
/// cores): the counter's rate is measured against clock_gettime from the first read onwards,
/// and each thread re-anchors on clock_gettime every ~50 ms, so a reading stays within a few
/// microseconds of clock_gettime's at first and within nanoseconds once the process has run for
/// seconds (a thread's readings never go back). Its first 10 ms, and other machines, read
/// clock_gettime.
struct fast_clock {
  struct origin_t {
    bool usable = false;
    std::uint64_t tsc0 = 0;
    std::int64_t wall0 = 0;
  };
  static const origin_t& origin() noexcept {
    static const origin_t o = [] {
      origin_t x;
#if defined(__x86_64__)
      if (std::FILE* f = std::fopen("/sys/devices/system/clocksource/clocksource0/current_clocksource", "r")) {
        char b[16] = {};
        x.usable = std::fgets(b, sizeof b, f) != nullptr && std::strncmp(b, "tsc", 3) == 0;
        std::fclose(f);
      }
      x.tsc0 = __rdtsc();
      x.wall0 = system_wall_ns();
#endif
      return x;
    }();
    return o;
  }
  static std::atomic<double>& rate() noexcept {  // ns per tick (0: not measured yet)
    static std::atomic<double> r{0.0};
    return r;
  }
  struct anchor_t {
    std::uint64_t tsc = 0;
    std::int64_t wall = 0;
    double ns_per_tick = 0;
    std::uint64_t refresh = 0;  // ticks after which to re-anchor
    std::int64_t last = 0;      // the last reading: a thread's readings never go back
  };
  static std::int64_t now() noexcept {
#if defined(__x86_64__)
    static thread_local anchor_t a;
    const std::uint64_t t = __rdtsc();
    std::int64_t v;
    if (a.ns_per_tick != 0 && t - a.tsc < a.refresh) {
      v = a.wall + std::int64_t(double(t - a.tsc) * a.ns_per_tick);
    } else {
      v = system_wall_ns();
      const origin_t& o = origin();
      if (!o.usable) return v;
      if (v - o.wall0 >= 10'000'000 && t > o.tsc0) {  // long enough a baseline to measure the rate on
        const double r = double(v - o.wall0) / double(t - o.tsc0);
        rate().store(r, std::memory_order_relaxed);
        a.tsc = t;
        a.wall = v;
        a.ns_per_tick = r;
        a.refresh = std::uint64_t(50e6 / r);
      }
    }
    // A re-anchored reading may fall a little behind the extrapolated one before it.
    if (v < a.last) v = a.last;
    a.last = v;
    return v;
#else
    return system_wall_ns();
#endif
  }
};

inline std::int64_t wall_ns() noexcept { return fast_clock::now(); }

/// Where a rank is on a communicator, in memory its peers can read (transports that have such:
/// inproc's group, shm's segment): its recorder writes it as every collective starts and ends,
/// and a rank that times out reads its peers' to say where they are (the desync report,
/// signature.hpp). Relaxed stores, read without a lock: a torn read can only misreport.
struct alignas(64) position {
  static constexpr std::uint64_t kNone = 0, kIn = 1, kDone = 2, kFailed = 3;
  std::atomic<std::uint64_t> seq_state{0};  // seq << 2 | kIn, kDone or kFailed (0: no call yet)
  std::atomic<std::int32_t> waiting_for{-1};
  std::atomic<std::uint64_t> name[2] = {};  // the collective's name, 16 chars
  std::atomic<std::int64_t> alive_ns{0};    // its last sign of life (wall_ns): a call's start, a blocked wait's slices
};

/// Where the positions of a communicator's ranks lie: rank r's at base + r * stride.
struct position_board {
  position* base = nullptr;
  std::size_t stride = sizeof(position);
  int n = 0;
  position* at(int r) const noexcept {
    return reinterpret_cast<position*>(reinterpret_cast<std::byte*>(base) + std::size_t(r) * stride);
  }
};

struct call_record {
  std::int64_t entered_ns = 0;  // when this rank entered the call
  std::atomic<std::int64_t> waited_live{0};  // blocked in all (read by a dump taken meanwhile)
  std::atomic<int> waiting_for{-1};          // the peer a wait is on now (-1: none), likewise
  // Per peer (indexed by rank, `size` of them): time blocked on it in this call, and how much
  // later than this rank it entered (-1: not heard from yet). `touched` lists the peers waited on.
  std::int64_t* wait_by_peer = nullptr;
  std::int64_t* late_by_peer = nullptr;
  int* touched = nullptr;
  int n_touched = 0;
  int size = 0;
  int code = 0;  // the collx::errc it failed with (0: none recorded)
  std::string error;
  const char* policy = nullptr;  // the policy algo::automatic chose (its name), once it has
  position* pos = nullptr;       // this rank's on the board, for a collective (else null)

  void waiting(int peer) noexcept {
    waiting_for.store(peer, std::memory_order_relaxed);
    if (pos != nullptr) pos->waiting_for.store(peer, std::memory_order_relaxed);
  }
  void add_wait(int peer, std::int64_t ns) noexcept {
    waiting_for.store(-1, std::memory_order_relaxed);
    if (pos != nullptr) pos->waiting_for.store(-1, std::memory_order_relaxed);
    if (ns <= 0) return;
    waited_live.store(waited_live.load(std::memory_order_relaxed) + ns, std::memory_order_relaxed);
    if (peer < 0 || peer >= size) return;
    if (wait_by_peer[peer] == 0) touched[n_touched++] = peer;
    wait_by_peer[peer] += ns;
  }
  /// A message from `peer`, which entered the call at `their_entered_ns`.
  void heard(int peer, std::int64_t their_entered_ns) noexcept {
    if (peer < 0 || peer >= size || wait_by_peer[peer] == 0 || late_by_peer[peer] >= 0 || their_entered_ns == 0) return;
    late_by_peer[peer] = their_entered_ns > entered_ns ? their_entered_ns - entered_ns : 0;
  }
  /// Whether a message from `peer` should be looked at for its entry time (a transport that
  /// does not read every message's signature asks first).
  bool wants_entry(int peer) const noexcept {
    return peer >= 0 && peer < size && wait_by_peer[peer] != 0 && late_by_peer[peer] < 0;
  }
  void set_error(int c, const std::string& what) {
    if (code != 0) return;  // the first failure is the cause; what follows is its consequence
    code = c;
    error = what;
  }
};

/// The last error a collx call of this thread failed with: a communicator that goes while an
/// error leaves its scope tells its peers this, the cause, when it fails them
/// (communicator.hpp).
inline thread_local std::string tl_last_error;
inline void note_last_error(const std::string& what) noexcept {
  try {
    tl_last_error = what;
  } catch (...) {
  }
}

/// Closes a call's record when its call_info goes (flight.hpp fills it in): a function pointer,
/// so that signature.hpp needs nothing of the recorder.
struct record_mark {
  void (*close)(void* recorder, call_record*, bool failed) noexcept = nullptr;
  void* recorder = nullptr;
  call_record* rec = nullptr;
  int uncaught = 0;  // std::uncaught_exceptions() when opened: more at close means it failed

  record_mark() = default;
  record_mark(const record_mark&) = delete;
  record_mark& operator=(const record_mark&) = delete;
  record_mark(record_mark&& o) noexcept : close(o.close), recorder(o.recorder), rec(o.rec), uncaught(o.uncaught) {
    o.close = nullptr;
    o.rec = nullptr;
  }
  record_mark& operator=(record_mark&& o) noexcept {
    if (this != &o) {
      finish();
      close = o.close;
      recorder = o.recorder;
      rec = o.rec;
      uncaught = o.uncaught;
      o.close = nullptr;
      o.rec = nullptr;
    }
    return *this;
  }
  ~record_mark() { finish(); }

 private:
  void finish() noexcept;
};

}  // namespace collx::detail

#include <exception>

inline void collx::detail::record_mark::finish() noexcept {
  if (close == nullptr) return;
  close(recorder, rec, std::uncaught_exceptions() > uncaught);
  close = nullptr;
  rec = nullptr;
}
