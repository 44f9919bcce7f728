#pragma once
// Waiting without burning the core a peer needs. A waiter spins for a short while (a peer on
// another core answers within a microsecond), then sleeps on a futex until the word it watches
// changes, its deadline passes, or it is woken to re-check for a failed peer. Wakers call the
// futex only when someone sleeps, so the fast path is two atomic operations.
//
// Process-shared futexes (no FUTEX_PRIVATE_FLAG) are used when the word lives in memory shared
// between processes: libstdc++'s std::atomic::wait uses private futexes, which never wake a
// waiter in another process, and it has no deadline.
#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstdint>
#include <ctime>

namespace collx::detail {

/// Spin iterations before yielding. One iteration is a pause instruction plus a load, ~10-40 ns
/// on x86, so this is a few microseconds: enough for a peer running on another core to answer a
/// small message (a cache line crosses between the cores here in ~55 ns).
inline constexpr int kSpinIterations = 256;

/// sched_yield() calls before sleeping. When ranks outnumber cores the peer being waited for is
/// usually runnable but not running; yielding hands it the core at once, where a futex sleep
/// costs a ~28 us wake-up on the development VM. Measured with
/// `collx-perf -np 8 -b 8 -e 8 --algo ring` on 2 cores: 2.2 ms per 8-byte all-reduce with spin
/// then sleep, against the figure in docs/performance.md with this yield phase.
inline constexpr int kYieldIterations = 64;

/// Longest single sleep: a sleeper re-checks its deadline and its peers' liveness at least this often.
inline constexpr std::chrono::milliseconds kSleepSlice{50};

inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

inline void futex_wait(std::atomic<std::uint32_t>& word, std::uint32_t expected, std::chrono::nanoseconds max,
                       bool shared) noexcept {
  if (max <= std::chrono::nanoseconds::zero()) return;
  timespec ts{};
  ts.tv_sec = time_t(max.count() / 1'000'000'000);
  ts.tv_nsec = long(max.count() % 1'000'000'000);
  syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word), shared ? FUTEX_WAIT : (FUTEX_WAIT | FUTEX_PRIVATE_FLAG),
          expected, &ts, nullptr, 0);
}

inline void futex_wake_all(std::atomic<std::uint32_t>& word, bool shared) noexcept {
  syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word), shared ? FUTEX_WAKE : (FUTEX_WAKE | FUTEX_PRIVATE_FLAG),
          INT_MAX, nullptr, nullptr, 0);
}

/// A word that waiters watch, with the count of sleepers so that wakers skip the system call
/// when nobody sleeps. Both sides use sequentially consistent operations: the waker stores the
/// word then reads `sleepers`; the sleeper increments `sleepers` then re-reads the word, so one
/// of them always sees the other.
struct waitable {
  std::atomic<std::uint32_t> word{0};
  std::atomic<std::uint32_t> sleepers{0};

  void publish(std::uint32_t v, bool shared) noexcept {
    word.store(v, std::memory_order_seq_cst);
    if (sleepers.load(std::memory_order_seq_cst) != 0) futex_wake_all(word, shared);
  }
  void wake(bool shared) noexcept { futex_wake_all(word, shared); }
};

/// A lock for a few instructions that is almost never contended (a recorder's, the call queue's
/// producers'): one atomic exchange to take (a std::mutex costs two atomic read-modify-writes a
/// lock and unlock); a contended taker yields its core, so a holder preempted on a crowded
/// host gets it back.
class yield_lock {
 public:
  void lock() noexcept {
    while (held_.exchange(true, std::memory_order_acquire))
      while (held_.load(std::memory_order_relaxed)) sched_yield();
  }
  void unlock() noexcept { held_.store(false, std::memory_order_release); }

 private:
  std::atomic<bool> held_{false};
};

