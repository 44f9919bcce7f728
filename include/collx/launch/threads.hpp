#pragma once
// launch_threads(n, f, options): runs f(comm) on n thread-ranks over transport::inproc and
// rethrows the first failure once every thread has ended. A rank that throws poisons the job, so
// the others fail fast (errc::peer_lost) instead of waiting for it until their timeout.
//
//   collx::launch_threads(8, [](auto& comm) { ... });
//   collx::launch_threads<collx::transport::counting>(8, [](auto& comm) { comm.transport().counts(); });
#include <pthread.h>
#include <sched.h>

#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <type_traits>
#include <vector>

#include "../comm/communicator.hpp"
#include "../core/error.hpp"
#include "../transport/inproc.hpp"

namespace collx {

namespace detail {
template <class T>
using no_decorator = T;
}  // namespace detail

namespace detail {
/// launch_threads' machinery: rank r's transport is make(r) (its communicator's), and
/// leave(r, failed, why) tells its groups it has ended; `g` (the job's group) says which rank
/// failed first.
template <class Make, class Leave, class F>
void run_thread_ranks(int n, const std::shared_ptr<transport::inproc::group>& g, Make&& make, Leave&& leave, F&& f, const options& opts) {
  using transport_t = std::invoke_result_t<Make&, int>;
  std::mutex mu;
  std::exception_ptr first;  // the first recorded, if the group cannot say who failed first
  std::vector<std::exception_ptr> failed(static_cast<std::size_t>(n));
  // Rank r runs on the r-th usable core, round robin, as launch_processes places its ranks:
  // left to the scheduler, 4 thread-ranks on 2 cores ran a 32 KiB all_reduce in 21 us in one
  // run and 36 in the next, depending on which threads it packed together.
  std::vector<int> cpus;
  {
    cpu_set_t allowed;
    CPU_ZERO(&allowed);
    if (sched_getaffinity(0, sizeof allowed, &allowed) == 0)
      for (int c = 0; c < CPU_SETSIZE; ++c)
        if (CPU_ISSET(c, &allowed)) cpus.push_back(c);
  }
  auto pin = [&](int r) {
    if (cpus.size() < 2) return;
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpus[std::size_t(r) % cpus.size()], &one);
    pthread_setaffinity_np(pthread_self(), sizeof one, &one);
  };
  cpu_set_t caller;
  const bool caller_known = pthread_getaffinity_np(pthread_self(), sizeof caller, &caller) == 0;
  auto body = [&](int r) {
    pin(r);
    // Made inside the try: a communicator that cannot be made (a bad COLLX_* variable) fails
    // its rank like any error, instead of ending the process; it goes after leave() either way.
    std::optional<communicator<transport_t>> comm;
    try {
      comm.emplace(make(r), opts);
      f(*comm);
      leave(r, false, std::string());
    } catch (const std::exception& e) {
      leave(r, true, std::string(e.what()));
      std::lock_guard lk(mu);
      failed[std::size_t(r)] = std::current_exception();
      if (!first) first = failed[std::size_t(r)];
    } catch (...) {
      leave(r, true, std::string("unknown exception"));
      std::lock_guard lk(mu);
      failed[std::size_t(r)] = std::current_exception();
      if (!first) first = failed[std::size_t(r)];
    }
  };
  std::vector<std::thread> threads;
  threads.reserve(std::size_t(n));
  try {
    for (int r = 1; r < n; ++r) threads.emplace_back(body, r);
  } catch (const std::exception& e) {  // could not start every thread: fail the ranks that did not start
    for (int r = int(threads.size()) + 1; r < n; ++r) leave(r, true, std::string("thread did not start: ") + e.what());
    std::lock_guard lk(mu);
    first = std::current_exception();
  }
  body(0);  // rank 0 runs on the calling thread
  for (auto& t : threads) t.join();
  if (caller_known) pthread_setaffinity_np(pthread_self(), sizeof caller, &caller);  // the caller's own again
  // The rank that failed first is the cause; the others failed because of it (peer_lost).
  const int cause = g->first_failed();
  if (cause >= 0 && failed[std::size_t(cause)]) std::rethrow_exception(failed[std::size_t(cause)]);
  if (first) std::rethrow_exception(first);
}
}  // namespace detail

template <template <class> class Decorator, class F>
void launch_threads(int n, F&& f, options opts = {}) {
  if (n < 1) throw error(errc::invalid_argument, "launch_threads: the rank count must be at least 1, got " + std::to_string(n));
  auto g = std::make_shared<transport::inproc::group>(n);
  detail::run_thread_ranks(
      n, g, [&](int r) { return Decorator<transport::inproc>{transport::inproc{g, r}}; },
      [&](int r, bool failed, const std::string& why) { g->leave(r, failed, why); }, std::forward<F>(f), opts);
}

template <class F>
void launch_threads(int n, F&& f, options opts = {}) {
  launch_threads<detail::no_decorator>(n, std::forward<F>(f), opts);
}

}  // namespace collx
