#pragma once
// What the host does with a job block (layout.hpp), wherever it lives (cuda's thread-ranks:
// mapped host memory of one process; process-ranks: a memfd every rank maps): fail a rank (the
// first failure is the cause, and the abort flag ends every kernel's and host's wait), read who
// failed and why, and count the launches that may still read a rank's memory.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <thread>

#include "../core/wait.hpp"
#include "../core/call_info.hpp"
#include "layout.hpp"

namespace collx::device {

/// The host's handle on a job block of n ranks at `base` (host address).
class job_view {
 public:
  job_view() = default;
  job_view(void* base, int n) noexcept : base_(base), n_(n) {}

  /// Sets up a fresh block (zeroed memory).
  void init() noexcept {
    job_header* h = job_layout::header(base_);
    h->n = n_;
    h->first_failed = -1;
    h->abort = 0;
    std::atomic_ref<std::uint64_t>(h->magic).store(kJobMagic, std::memory_order_seq_cst);
  }

  int size() const noexcept { return n_; }
  void* base() const noexcept { return base_; }
  job_rank& rank(int r) const noexcept { return *job_layout::rank(base_, r); }

  /// Marks rank r failed, unless it failed or left before (the first failure is the cause),
  /// raises the abort flag and rings every rank's doorbell.
  void fail(int r, const std::string& why) const noexcept {
    job_rank& j = rank(r);
    std::int32_t live = 0;
    if (std::atomic_ref<std::int32_t>(j.failed).compare_exchange_strong(live, 1, std::memory_order_seq_cst)) {
      std::snprintf(j.why, sizeof j.why, "%s", detail::head_and_tail(why.empty() ? std::string("failed") : why, sizeof j.why - 1).c_str());
      std::atomic_thread_fence(std::memory_order_seq_cst);
      std::int32_t none = -1;
      std::atomic_ref<std::int32_t>(job_layout::header(base_)->first_failed).compare_exchange_strong(none, r, std::memory_order_seq_cst);
    }
    std::atomic_ref<std::int32_t>(job_layout::header(base_)->abort).store(1, std::memory_order_seq_cst);
    for (int q = 0; q < n_; ++q) doorbell(q).wake(true);
  }
  /// Rank r is done with the group without a failure (its calls are over).
  void leave(int r) const noexcept {
    std::int32_t live = 0;
    std::atomic_ref<std::int32_t>(rank(r).failed).compare_exchange_strong(live, 2, std::memory_order_seq_cst);
    for (int q = 0; q < n_; ++q) doorbell(q).wake(true);
  }
  bool aborted() const noexcept { return std::atomic_ref<std::int32_t>(job_layout::header(base_)->abort).load(std::memory_order_seq_cst) != 0; }
  int first_failed() const noexcept {
    return std::atomic_ref<std::int32_t>(job_layout::header(base_)->first_failed).load(std::memory_order_seq_cst);
  }
  bool failed(int r) const noexcept { return state(r) == 1; }
  bool left(int r) const noexcept { return state(r) == 2; }
  std::string why(int r) const {
    const job_rank& j = rank(r);
    const std::string w(j.why, strnlen(j.why, sizeof j.why));
    return w.empty() ? std::string("failed") : w;
  }

  /// Launches of rank r's that have not ended (the host raises `launched` before it launches,
  /// the kernel's last block raises `finished`).
  bool running(int r) const noexcept {
    job_rank& j = rank(r);
    return std::atomic_ref<std::uint64_t>(j.launched).load(std::memory_order_seq_cst) >
           std::atomic_ref<std::uint64_t>(j.finished).load(std::memory_order_seq_cst);
  }
  /// Waits until no rank but r has a launch running, for at most `limit`; `skip(q)` says a rank
  /// not to wait for (its process is gone).
  template <class Skip>
  bool wait_idle_but(int r, std::chrono::nanoseconds limit, Skip skip) const noexcept {
    const auto until = std::chrono::steady_clock::now() + limit;
    for (;;) {
      bool busy = false;
      for (int q = 0; q < n_ && !busy; ++q) busy = q != r && running(q) && !skip(q);
      if (!busy) return true;
      if (std::chrono::steady_clock::now() >= until) return false;
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  /// Rank r's doorbell (host waiters sleep on it).
  detail::waitable& doorbell(int r) const noexcept { return *reinterpret_cast<detail::waitable*>(&rank(r).doorbell); }

 private:
  std::int32_t state(int r) const noexcept { return std::atomic_ref<std::int32_t>(rank(r).failed).load(std::memory_order_seq_cst); }
  void* base_ = nullptr;
  int n_ = 0;
};

}  // namespace collx::device
