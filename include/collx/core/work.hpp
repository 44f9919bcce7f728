#pragma once
// collx::work: the handle of a nonblocking call (features/async.hpp). wait() returns when the call's
// result is in place and throws its collx::error; test() never blocks and says whether it is
// done. A work is move-only; destroying one that was not waited for waits (a call never goes on
// running on buffers its caller has freed), and drops the error: the communicator has failed
// then, and its next call says so. detach() lets the call go on without its handle, for calls
// that own their buffers (the torch backend's capture their tensors).
//
// then(f) adds a continuation: f(error) runs once the call has completed (error is null when it
// succeeded), before the communicator's next call starts, with no lock of collx's held, on the
// thread that completed the call; a call that f makes on the same communicator runs at once,
// right there, so it comes right after the call on every rank, whatever the timing
// (comm/call_queue.hpp says why and how). A work is done (test(), wait()) once its
// continuations have returned.
//
// What a work stands for is behind work_state, so a device transport can hand out works that
// complete on its stream (an event) beside the host calls of comm/call_queue.hpp.
#include <exception>
#include <functional>
#include <memory>
#include <type_traits>
#include <utility>

namespace collx {

/// What a continuation takes: the call's error, or null when it succeeded.
using continuation = std::function<void(std::exception_ptr)>;

namespace detail {
/// What a work waits for. wait() may be called any number of times, from one thread at a time,
/// and throws the call's error every time.
class work_state {
 public:
  virtual ~work_state() = default;
  virtual bool test() = 0;  // never blocks
  virtual void wait() = 0;
  /// A continuation. Where calls complete on a device's stream (no host thread completes them),
  /// it waits for the call here and runs f at once.
  virtual void then(continuation f) {
    std::exception_ptr e;
    try {
      wait();
    } catch (...) {
      e = std::current_exception();
    }
    f(e);
  }
};
}  // namespace detail

class work {
 public:
  work() = default;  // done, nothing to wait for
  explicit work(std::shared_ptr<detail::work_state> s) noexcept : s_(std::move(s)) {}
  work(work&&) noexcept = default;
  work& operator=(work&& o) noexcept {
    if (this != &o) {
      finish_quietly();
      s_ = std::move(o.s_);
    }
    return *this;
  }
  work(const work&) = delete;
  work& operator=(const work&) = delete;
  ~work() { finish_quietly(); }

  /// Whether the call has completed (successfully or not) and its continuations have returned;
  /// never blocks.
  bool test() { return !s_ || s_->test(); }
  /// Waits until the call's result is in place; throws its error (collx::error) if it failed.
  void wait() {
    if (s_) s_->wait();
  }
  /// f(std::exception_ptr) runs once the call has completed, as the header says; at once, on
  /// this thread, when it has already (a default-constructed work: with no error).
  template <class F>
    requires std::is_invocable_v<F&, std::exception_ptr>
  work& then(F f) {
    if (s_) s_->then(continuation(std::move(f)));
    else f(std::exception_ptr());
    return *this;
  }
  /// The call goes on without this handle: nothing waits for it when the handle goes, and its
  /// error is dropped (a continuation still sees it). Only for a call that owns what it works on
  /// (its captures keep its buffers alive), such as async::run's with buffers captured by value.
  void detach() noexcept { s_.reset(); }
  /// True for a work that stands for a call (not default-constructed, moved from or detached).
  bool valid() const noexcept { return s_ != nullptr; }

 private:
  void finish_quietly() noexcept {
    if (!s_) return;
    try {
      s_->wait();
    } catch (...) {  // the communicator has failed: its next call reports it
    }
    s_.reset();
  }
  std::shared_ptr<detail::work_state> s_;
};

}  // namespace collx
