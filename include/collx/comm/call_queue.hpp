#pragma once
// The order of a communicator's calls, the thread that runs its nonblocking ones, and where
// their continuations run.
//
// Every call on a communicator, blocking or not, runs in the order it was issued: a blocking call
// first runs whatever nonblocking calls are still queued before it, then itself, on the calling
// thread. A nonblocking call (features/async.hpp) is queued and a progress thread, started with the
// communicator's first one, runs the queue back to back while the caller computes; it sleeps
// (a futex) whenever the queue is empty, so nothing spins while no call is outstanding. One
// thread at a time runs the communicator's calls (exec_), so the transport and the
// communicator's state (sequence numbers, scratch, schedules) are never shared by two.
//
// Calls may be issued from any thread (the torch backend's come from Python's threads, from
// autograd's and from the callbacks of futures): the queue is a list with many producers, who
// take turns for its two stores (a yield lock: one atomic exchange, almost never contended), and
// one consumer at a time (the holder of exec_). Submitting is an allocation and a handful of
// atomic operations. The list's order is its counter's, so "every call queued before this one"
// is a number, and a blocking call runs exactly those first.
//
// Continuations (work::then) and the call's own captures are user code: a Python callback that
// needs the GIL, a tensor whose last reference needs it to be freed. None of it runs under exec_:
// a thread holding the GIL that waits for this communicator would otherwise wait for a thread
// that waits for the GIL (the deadlock of issue 33). The thread that completed the call
// releases exec_ and runs the continuations with the queue's gate closed: the next call does not
// start until they have returned, and a call a continuation makes on this communicator runs at
// once, on that thread. So a call made from a continuation comes right after the call it
// continues, on every rank, however the ranks' timing differs (a future's callback that
// all-reduces, as PowerSGD's do, while the main thread issues the next bucket's all-reduce: left
// to the clock, the two could run in different orders on different ranks). Then the gate opens,
// the call's captures go, the thread takes exec_ back, and only then is the call done (the
// thread that waited for it may destroy the communicator at once); another thread may have
// run the next call meanwhile, and closed the gate for that one's continuations: a thread that
// takes exec_ back never runs calls through another's gate (run_queued stops there).
// The gate is an order, not a lock: the progress thread and every wait of collx's wait for it
// with no lock held, and a wait on it ends at the communicator's deadline with an error that
// says the calls wait for a continuation (then an earlier call's callbacks, not collx, are where
// this rank is stuck; the flight recorder's position says so too). A continuation must not wait
// for a call issued after its own by another thread through anything but collx (a torch
// future's wait()): that call cannot start before it returns. One that waits through collx
// (work::wait) runs the calls queued up to it itself. A call run from inside another call's
// body (an async::run body that makes or waits for calls) is nested in it: its continuations
// run there, exec_ held, since the outer call is under way.
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
// A call with no continuation whose captures are trivially destructible (every collx::async
// call's: spans, ops, policies) opens no gate and never leaves exec_.
#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "../core/error.hpp"
#include "../core/work.hpp"
#include "../core/flight_record.hpp"
#include "../core/wait.hpp"

namespace collx::detail {

class call_queue;
class call_task;

/// The queue whose calls this thread is running now, holding its exec_ (a call made from inside
/// one runs at once).
inline thread_local const call_queue* tl_running = nullptr;
/// The queue whose call's continuations this thread runs now, holding its gate (a call made
/// from inside one runs at once too), and that call.
inline thread_local const call_queue* tl_settling = nullptr;
inline thread_local const call_task* tl_settling_task = nullptr;
/// The queued call this thread runs now (a continuation added to a finished call from inside
/// it runs when it completes, not under exec_).
inline thread_local call_task* tl_current_task = nullptr;
/// The queue whose call's body this thread is in (a queued call's, or a blocking call's after
/// its turn began): a call run from inside one is nested in it, and settles without letting
/// exec_ go (the outer call is under way).
inline thread_local const call_queue* tl_in_body = nullptr;
/// When the nonblocking call this thread runs now was issued (wall clock; 0: a blocking call,
/// issued as it starts): its flight record says so (comm/flight.hpp).
inline thread_local std::int64_t tl_issued_ns = 0;

/// What a queue tells its communicator (set by comm/communicator.hpp): where it is, for errors, and
/// when continuations run, for the flight recorder's position.
struct queue_observer {
  void* ctx = nullptr;
  std::string (*where)(void* ctx) = nullptr;                  // "communicator tp: rank 0 (job rank 2)"
  void (*in_continuation)(void* ctx, bool in) noexcept = nullptr;
};

/// One call on the queue. The call itself is the derived class's (one allocation per call).
class call_task : public work_state {
 public:
  explicit call_task(call_queue* q) : q_(q), issued_ns_(wall_ns()) {}
  bool test() override { return (st_.load(std::memory_order_acquire) & kStateMask) == kDone; }
  void wait() override;
  void then(continuation f) override;

