#pragma once
// Nonblocking collectives: collx::async::all_reduce(comm, ...) and the same for every collective
// and for send/recv. Each takes the blocking call's arguments (spans, op, root, policy) and
// returns a collx::work (core/work.hpp); the buffers belong to the call until it completes.
//
//   auto w = collx::async::all_reduce(comm, std::span{grads}, collx::ops::avg{});
//   compute();          // the call advances meanwhile, on the communicator's progress thread
//   w.wait();           // the result is in place; the call's collx::error is thrown here
//
// Calls on one communicator complete in the order issued, blocking and nonblocking mixed, and
// every rank must issue them in the same order (a rank that does not gets errc::mismatch, as
// with blocking calls). Deadlines, mismatches and lost peers reach wait() with the messages of
// the blocking call. send and recv keep their rule (a send completes once its receiver has the
// message) and their order: two ranks that exchange both ways use sendrecv, or a fused batch
// (features/fuse.hpp), which posts its sends and receives together.
#include <exception>
#include <functional>
#include <type_traits>
#include <utility>
#include <vector>

#include "../collectives/all_gather.hpp"
#include "../collectives/all_reduce.hpp"
#include "../collectives/all_to_all.hpp"
#include "../collectives/barrier.hpp"
#include "../collectives/broadcast.hpp"
#include "../collectives/gather_scatter.hpp"
#include "../collectives/p2p.hpp"
#include "../collectives/reduce.hpp"
#include "../collectives/reduce_scatter.hpp"
#include "../comm/communicator.hpp"
#include "../core/work.hpp"

namespace collx {

namespace detail {
/// Queues f on comm: it runs after every call issued before it (comm/call_queue.hpp). A
/// transport whose calls are ordered on a stream of its own (cuda::transport: `enqueue`) runs
/// f at once, and f's kernels are enqueued, not waited for: the work completes when the
/// stream has passed them, as NCCL's calls are stream-ordered.
template <class T, class F>
work submit(communicator<T>& comm, const char* what, F&& f, continuation then = {}) {
  if constexpr (requires(T& t) { t.enqueue(f); }) {
    if (!comm.valid()) (void)queue_of(comm, what);  // (throws: a null communicator)
    work w = comm.transport().enqueue(std::forward<F>(f));
    if (then) w.then(std::move(then));
    return w;
  } else {
    return work(queue_of(comm, what).submit(std::forward<F>(f), std::move(then)));
  }
}
}  // namespace detail

namespace async {

// Arguments are taken by value (spans, ops, policies, roots): a container passed where a span is
// expected does not compile, rather than reducing a copy.
#define COLLX_ASYNC_CALL(name)                                                                   \
  template <class T, class... A>                                                                 \
  work name(communicator<T>& comm, A... args) {                                                  \
    return detail::submit(comm, #name, [&comm, args...]() { ::collx::name(comm, args...); });    \
  }

COLLX_ASYNC_CALL(all_reduce)
COLLX_ASYNC_CALL(reduce_scatter)
COLLX_ASYNC_CALL(all_gather)
COLLX_ASYNC_CALL(broadcast)
COLLX_ASYNC_CALL(reduce)
COLLX_ASYNC_CALL(all_to_all)
COLLX_ASYNC_CALL(all_to_all_v)
COLLX_ASYNC_CALL(gather)
COLLX_ASYNC_CALL(scatter)
COLLX_ASYNC_CALL(barrier)
COLLX_ASYNC_CALL(send)
COLLX_ASYNC_CALL(recv)
COLLX_ASYNC_CALL(sendrecv)
#undef COLLX_ASYNC_CALL

/// recv_any as a nonblocking call: once the work is done, `*source` is the rank the message came
/// from (`source` must outlive the call; nullptr: not wanted). `from` is copied when the call is
/// issued.
template <class T, class E>
work recv_any(communicator<T>& comm, std::span<E> data, int* source, std::span<const int> from = {}) {
  return detail::submit(comm, "recv_any", [&comm, data, source, peers = std::vector<int>(from.begin(), from.end())]() {
    const int src = ::collx::recv_any(comm, data, std::span<const int>(peers));
    if (source != nullptr) *source = src;
  });
}

/// Any sequence of calls on comm as one nonblocking call: f(comm) runs in its turn.
template <class T, class F>
work run(communicator<T>& comm, F f) {
  return detail::submit(comm, "async::run", [&comm, f = std::move(f)]() mutable { f(comm); });
}

/// async::run with a continuation (core/work.hpp, then) that is the call's before any thread can run
/// it: it runs in the call's turn even when the call completes before run() returns (then()
/// on the returned work would run it at once, on this thread, instead).
template <class T, class F, class C>
  requires std::is_invocable_v<C&, std::exception_ptr>
work run(communicator<T>& comm, F f, C then) {
  return detail::submit(comm, "async::run", [&comm, f = std::move(f)]() mutable { f(comm); }, continuation(std::move(then)));
}

}  // namespace async
}  // namespace collx
