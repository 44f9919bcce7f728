#pragma once
// collx::work: the handle of a nonblocking call (async.hpp). wait() returns when the call's
// result is in place and throws its collx::error; test() never blocks and says whether it is
// done. A work is move-only; destroying one that was not waited for waits (a call never goes on
// running on buffers its caller has freed), and drops the error: the communicator has failed
// then, and its next call says so.
//
// What a work stands for is behind work_state, so a device transport can hand out works that
// complete on its stream (an event) beside the host calls of detail/call_queue.hpp.
#include <memory>
#include <utility>

namespace collx {

namespace detail {
/// What a work waits for. wait() may be called any number of times, from one thread at a time,
/// and throws the call's error every time.
class work_state {
 public:
  virtual ~work_state() = default;
  virtual bool test() = 0;  // never blocks
  virtual void wait() = 0;
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

  /// Whether the call has completed (successfully or not); never blocks.
  bool test() { return !s_ || s_->test(); }
  /// Waits until the call's result is in place; throws its error (collx::error) if it failed.
  void wait() {
    if (s_) s_->wait();
  }
  /// True for a work that stands for a call (not default-constructed or moved from).
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