 private:
  /// Adds f to the call's continuations; false when they were taken for good (f is left).
  bool add(continuation& f);
  friend class call_queue;
  virtual void invoke() = 0;
  virtual void release() noexcept = 0;  // the call's captures go as soon as it has run
  virtual bool plain() const noexcept = 0;  // captures whose destruction runs no user code
  // The state, and a bit set by a thread that sleeps until it is done (notified only then).
  // settling: it has run; its continuations run now (the queue's gate is closed).
  static constexpr std::uint32_t kQueued = 0, kRunning = 1, kSettling = 2, kDone = 3, kStateMask = 3, kWaiter = 4;
  call_queue* q_;  // valid until done: a communicator finishes its queue before it goes
  std::int64_t issued_ns_;
  std::atomic<std::uint32_t> st_{kQueued};
  std::exception_ptr err_;
  // Continuations: added by any thread, taken by the one settling the call. cont_: kHasConts
  // once one was added (the call then settles outside exec_), kClosed once they were taken for
  // good (one added later runs at once); the call that has none closes it with one
  // compare-exchange, without the lock. The lock guards the list and is never held while one runs.
  static constexpr int kHasConts = 1, kClosed = 2;
  std::atomic<int> cont_{0};
  std::mutex cont_mu_;
  std::vector<continuation> conts_;
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
  bool plain() const noexcept override { return std::is_trivially_destructible_v<F>; }
  std::optional<F> f_;
};

class call_queue {
 public:
  call_queue() : stub_(std::make_shared<call_task_of<void (*)()>>(this, +[] {})) { head_ = tail_ = stub_.get(); }
  call_queue(const call_queue&) = delete;
  call_queue& operator=(const call_queue&) = delete;
  ~call_queue() { shutdown(); }

  /// How long a wait on the gate may take (the communicator's options::timeout), and who to
  /// tell what. Set once, before the first call.
  void configure(std::chrono::nanoseconds timeout, queue_observer obs) {
    timeout_ = timeout;
    obs_ = obs;
  }

  /// Whether this thread is inside this queue now: running one of its calls, a call's body, or
  /// a call's continuations (a communicator must not be destroyed from there: comm/communicator.hpp
  /// hands its destruction to another thread).
  bool inside() const noexcept { return tl_running == this || tl_settling == this || tl_in_body == this; }
  /// Whether a call submitted from this thread now runs at once, on it (inside a call or a
  /// continuation of this queue's), rather than being queued.
  bool runs_at_once() const noexcept { return tl_running == this || tl_settling == this; }

  /// A blocking call's turn: while it lives, this thread runs the communicator's calls, and
  /// every call this thread queued before it has run. Inside a call already (a call made by a
  /// call), it is nothing; inside a continuation of this queue's, it takes exec_ and runs nothing
  /// queued (a call made by a continuation comes right after the call it continues).
  class turn {
   public:
    explicit turn(call_queue& q, const char* what = "a call") : prev_(tl_running), prev_body_(tl_in_body) {
      if (tl_running == &q) return;
      if (tl_settling == &q) {  // (a continuation's call: the gate is its own)
        ex_ = std::unique_lock(q.exec_);
        gate_call_ = &q;
        q.gate_calls_.fetch_add(1, std::memory_order_relaxed);
      } else {
        ex_ = q.take_turn(what, nullptr, q.pushed_.load(std::memory_order_acquire));
      }
      tl_running = &q;
      tl_in_body = &q;
    }
    ~turn() {
      tl_running = prev_;
      tl_in_body = prev_body_;
      if (gate_call_ != nullptr) gate_call_->gate_calls_.fetch_sub(1, std::memory_order_relaxed);
    }
    turn(const turn&) = delete;
    turn& operator=(const turn&) = delete;

   private:
    const call_queue* prev_;
    const call_queue* prev_body_;
    call_queue* gate_call_ = nullptr;
    std::unique_lock<sleep_lock> ex_;
  };

