#pragma once
// The order of a communicator's calls, and the thread that runs its nonblocking ones.
//
// Every call on a communicator, blocking or not, runs in the order it was issued: a blocking call
// first runs whatever nonblocking calls are still queued before it, then itself, on the calling
// thread. A nonblocking call (async.hpp) is queued and a progress thread, started with the
// communicator's first one, runs the queue back to back while the caller computes; it sleeps
// (a futex) whenever the queue is empty, so nothing spins while no call is outstanding. One
// thread at a time runs the communicator's calls (exec_), so the transport and the
// communicator's state (sequence numbers, scratch, schedules) are never shared by two.
//
// Handing a call to a sleeping thread costs a wake-up (a futex syscall for the caller, ~28 us for
// the thread on the development VMs), so neither is on the critical path:
// - wait() on a call the thread has not started runs it (and the calls queued before it) on the
//   waiting thread, so `async(...).wait()` costs a blocking call plus the queueing;
// - a thread that has just been busy lingers (kLinger) before it sleeps for good: it looks at
//   the queue after kPoll, then twice as long, ..., asleep in between, and a call submitted
//   meanwhile wakes nobody. Only a call submitted to a thread in its long sleep pays the syscall;
// - the thread runs as SCHED_BATCH, so waking it does not preempt the caller (on the same core
//   when ranks are pinned), and it only tries to take its turn: while the caller runs calls it
//   looks again later, instead of queueing on the mutex (the caller's unlock would be a syscall).
//
// The queue is a list with one producer (the thread issuing the communicator's calls: calls on
// one communicator come from one thread at a time, as in MPI) and one consumer at a time (the
// holder of exec_), so it needs no lock: submitting is an allocation and two atomic stores.
#include <pthread.h>
#include <sched.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>

#include "../work.hpp"
#include "flight_record.hpp"
#include "wait.hpp"

namespace collx::detail {

class call_queue;

/// The queue whose calls this thread is running now (a call made from inside one runs at once).
inline thread_local const call_queue* tl_running = nullptr;
/// When the nonblocking call this thread runs now was issued (wall clock; 0: a blocking call,
/// issued as it starts): its flight record says so (flight.hpp).
inline thread_local std::int64_t tl_issued_ns = 0;

/// One call on the queue. The call itself is the derived class's (one allocation per call).
class call_task : public work_state {
 public:
  explicit call_task(call_queue* q) : q_(q), issued_ns_(wall_ns()) {}
  bool test() override { return (st_.load(std::memory_order_acquire) & kStateMask) == kDone; }
  void wait() override;

 private:
  friend class call_queue;
  virtual void invoke() = 0;
  virtual void release() noexcept = 0;  // the call's captures go as soon as it has run
  // The state, and a bit set by a thread that sleeps until it is done (notified only then).
  static constexpr int kQueued = 0, kRunning = 1, kDone = 2, kStateMask = 3, kWaiter = 4;
  call_queue* q_;  // valid until done: a communicator finishes its queue before it goes
  std::int64_t issued_ns_;
  std::atomic<int> st_{kQueued};
  std::exception_ptr err_;
  // The queue's links: the next call, and the queue's own reference while it holds this one.
  std::atomic<call_task*> next_{nullptr};
  std::shared_ptr<call_task> self_;
};

template <class F>
class call_task_of final : public call_task {
 public:
  call_task_of(call_queue* q, F&& f) : call_task(q), f_(std::move(f)) {}

 private:
  void invoke() override { (*f_)(); }
  void release() noexcept override { f_.reset(); }
  std::optional<F> f_;
};

class call_queue {
 public:
  call_queue() : stub_(std::make_shared<call_task_of<void (*)()>>(this, +[] {})) {
    head_ = tail_ = stub_.get();
  }
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
      q.run_queued();
    }
    ~turn() { tl_running = prev_; }
    turn(const turn&) = delete;
    turn& operator=(const turn&) = delete;