/// A lock held for as long as a call runs (the call queue's exec_), so a contended taker
/// sleeps: on a futex of this process (0 free, 1 held, 2 held with sleepers). Taking and letting
/// go of it uncontended is one atomic operation each, inline; std::mutex's pthread calls cost
/// ~55 instructions a pair more on every collective call.
class sleep_lock {
 public:
  void lock() noexcept {
    std::uint32_t c = 0;
    if (word_.compare_exchange_strong(c, 1, std::memory_order_acquire, std::memory_order_relaxed)) return;
    if (c != 2) c = word_.exchange(2, std::memory_order_acquire);
    while (c != 0) {
      futex_wait(word_, 2, kSleepSlice, false);
      c = word_.exchange(2, std::memory_order_acquire);
    }
  }
  bool try_lock() noexcept {
    std::uint32_t c = 0;
    return word_.compare_exchange_strong(c, 1, std::memory_order_acquire, std::memory_order_relaxed);
  }
  void unlock() noexcept {
    if (word_.exchange(0, std::memory_order_release) == 2) futex_wake_all(word_, false);
  }

 private:
  std::atomic<std::uint32_t> word_{0};
};

enum class wait_result { ready, timed_out };

/// Waits until done() holds. check() is called between sleeps and may throw (a failed peer, an
/// aborted job). Returns timed_out when `timeout` passes first.
/// Cores this process may run on.
inline int usable_cores() noexcept {
  cpu_set_t s;
  CPU_ZERO(&s);
  if (sched_getaffinity(0, sizeof s, &s) != 0) return 1;
  return CPU_COUNT(&s) > 0 ? CPU_COUNT(&s) : 1;
}

/// Spin iterations for `ranks` ranks sharing `cores` cores: none to speak of when ranks
/// outnumber cores, because then the peer being waited for is likely waiting for this core.
/// `cores` is what the whole job may run on: a rank pinned to one core (launch_processes,
/// `mpirun --bind-to core`) still shares the host with peers pinned to the others, so a
/// transport between processes passes the union of its ranks' affinity masks
/// (transport::shm does); threads of one process share its mask.
inline int spin_for(int ranks, int cores = usable_cores()) noexcept { return ranks > cores ? 8 : kSpinIterations; }

/// Told when a wait stops spinning and starts to block (yield, then sleep), and again at every
/// sleep slice while it blocks: the flight recorder times waits from the first (core/call_info.hpp:
/// timed_wait), so one that the spin ends costs nothing, and the slices are the rank's sign of
/// life on its position board (a stopped process gives none).
struct on_block {
  void (*fn)(void*) noexcept = nullptr;
  void* arg = nullptr;
  void operator()() const noexcept {
    if (fn != nullptr) fn(arg);
  }
};

/// Whether a wait on peers that are no longer live has failed. A peer publishes its leaving (or
/// its end) after its last work, so it may have done what this rank waits for just before it
/// went: its state is looked at first and `ready` again after it. The other order (`ready`, then
/// the state) blames a wait the peer finished between the two looks, and fails a call that
/// succeeded (seen once in CI's ThreadSanitizer run: "rank 1 has left the communicator while this
/// rank waited for it to take this rank's message", of a rank that had taken it and returned).
template <class Gone, class Ready>
bool gone_unready(Gone gone, Ready ready) {
  return gone() && !ready();
}

template <class Done, class Check>
wait_result wait_on(waitable& w, Done done, Check check, std::chrono::nanoseconds timeout, bool shared,
                    int spin = kSpinIterations, on_block blocked = {}) {
  for (int i = 0; i < spin; ++i) {
    if (done()) return wait_result::ready;
    cpu_relax();
  }
  if (done()) return wait_result::ready;
  blocked();
  // The deadline runs from here, through the yields: a yield that hands the core to a busy
  // process returns after that process's time slice (milliseconds), so 64 of them can outlast a
  // short timeout (CI's ASan run at d30cee6: a 300 ms timeout that reported after 600 ms, when
  // the peer had left, not that it was waited for).
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (int i = 0; i < kYieldIterations; ++i) {
    if (done()) return wait_result::ready;
    sched_yield();
    if ((i & 3) == 3 && std::chrono::steady_clock::now() >= deadline) break;
  }
  for (;;) {
    const std::uint32_t v = w.word.load(std::memory_order_seq_cst);
    if (done()) return wait_result::ready;
    check();
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) return done() ? wait_result::ready : wait_result::timed_out;
    blocked();
    w.sleepers.fetch_add(1, std::memory_order_seq_cst);
    if (!done()) futex_wait(w.word, v, std::min<std::chrono::nanoseconds>(deadline - now, kSleepSlice), shared);
    w.sleepers.fetch_sub(1, std::memory_order_seq_cst);
  }
}

}  // namespace collx::detail