  /// Runs f() as this communicator's calls run (holding its turn) if no call of it runs on
  /// another thread now; false, without running it, if one does. (A continuation may be
  /// running: f is not a call, so the gate does not hold it back.)
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

  /// Queues f (a callable taking nothing) behind every call issued before it, with `then` as its
  /// first continuation when given (added before any thread can run the call); the progress
  /// thread runs it. Any thread may submit. A call submitted from inside one of this
  /// communicator's calls, or from a continuation of one, runs at once, as a blocking call made
  /// there does (the calls queued behind the running one come after it).
  template <class F>
  std::shared_ptr<call_task> submit(F f, continuation then = {}) {
    std::shared_ptr<call_task> t = std::make_shared<call_task_of<std::decay_t<F>>>(this, std::move(f));
    if (then) (void)t->add(then);
    if (tl_running == this) {
      run(*t);
      return t;
    }
    if (tl_settling == this) {
      std::unique_lock ex(exec_);
      scope s(this);
      gate_calls_.fetch_add(1, std::memory_order_relaxed);
      run(*t);
      gate_calls_.fetch_sub(1, std::memory_order_relaxed);
      return t;
    }
    t->self_ = t;
    {
      // Producers take turns for the two stores that queue a call: the list's order is the
      // counter's, so a consumer that sees the counter also sees every call before it linked.
      std::lock_guard g(push_);
      tail_->next_.store(t.get(), std::memory_order_release);
      tail_ = t.get();
      pushed_.store(pushed_.load(std::memory_order_relaxed) + 1, std::memory_order_seq_cst);
    }
    if (!started_.load(std::memory_order_acquire) && !started_.exchange(true, std::memory_order_acq_rel)) {
      std::lock_guard g(start_mu_);
      worker_ = std::thread([this] { loop(); });
    } else if (asleep_.load(std::memory_order_seq_cst) && asleep_.exchange(false, std::memory_order_seq_cst)) {
      // One ring per sleep: until the thread runs (it may wait a while for a core), the calls
      // submitted after this one find the flag down and make no syscall.
      bell_.fetch_add(1, std::memory_order_seq_cst);
      futex_wake_all(bell_, false);
    }
    return t;
  }

  /// Returns once t is done: runs it here (and the calls before it) when no thread has started
  /// it yet, else waits for the thread that runs it.
  void wait_for(call_task& t) {
    if (t.test()) return;
    if (&t == tl_settling_task) return;  // its own continuation: the call itself has completed
    if (&t == tl_current_task)
      throw error(errc::invalid_argument, "a nonblocking call waits for its own work from inside itself (it would wait for ever)");
    if (tl_running == this || tl_settling == this) {
      // Inside a call or a continuation of this queue: this thread has the turn. The calls
      // queued up to t run here, in order (nobody else may run them now).
      const auto ex = tl_running == this ? std::unique_lock<sleep_lock>() : std::unique_lock<sleep_lock>(exec_);
      scope s(this);
      (void)run_queued(&t);
      return;
    }
    // The calls up to t run here, unless a thread runs them now; a thread that runs one of them
    // meanwhile, or settles it, may be left to run t.
    if ((t.st_.load(std::memory_order_acquire) & call_task::kStateMask) == call_task::kQueued) (void)take_turn("wait", &t);
    // Another thread runs it: sleep until it is done, saying so first. Only a closed gate has a
    // deadline here: a call's own waits have theirs.
    std::int64_t waiting = 0;
    for (std::uint32_t s = t.st_.load(std::memory_order_acquire); (s & call_task::kStateMask) != call_task::kDone;
         s = t.st_.load(std::memory_order_acquire)) {
      if (!(s & call_task::kWaiter) && !t.st_.compare_exchange_weak(s, s | call_task::kWaiter, std::memory_order_acq_rel))
        continue;
      check_gate("wait", waiting);
      futex_wait(t.st_, std::uint32_t(s | call_task::kWaiter), kSleepSlice,
                 false);
    }
  }

