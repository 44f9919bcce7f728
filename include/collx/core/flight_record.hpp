#pragma once
// One call in flight, as the flight recorder (comm/flight.hpp) keeps it while it runs: when this rank
// entered it, how long it has been blocked and on which peers, and how much later than this rank
// each of those peers entered the call. Transports feed it through call_info (core/call_info.hpp):
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
#include <cxxabi.h>
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
/// cores). One anchor for the whole process (a counter reading and the wall clock read between
/// two of them, so a preemption between the two does not skew it), so every thread converts
/// alike; the counter's rate is measured against the wall clock from the first anchor on, and
/// the anchor is taken again every ~50 ms by whichever thread finds it stale. A thread's
/// readings never go back. Its first 10 ms, and other machines, read clock_gettime.
struct fast_clock {
  struct sample_t {
    std::uint64_t tsc = 0;
    std::int64_t wall = 0;
  };
#if defined(__x86_64__)
  /// clock_gettime between two counter reads, kept when they lie close (no preemption between).
  static sample_t sample() noexcept {
    sample_t best;
    std::uint64_t gap = ~std::uint64_t(0);
    for (int i = 0; i < 8 && gap > 20000; ++i) {  // 20000 ticks: a few microseconds
      const std::uint64_t a = __rdtsc();
      const std::int64_t w = system_wall_ns();
      const std::uint64_t b = __rdtsc();
      if (b - a < gap) {
        gap = b - a;
        best = {a + (b - a) / 2, w};
      }
    }
    return best;
  }
#endif
  struct origin_t {
    bool usable = false;
    sample_t at;
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
      x.at = sample();
#endif
      return x;
    }();
    return o;
  }
  /// The process's anchor, behind a sequence lock (odd while one thread renews it).
  struct anchor_t {
    std::atomic<std::uint32_t> seq{0};
    std::atomic<std::uint64_t> tsc{0}, until{0};
    std::atomic<std::int64_t> wall{0};
    std::atomic<std::uint64_t> ns_per_tick_q32{0};  // ns per tick, in 32.32 fixed point
  };
  static anchor_t& anchor() noexcept {
    static anchor_t a;
    return a;
  }
  static std::int64_t now() noexcept {
#if defined(__x86_64__)
    static thread_local std::int64_t last = 0;
    const std::uint64_t t = __rdtsc();
    anchor_t& a = anchor();
    std::int64_t v = 0;
    bool have = false;
    const std::uint32_t s1 = a.seq.load(std::memory_order_acquire);
    if ((s1 & 1) == 0) {
      const std::uint64_t tsc = a.tsc.load(std::memory_order_relaxed), until = a.until.load(std::memory_order_relaxed);
      const std::int64_t wall = a.wall.load(std::memory_order_relaxed);
      const std::uint64_t q = a.ns_per_tick_q32.load(std::memory_order_relaxed);
      std::atomic_thread_fence(std::memory_order_acquire);
      // (t - tsc) is under 50 ms of ticks, so the product is under 50e6 * 2^32 and fits 64 bits;
      // an integer multiply and shift costs less a read than a round trip through double
      if (a.seq.load(std::memory_order_relaxed) == s1 && q != 0 && t >= tsc && t < until) {
        v = wall + std::int64_t(((t - tsc) * q) >> 32);
        have = true;
      }
    }
    if (!have) {
      v = system_wall_ns();
      const origin_t& o = origin();
      std::uint32_t even = s1 & ~1u;
      if (o.usable && v - o.at.wall >= 10'000'000 && a.seq.compare_exchange_strong(even, even + 1, std::memory_order_acquire)) {
        std::atomic_thread_fence(std::memory_order_release);  // the odd count before the fields (seqlock)
        const sample_t now = sample();  // long enough a baseline since the origin to measure the rate on
        const double r = now.tsc > o.at.tsc ? double(now.wall - o.at.wall) / double(now.tsc - o.at.tsc) : 0.0;
        if (r > 0 && r < 16.0) {  // (a wall clock stepped back meanwhile: no anchor this time)
          a.tsc.store(now.tsc, std::memory_order_relaxed);
          a.wall.store(now.wall, std::memory_order_relaxed);
          a.ns_per_tick_q32.store(std::uint64_t(r * 4294967296.0), std::memory_order_relaxed);
          a.until.store(now.tsc + std::uint64_t(50e6 / r), std::memory_order_relaxed);
        }
        a.seq.store(even + 2, std::memory_order_release);
      }
    }
    // A renewed anchor may put a reading a little behind the one before it.
    if (v < last) v = last;
    last = v;
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
/// core/call_info.hpp). Relaxed stores, read without a lock: a torn read can only misreport.
struct alignas(64) position {
  static constexpr std::uint64_t kNone = 0, kIn = 1, kDone = 2, kFailed = 3;
  /// waiting_for of a peer whose position was asked and not given (tcp: tcp/desync.hpp):
  /// it did not answer, or it is gone (its listener refused the connection).
  static constexpr std::int32_t kSilent = -2, kGone = -3;
  std::atomic<std::uint64_t> seq_state{0};  // seq << 2 | kIn, kDone or kFailed (0: no call yet)
  std::atomic<std::int32_t> waiting_for{-1};
  std::atomic<std::uint64_t> name[2] = {};  // the collective's name, 16 chars
  std::atomic<std::int64_t> alive_ns{0};    // its last sign of life (wall_ns): a call's start, a blocked wait's slices
  // Where the rank is blocked now on another communicator, for a sleep slice or more (0: it is
  // not): that communicator's name and the call (16 chars each), its number, and the job rank
  // it waits for (-1: any). A rank late here may be stuck there (comm/flight.hpp, note_blocked).
  std::atomic<std::uint64_t> else_comm[2] = {};
  std::atomic<std::uint64_t> else_call[2] = {};
  std::atomic<std::uint64_t> else_seq{0};
  std::atomic<std::int32_t> else_waiting_job{-1};
  // Where the rank is outside collx: in the continuations of a call's work (callbacks: user
  // code) since user_since_ns, and whether its calls come from Python (the torch backend's):
  // a rank whose Python holds the GIL "is not in collx: in Python" in a peer's report.
  static constexpr std::uint32_t kInCallback = 1, kPython = 2;
  std::atomic<std::uint32_t> user{0};
  std::atomic<std::int64_t> user_since_ns{0};

  /// A 16-character field (name, else_comm, else_call) from or into 16 bytes.
  using word16 = std::atomic<std::uint64_t>[2];
  static void put16(word16& w, const char* s16) noexcept {
    std::uint64_t v[2];
    std::memcpy(v, s16, sizeof v);
    w[0].store(v[0], std::memory_order_relaxed);
    w[1].store(v[1], std::memory_order_relaxed);
  }
  static void get16(const word16& w, char* out16) noexcept {
    const std::uint64_t v[2] = {w[0].load(std::memory_order_relaxed), w[1].load(std::memory_order_relaxed)};
    std::memcpy(out16, v, sizeof v);
  }
  /// The field as a string (up to its first NUL).
  static std::string text16(const word16& w) {
    char b[16];
    get16(w, b);
    return std::string(b, strnlen(b, sizeof b));
  }
};

/// Where a rank's calls come from, for the desync report's words on a rank that is not in collx
/// (flight::set_caller): 0, or position::kPython.
inline std::atomic<std::uint32_t> caller_language{0};

/// What a recorder put on its rank's position (to put it back when a nested call ends).
struct position_words {
  std::uint64_t seq_state = 0;
  std::uint64_t name[2] = {};
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
  int* heard = nullptr;  // the peers whose entry is known (late_by_peer set), to reset at the end
  int n_heard = 0;
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
  /// A message from `peer`, which entered the call at `their_entered_ns`. Kept whether or not
  /// this rank has waited on it yet: tcp hears the message that ends a wait before it counts the
  /// wait. Only the peers waited on are blamed (comm/flight.hpp, close).
  void note_heard(int peer, std::int64_t their_entered_ns) noexcept {
    if (peer < 0 || peer >= size || late_by_peer[peer] >= 0 || their_entered_ns == 0) return;
    late_by_peer[peer] = their_entered_ns > entered_ns ? their_entered_ns - entered_ns : 0;
    heard[n_heard++] = peer;
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
/// (comm/communicator.hpp).
inline thread_local std::string tl_last_error;
inline void note_last_error(const std::string& what) noexcept {
  try {
    tl_last_error = what;
  } catch (...) {
  }
}

/// std::uncaught_exceptions(), as collx reads it (the flight recorder twice a call: a call failed
/// when more exceptions are in flight as it ends than as it began; a communicator as it is made
/// and as it goes), without the standard one's cost: a call into the C++
/// runtime's shared library, which finds the thread's exception globals through __tls_get_addr
/// each time (~8 ns a read on the development VM, 16 a call). The Itanium C++ ABI (2.2.2) fixes
/// those globals' layout, `{ __cxa_exception* caughtExceptions; unsigned uncaughtExceptions; }`,
/// and both runtimes that follow it (libstdc++'s libsupc++, libc++abi) keep one such struct per
/// thread for the thread's life: its address is asked once a thread, and then only read.
inline int uncaught_exceptions() noexcept {
#if defined(__GLIBCXX__) || defined(_LIBCPPABI_VERSION)
  struct eh_globals {
    void* caught;
    unsigned int uncaught;
  };
  static thread_local const eh_globals* g = nullptr;
  if (g == nullptr) g = reinterpret_cast<const eh_globals*>(abi::__cxa_get_globals());
  return int(g->uncaught);
#else
  return std::uncaught_exceptions();
#endif
}

/// Closes a call's record when its call_info goes (comm/flight.hpp fills it in): a function pointer,
/// so that core/call_info.hpp needs nothing of the recorder.
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
  close(recorder, rec, uncaught_exceptions() > uncaught);
  close = nullptr;
  rec = nullptr;
}