   private:
    const call_queue* prev_;
    std::unique_lock<std::mutex> ex_;
  };

  /// Runs f() as this communicator's calls run (holding its turn) if no call of it runs on
  /// another thread now; false, without running it, if one does.
  template <class F>
  bool run_if_idle(F&& f) {
    if (tl_running == this) {
      f();
      return true;
    }
    std::unique_lock ex(exec_, std::try_to_lock);
    if (!ex.owns_lock()) return false;
    f();
    return true;
  }

  /// When a lingering progress thread first looks at the queue again, and for how long after its
  /// last call it lingers before it sleeps until woken.
  static constexpr std::chrono::microseconds kPoll{50};
  static constexpr std::chrono::milliseconds kLinger{5};

  /// Queues f (a callable taking nothing) behind every call issued before it; the progress
  /// thread runs it.
  /// A call submitted from inside one of this communicator's calls runs at once, as a blocking
  /// call made there does (the calls queued behind the running one come after it).
  template <class F>
  std::shared_ptr<call_task> submit(F f) {
    std::shared_ptr<call_task> t = std::make_shared<call_task_of<std::decay_t<F>>>(this, std::move(f));
    if (tl_running == this) {
      run(*t);
      return t;
    }
    t->self_ = t;
    tail_->next_.store(t.get(), std::memory_order_release);
    tail_ = t.get();
    pushed_.store(pushed_.load(std::memory_order_relaxed) + 1, std::memory_order_seq_cst);
    if (!started_) {
      started_ = true;
      worker_ = std::thread([this] { loop(); });
    } else if (asleep_.load(std::memory_order_seq_cst) && asleep_.exchange(false, std::memory_order_seq_cst)) {
      // One ring per sleep: until the thread runs (it may wait a while for a core), the calls
      // submitted after this one find the flag down and make no syscall.
      bell_.fetch_add(1, std::memory_order_seq_cst);
      futex_wake_all(bell_, false);
    }
    return t;
  }

  /// Returns once t has run: runs it here (and the calls before it) when no thread has started
  /// it yet, else waits for the progress thread.
  void wait_for(call_task& t) {
    if (t.test()) return;
    if (tl_running == this || t.st_.load(std::memory_order_acquire) == call_task::kQueued) {
      const auto ex = exec_lock();  // waits while the thread runs a call
      scope s(this);
      run_queued(&t);  // under exec_ nobody else takes calls: t is queued still, or done
    }
    // The thread runs it: sleep until it is done, saying so first.
    for (int s = t.st_.load(std::memory_order_acquire); (s & call_task::kStateMask) != call_task::kDone;
         s = t.st_.load(std::memory_order_acquire)) {
      if (!(s & call_task::kWaiter) && !t.st_.compare_exchange_weak(s, s | call_task::kWaiter, std::memory_order_acq_rel))
        continue;
      t.st_.wait(s | call_task::kWaiter, std::memory_order_acquire);
    }
  }

  /// Runs what is queued and stops the progress thread (the communicator is going).
  void shutdown() noexcept {
    stop_.store(true, std::memory_order_seq_cst);
    bell_.fetch_add(1, std::memory_order_seq_cst);
    futex_wake_all(bell_, false);
    if (worker_.joinable() && worker_.get_id() != std::this_thread::get_id()) worker_.join();
    // Without a thread (it could not start), or called from it: run the rest here.
    const auto ex = exec_lock();
    scope s(this);
    run_queued();
    if (head_ != stub_.get()) {  // the last call taken: the queue's reference goes
      head_->self_.reset();
      head_ = tail_ = stub_.get();
    }
  }

 private:
  struct scope {
    const call_queue* prev;
    explicit scope(const call_queue* q) : prev(tl_running) { tl_running = q; }
    ~scope() { tl_running = prev; }
  };

  /// The next call, under exec_. The call last taken stays the list's head, and the queue's
  /// (the producer may be linking behind it), until the next one is taken: the pointer is good
  /// until then.
  call_task* pop() {
    if (!pending()) return nullptr;
    call_task* n = head_->next_.load(std::memory_order_acquire);
    if (n == nullptr) return nullptr;
    call_task* old = head_;
    head_ = n;
    if (old != stub_.get()) old->self_.reset();
    popped_.store(popped_.load(std::memory_order_relaxed) + 1, std::memory_order_release);
    return n;
  }
  /// Calls queued and not yet taken (any thread may ask).
  bool pending() const noexcept {
    return pushed_.load(std::memory_order_seq_cst) != popped_.load(std::memory_order_seq_cst);
  }

  /// exec_, unless this thread holds it already (it is running one of this queue's calls).
  std::unique_lock<std::mutex> exec_lock() {
    return tl_running == this ? std::unique_lock<std::mutex>() : std::unique_lock<std::mutex>(exec_);
  }
  /// Runs the queued calls here, under exec_: all of them, or until `until` has run.
  void run_queued(call_task* until = nullptr) {
    while (until == nullptr || !until->test()) {
      call_task* n = pop();
      if (n == nullptr) break;
      run(*n);
    }
  }

  void run(call_task& t) noexcept {
    t.st_.store(call_task::kRunning, std::memory_order_relaxed);  // nobody waits on a queued call
    const std::int64_t outer = tl_issued_ns;
    tl_issued_ns = t.issued_ns_;
    try {
      t.invoke();
    } catch (...) {
      t.err_ = std::current_exception();
    }
    tl_issued_ns = outer;
    t.release();
    if (t.st_.exchange(call_task::kDone, std::memory_order_acq_rel) & call_task::kWaiter) t.st_.notify_all();
  }

  void loop() {
    // SCHED_BATCH: waking this thread does not preempt the thread that woke it (the rank's, on
    // the same core when ranks are pinned), which goes on to run the call itself if it waits.
    sched_param none{};
    pthread_setschedparam(pthread_self(), SCHED_BATCH, &none);
    using clock = std::chrono::steady_clock;
    auto busy_at = clock::now();
    for (;;) {
      auto poll = std::chrono::nanoseconds(kPoll);
      while (!pending() && !stop_.load(std::memory_order_seq_cst)) {
        const std::uint32_t v = bell_.load(std::memory_order_seq_cst);
        if (clock::now() - busy_at < kLinger) {
          futex_wait(bell_, v, poll, false);
          poll *= 2;  // found nothing: the caller runs its calls itself; look less often
          continue;
        }
        // Sleep until woken: say so, then look once more (a submit that missed the flag was
        // seen here; one that saw it rings the bell, which ends the wait).
        asleep_.store(true, std::memory_order_seq_cst);
        if (!pending() && !stop_.load(std::memory_order_seq_cst))
          futex_wait(bell_, v, std::chrono::seconds(1), false);
        asleep_.store(false, std::memory_order_seq_cst);
        busy_at = clock::now();
        poll = kPoll;
      }
      if (!pending()) return;  // stopping, and nothing left
      // The caller may be running calls (a blocking one, or a wait() that took the calls up to
      // its own): look again later rather than queue on the mutex.
      std::unique_lock ex(exec_, std::try_to_lock);
      if (!ex.owns_lock()) {
        futex_wait(bell_, bell_.load(std::memory_order_seq_cst), kPoll, false);
        continue;
      }
      scope s(this);
      run_queued();
      busy_at = clock::now();
    }
  }

  std::shared_ptr<call_task> stub_;  // the list's first head
  call_task* head_;                  // the call last taken (or the stub): the consumer's end, under exec_
  call_task* tail_;                  // the call last queued: the producer's end
  std::atomic<std::uint64_t> pushed_{0}, popped_{0};  // calls queued and taken, ever (one writer each)
  std::atomic<std::uint32_t> bell_{0};  // bumped (and woken) to wake the thread
  std::atomic<bool> asleep_{false};     // the thread sleeps until woken (not lingering)
  std::atomic<bool> stop_{false};
  bool started_ = false;  // the producer started the thread
  std::mutex exec_;       // held by the thread running this communicator's calls
  std::thread worker_;
};

inline void call_task::wait() {
  if (!test()) q_->wait_for(*this);
  if (err_) std::rethrow_exception(err_);
}

}  // namespace collx::detail