  /// Runs what is queued and stops the progress thread (the communicator is going). Called from
  /// outside the queue (comm/communicator.hpp sees to it): nothing of the queue is on this thread's
  /// stack.
  void shutdown() noexcept {
    stop_.store(true, std::memory_order_seq_cst);
    bell_.fetch_add(1, std::memory_order_seq_cst);
    futex_wake_all(bell_, false);
    {
      std::lock_guard g(start_mu_);
      if (worker_.joinable()) {
        if (worker_.get_id() != std::this_thread::get_id()) worker_.join();
        else worker_.detach();  // (comm/communicator.hpp never lets it come to this)
      }
    }
    // Without a thread (it could not start), or called from it: run the rest here, waiting out
    // a gate (a continuation on another thread may make a call: it needs exec_) until the
    // deadline; what is still queued then is dropped.
    std::unique_lock<sleep_lock> ex;
    if (tl_running != this) ex = std::unique_lock(exec_);
    const std::int64_t give_up = wall_ns() + timeout_.count();
    while (pending()) {
      const std::uint32_t v = gate_word_.load(std::memory_order_seq_cst);
      if (gate_.load(std::memory_order_seq_cst) && tl_settling != this) {
        if (wall_ns() > give_up) break;
        if (ex.owns_lock()) ex.unlock();
        futex_wait(gate_word_, v, kSleepSlice, false);
        if (tl_running != this) ex.lock();
        continue;
      }
      scope s(this);
      (void)run_queued();
    }
    std::lock_guard g(push_);
    for (call_task* n = head_; n != nullptr;) {  // the last call taken, and any dropped: the queue's references go
      call_task* next = n->next_.load(std::memory_order_acquire);
      if (n != stub_.get()) n->self_.reset();  // (n may be gone now: next was read first)
      n = next;
    }
    stub_->next_.store(nullptr, std::memory_order_relaxed);
    head_ = tail_ = stub_.get();
    popped_.store(pushed_.load(std::memory_order_relaxed), std::memory_order_relaxed);
  }

 private:
  friend class call_task;

  struct scope {
    const call_queue* prev;
    explicit scope(const call_queue* q) : prev(tl_running) { tl_running = q; }
    ~scope() { tl_running = prev; }
  };

  /// exec_, once the gate is open, with the calls queued up to `until` (up to the `upto`-th
  /// queued, when null) run here: taken by a thread that is to run calls (a blocking call's
  /// turn, a wait that runs its own call). A closed gate is waited out with no lock held, until
  /// the deadline; so is one that another thread closes while this one settles a call it ran
  /// (its exec_ let go).
  std::unique_lock<sleep_lock> take_turn(const char* what, call_task* until = nullptr, std::uint64_t upto = 0) {
    std::unique_lock ex(exec_);
    std::int64_t waiting = 0;
    for (;;) {
      const std::uint32_t v = gate_word_.load(std::memory_order_seq_cst);
      if (!gate_.load(std::memory_order_seq_cst)) {
        scope s(this);
        if (run_queued(until, upto) != ran::gated) return ex;
        continue;
      }
      ex.unlock();
      check_gate(what, waiting);
      gate_sleepers_.fetch_add(1, std::memory_order_seq_cst);
      futex_wait(gate_word_, v, kSleepSlice, false);
      gate_sleepers_.fetch_sub(1, std::memory_order_seq_cst);
      ex.lock();
    }
  }

  /// Throws when the gate has kept this waiter (waiting since `waiting`, wall_ns, 0: from now)
  /// for longer than the deadline. A continuation that is in a call of its own (the call has
  /// deadlines of its own) does not count.
  void check_gate(const char* what, std::int64_t& waiting) const {
    if (!gate_.load(std::memory_order_seq_cst)) return;
    const std::int64_t now = wall_ns();
    if (waiting == 0 || gate_calls_.load(std::memory_order_relaxed) != 0) waiting = now;
    const std::int64_t since = std::max(gate_since_.load(std::memory_order_acquire), waiting);
    if (now - since <= timeout_.count()) return;
    char secs[32];
    std::snprintf(secs, sizeof secs, "%.3g s", double(now - since) * 1e-9);
    throw error(errc::timeout,
                std::string(what) + (obs_.where ? " on " + obs_.where(obs_.ctx) : std::string()) + ": the continuations of an earlier call (callbacks on its work or future: user code, Python's under torch) have not returned after " +
                    secs + ", and the calls after it wait for them (a continuation that waits for a later call by other means than collx never returns)");
  }

