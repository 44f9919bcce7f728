#pragma once
// The order of a communicator's calls, and the thread that runs its nonblocking ones.
//
// Every call on a communicator, blocking or not, runs in the order it was issued: a blocking call
// first runs whatever nonblocking calls are still queued before it, then itself, on the calling
// thread. A nonblocking call (async.hpp) is queued and a progress thread, started with the
// communicator's first one, runs the queue back to back while the caller computes; it sleeps on
// a condition variable whenever the queue is empty, so nothing spins while no call is
// outstanding. One thread at a time runs the communicator's calls (exec_), so the transport and
// the communicator's state (sequence numbers, scratch, schedules) are never shared by two.
//
// The hand-off costs a wake-up (~28 us on the development VMs) only when the caller does not
// wait at once: wait() on a call the thread has not started runs it (and the calls queued before
// it) on the waiting thread, so `async(...).wait()` costs a blocking call plus the queueing.
#include <atomic>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>

#include "../work.hpp"

namespace collx::detail {

class call_queue;

/// The queue whose calls this thread is running now (a call made from inside one runs at once).
inline thread_local const call_queue* tl_running = nullptr;

class call_task final : public work_state {
 public:
  call_task(call_queue* q, std::function<void()> f) : q_(q), fn_(std::move(f)) {}
  bool test() override { return st_.load(std::memory_order_acquire) == kDone; }
  void wait() override;

 private:
  friend class call_queue;
  static constexpr int kQueued = 0, kRunning = 1, kDone = 2;
  call_queue* q_;  // valid until done: a communicator finishes its queue before it goes
  std::function<void()> fn_;
  std::atomic<int> st_{kQueued};
  std::exception_ptr err_;
};

class call_queue {
 public:
  call_queue() = default;
  call_queue(const call_queue&) = delete;
  call_queue& operator=(const call_queue&) = delete;
  ~call_queue() { shutdown(); }

  /// A blocking call's turn: while it lives, this thread runs the communicator's calls, and
  /// every call queued before it has run. Inside a call already (a call made by a call), it is
  /// nothing.
  class turn {
   public:
    explicit turn(call_queue& q) : prev_(tl_running) {
      if (tl_running == &q) return;
      ex_ = std::unique_lock(q.exec_);
      tl_running = &q;
      while (auto t = q.pop()) q.run(*t);
    }
    ~turn() { tl_running = prev_; }
    turn(const turn&) = delete;
    turn& operator=(const turn&) = delete;

   private:
    const call_queue* prev_;
    std::unique_lock<std::mutex> ex_;
  };

  /// Queues f behind every call issued before it; the progress thread runs it.
  std::shared_ptr<call_task> submit(std::function<void()> f) {
    auto t = std::make_shared<call_task>(this, std::move(f));
    {
      std::lock_guard lk(mu_);
      q_.push_back(t);
      if (!worker_.joinable()) worker_ = std::thread([this] { loop(); });
    }
    cv_.notify_one();
    return t;
  }

  /// Returns once t has run: runs it here (and the calls before it) when no thread has started
  /// it yet, else waits for the progress thread.
  void wait_for(call_task& t) {
    if (t.st_.load(std::memory_order_acquire) == call_task::kDone) return;
    if (tl_running == this || t.st_.load(std::memory_order_acquire) == call_task::kQueued) {
      std::unique_lock<std::mutex> ex;
      if (tl_running != this) ex = std::unique_lock(exec_);  // waits while the thread runs a call
      scope s(this);
      // Under exec_ nobody else takes calls: t is queued still, or done.
      while (t.st_.load(std::memory_order_acquire) != call_task::kDone) {
        auto n = pop();
        if (!n) break;
        run(*n);
      }
    }
    for (int s = t.st_.load(std::memory_order_acquire); s != call_task::kDone; s = t.st_.load(std::memory_order_acquire))
      t.st_.wait(s, std::memory_order_acquire);
  }

  /// Runs what is queued and stops the progress thread (the communicator is going).
  void shutdown() noexcept {
    {
      std::lock_guard lk(mu_);
      stop_ = true;
    }
    cv_.notify_one();
    if (worker_.joinable() && worker_.get_id() != std::this_thread::get_id()) worker_.join();
    // Without a thread (it could not start), or called from it: run the rest here.
    std::unique_lock ex(exec_, std::defer_lock);
    if (tl_running != this) ex.lock();
    scope s(this);
    while (auto t = pop()) run(*t);
  }

  /// Calls queued or running (for tests and diagnostics).
  std::size_t outstanding() {
    std::lock_guard lk(mu_);
    return q_.size() + (busy_ ? 1 : 0);
  }

 private:
  struct scope {
    const call_queue* prev;
    explicit scope(const call_queue* q) : prev(tl_running) { tl_running = q; }
    ~scope() { tl_running = prev; }
  };

  std::shared_ptr<call_task> pop() {
    std::lock_guard lk(mu_);
    if (q_.empty()) return nullptr;
    auto t = std::move(q_.front());
    q_.pop_front();
    busy_ = true;
    return t;
  }

  void run(call_task& t) noexcept {
    t.st_.store(call_task::kRunning, std::memory_order_relaxed);
    try {
      t.fn_();
    } catch (...) {
      t.err_ = std::current_exception();
    }
    t.fn_ = nullptr;  // the call's captures go now, not with the last handle
    {
      std::lock_guard lk(mu_);
      busy_ = false;
    }
    t.st_.store(call_task::kDone, std::memory_order_release);
    t.st_.notify_all();
  }

  void loop() {
    for (;;) {
      {
        std::unique_lock lk(mu_);
        cv_.wait(lk, [&] { return stop_ || !q_.empty(); });
        if (q_.empty()) return;  // stopping, and nothing left
      }
      std::unique_lock ex(exec_);
      scope s(this);
      while (auto t = pop()) run(*t);
    }
  }

  std::mutex mu_;  // q_, stop_, busy_, worker_
  std::condition_variable cv_;
  std::deque<std::shared_ptr<call_task>> q_;
  bool stop_ = false;
  bool busy_ = false;
  std::mutex exec_;  // held by the thread running this communicator's calls
  std::thread worker_;
};

inline void call_task::wait() {
  if (st_.load(std::memory_order_acquire) != kDone) q_->wait_for(*this);
  if (err_) std::rethrow_exception(err_);
}

}  // namespace collx::detail