  /// The next call, under exec_. The call last taken stays the list's head, and the queue's
  /// (a producer may be linking behind it), until the next one is taken: the pointer is good
  /// until then.
  call_task* pop() {
    if (!pending()) return nullptr;
    call_task* n = head_->next_.load(std::memory_order_acquire);  // (linked before the counter moved)
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

  /// How run_queued() stopped: every call it was to run has run, or at a gate another thread
  /// closed while this one had let exec_ go to settle a call (the calls after it wait for that
  /// one's continuations).
  enum class ran { all, gated };
  /// Runs the queued calls here, under exec_: until `until` is done; else the first `upto` ever
  /// queued (0: all).
  ran run_queued(call_task* until = nullptr, std::uint64_t upto = 0) {
    for (;;) {
      if (until != nullptr ? until->test() : upto != 0 && popped_.load(std::memory_order_relaxed) >= upto) return ran::all;
      if (tl_settling != this && gate_.load(std::memory_order_seq_cst)) return ran::gated;
      call_task* n = pop();
      if (n == nullptr) return ran::all;
      const std::shared_ptr<call_task> keep = n->self_;  // a call after it, taken while it runs, drops the queue's reference
      run(*n);
    }
  }

  void run(call_task& t) noexcept {
    t.st_.fetch_or(call_task::kRunning, std::memory_order_relaxed);  // (keeps a waiter's bit)
    const std::int64_t outer = tl_issued_ns;
    tl_issued_ns = t.issued_ns_;
    call_task* outer_task = std::exchange(tl_current_task, &t);
    const call_queue* outer_body = std::exchange(tl_in_body, this);
    try {
      t.invoke();
    } catch (...) {
      t.err_ = std::current_exception();
    }
    tl_in_body = outer_body;
    tl_current_task = outer_task;
    tl_issued_ns = outer;
    int c = 0;  // none added: closed now (one added from now on runs at once)
    const bool conts = !t.cont_.compare_exchange_strong(c, call_task::kClosed, std::memory_order_acq_rel);
    if (!conts && t.plain()) {  // every collx::async call: nothing of the user's to run
      t.release();
      done(t);
      return;
    }
    if (outer_body == this) {
      // Nested in a call under way on this thread (an async::run body that makes or waits for
      // calls): exec_ stays held, so no other thread runs a call in the middle of that one.
      const call_task* prev_task = std::exchange(tl_settling_task, &t);
      run_continuations(t);
      tl_settling_task = prev_task;
      t.release();
      done(t);
      return;
    }
    settle(t, conts);
  }

  /// t's continuations, until none is left; then closed for good (one added later runs at once).
  void run_continuations(call_task& t) noexcept {
    for (;;) {
      std::vector<continuation> fs;
      {
        std::lock_guard g(t.cont_mu_);
        if (t.conts_.empty()) {
          t.cont_.store(call_task::kHasConts | call_task::kClosed, std::memory_order_release);
          return;
        }
        fs.swap(t.conts_);
      }
      for (auto& f : fs) run_continuation(f, t.err_);
    }
  }

  /// The call is done: its waiters wake.
  static void done(call_task& t) noexcept {
    if (t.st_.exchange(call_task::kDone, std::memory_order_acq_rel) & call_task::kWaiter)
      futex_wake_all(t.st_, false);
  }

  /// What follows a call that has continuations or captures of the user's, with exec_ released
  /// (this thread holds it on entry and on return): the continuations run with the gate closed;
  /// the gate opens and the captures go (their destructors may wait for what the thread making
  /// the next call holds: the GIL); then exec_ is taken back and the call is done. Done under
  /// exec_, so that once a waiter of the call has gone on (and may destroy the communicator),
  /// this thread touches the queue only to let exec_ go, which the destruction waits for.
  void settle(call_task& t, bool conts) noexcept {
    const call_queue* prev_running = std::exchange(tl_running, nullptr);
    if (conts) {
      std::uint32_t s = t.st_.load(std::memory_order_relaxed);
      while (!t.st_.compare_exchange_weak(s, (s & call_task::kWaiter) | call_task::kSettling, std::memory_order_acq_rel)) {
      }
      const bool opened = tl_settling != this;  // (a call made by a continuation keeps the outer gate)
      if (opened) {
        gate_since_.store(wall_ns(), std::memory_order_release);
        gate_.store(true, std::memory_order_seq_cst);
      }
      const call_queue* prev_settling = std::exchange(tl_settling, this);
      const call_task* prev_task = std::exchange(tl_settling_task, &t);
      exec_.unlock();
      if (opened && obs_.in_continuation) obs_.in_continuation(obs_.ctx, true);
      run_continuations(t);
      if (opened && obs_.in_continuation) obs_.in_continuation(obs_.ctx, false);
      tl_settling_task = prev_task;
      tl_settling = prev_settling;
      if (opened) {
        gate_.store(false, std::memory_order_seq_cst);
        gate_since_.store(0, std::memory_order_relaxed);
        gate_word_.fetch_add(1, std::memory_order_seq_cst);
        if (gate_sleepers_.load(std::memory_order_seq_cst) != 0) futex_wake_all(gate_word_, false);
      }
    } else {
      exec_.unlock();
    }
    t.release();
    exec_.lock();
    tl_running = prev_running;
    done(t);
  }

  static void run_continuation(continuation& f, const std::exception_ptr& err) noexcept {
    try {
      f(err);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "collx: a continuation threw (ignored): %s\n", e.what());
    } catch (...) {
      std::fprintf(stderr, "collx: a continuation threw (ignored)\n");
    }
  }

  /// A continuation added to a call that is done: at once, on this thread; but inside a queued
  /// call of this queue (under exec_), when that call completes. (q may be gone: compared only.)
  static void run_late(const call_queue* q, continuation& f, const std::exception_ptr& err) {
    if (q != nullptr && tl_running == q && tl_current_task != nullptr && tl_current_task->add(f)) return;
    run_continuation(f, err);
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
      // its own), or a continuation may hold the gate: look again later rather than queue on
      // the mutex.
      const std::uint32_t g = gate_word_.load(std::memory_order_seq_cst);  // (before the gate: its opening changes it)
      std::unique_lock ex(exec_, std::try_to_lock);
      if (!ex.owns_lock() || gate_.load(std::memory_order_seq_cst)) {
        const bool gated = ex.owns_lock();
        if (ex.owns_lock()) ex.unlock();
        if (gated) {
          gate_sleepers_.fetch_add(1, std::memory_order_seq_cst);
          futex_wait(gate_word_, g, kSleepSlice, false);
          gate_sleepers_.fetch_sub(1, std::memory_order_seq_cst);
        } else {
          futex_wait(bell_, bell_.load(std::memory_order_seq_cst), kPoll, false);
        }
        continue;
      }
      scope s(this);
      (void)run_queued();
      busy_at = clock::now();
    }
  }

  std::shared_ptr<call_task> stub_;  // the list's first head
  call_task* head_;                  // the call last taken (or the stub): the consumer's end, under exec_
  call_task* tail_;                  // the call last queued: the producers' end, under push_
  yield_lock push_;                  // producers' turn (two stores; a contended taker yields)
  std::atomic<std::uint64_t> pushed_{0}, popped_{0};  // calls queued and taken, ever (one writer each at a time)
  std::atomic<std::uint32_t> bell_{0};  // bumped (and woken) to wake the thread
  std::atomic<bool> asleep_{false};     // the thread sleeps until woken (not lingering)
  std::atomic<bool> stop_{false};
  std::atomic<bool> started_{false};  // a producer started the thread
  std::mutex start_mu_;               // the thread's handle, between its start and shutdown
  sleep_lock exec_;                   // held by the thread running this communicator's calls
  // The gate: closed while a call's continuations run (settle), with no lock held.
  std::atomic<bool> gate_{false};
  std::atomic<std::int64_t> gate_since_{0};  // wall_ns when it closed
  std::atomic<std::uint32_t> gate_word_{0};  // bumped as it opens
  std::atomic<std::uint32_t> gate_sleepers_{0};
  std::atomic<int> gate_calls_{0};  // calls its continuations are making now (they have deadlines of their own)
  std::chrono::nanoseconds timeout_{std::chrono::seconds(300)};
  queue_observer obs_;
  std::thread worker_;
};

inline void call_task::wait() {
  if (!test()) q_->wait_for(*this);
  if (err_) std::rethrow_exception(err_);
}

inline bool call_task::add(continuation& f) {
  std::lock_guard g(cont_mu_);
  int c = cont_.load(std::memory_order_acquire);
  do {
    if (c & kClosed) return false;
  } while (!cont_.compare_exchange_weak(c, c | kHasConts, std::memory_order_acq_rel));
  conts_.push_back(std::move(f));
  return true;
}

inline void call_task::then(continuation f) {
  if (!add(f)) call_queue::run_late(q_, f, err_);
}

}  // namespace collx::detail
