#pragma once
// Starting ranks of collx::cuda::transport: thread-ranks of this process (launch_threads),
// process-ranks of a launcher's job (from_env) or forked here (launch_processes). Part of
// cuda/transport.cuh (include that).
#if !defined(__CUDACC__)
#error "collx/cuda/*.cuh headers compile only under nvcc"
#endif
#include "transport.cuh"

namespace collx::cuda {

template <class F>
void launch_threads(int n, F&& f, options opts = {}, std::vector<int> devices = {0}) {
  if (n < 1) throw error(errc::invalid_argument, "cuda::launch_threads: the rank count must be at least 1, got " + std::to_string(n));
  // Each rank's stream needs its own hardware queue of the device (8 by default): streams beyond
  // them share queues in order, and a kernel waiting on a peer whose kernel is queued behind it
  // would wait until its deadline. Read when the process's CUDA context is made: set here when
  // the user has not (it takes effect if no context exists yet; tests/gpu/run.sh exports it).
  ::setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 0);
  auto g = std::make_shared<thread_group>(n, std::move(devices));
  std::mutex mu;
  std::vector<std::exception_ptr> failed(static_cast<std::size_t>(n));
  auto record = [&](int r, const char* why) {
    g->jobs().fail(r, why);
    std::lock_guard lk(mu);
    failed.at(static_cast<std::size_t>(r)) = std::current_exception();
  };
  auto body = [&](int r) {
    try {
      communicator<transport> comm{transport{g, r}, opts};
      f(comm);
      comm.transport().leave();
    } catch (const std::exception& e) {
      record(r, e.what());
    } catch (...) {
      record(r, "unknown exception");
    }
  };
  std::vector<std::thread> threads;
  for (int r = 1; r < n; ++r) threads.emplace_back(body, r);
  body(0);
  for (auto& t : threads) t.join();
  const int cause = g->jobs().first_failed();
  if (cause >= 0 && failed[std::size_t(cause)]) std::rethrow_exception(failed[std::size_t(cause)]);
  for (auto& e : failed)
    if (e) std::rethrow_exception(e);
}

/// The device a process-rank uses: COLLX_CUDA_DEVICE if set, else its local rank modulo the
/// devices it sees (one device per local rank, as torchrun's LOCAL_RANK is used).
inline int device_for_local_rank(int local_rank) {
  if (const long long d = collx::detail::env_int("COLLX_CUDA_DEVICE", 0ll, 1023ll, -1ll); d >= 0) return int(d);
  int count = 0;
  check(cudaGetDeviceCount(&count), "cudaGetDeviceCount");
  if (count < 1) throw error(errc::transport_error, "collx::cuda: no CUDA device");
  return local_rank % count;
}

/// A process-rank of a job started by a launcher (mpirun, srun, torchrun: core/job_env.hpp),
/// bootstrapped over shared memory (or tcp with COLLX_BOOTSTRAP=tcp), on the device of its
/// local rank. A collective call of every rank of the job.
inline communicator<transport> from_env(options opts = {}) {
  const launch_info li = launch_info_from_env();
  const std::string b = collx::detail::env_string("COLLX_BOOTSTRAP", "shm");
  if (b != "shm" && b != "tcp") throw error(errc::invalid_argument, "COLLX_BOOTSTRAP must be shm or tcp, not \"" + b + "\"");
  communicator<collx::transport::any> boot =
      b == "tcp"
          ? communicator<collx::transport::any>{collx::transport::any(collx::transport::tcp::from_env()), opts}
          : communicator<collx::transport::any>{collx::transport::any(collx::transport::shm::from_env()), opts};
  return communicator<transport>{transport::over(std::move(boot), device_for_local_rank(li.local_rank), opts.timeout), opts};
}

/// Forks n process-ranks (launch/processes.hpp), rank r on devices[r % size] (default: r modulo
/// the devices there are), each bootstrapped over shared memory, runs f(comm) in each and
/// reports every child's failure. The calling process must not have used CUDA before: a child
/// of fork() cannot use a CUDA context its parent made.
template <class F>
void launch_processes(int n, F&& f, options opts = {}, std::vector<int> devices = {}) {
  if (n < 1) throw error(errc::invalid_argument, "cuda::launch_processes: the rank count must be at least 1, got " + std::to_string(n));
  const std::string job = collx::detail::unique_job_name();
  collx::detail::shm_job_cleanup cleanup{collx::transport::shm::segment_name(job)};
  collx::detail::launch_processes_with<collx::detail::no_decorator>(
      n, job,
      [&](const std::string& j, int r) {
        communicator<collx::transport::any> boot{collx::transport::any(collx::transport::shm(j, r, n, {})), opts};
        const int d = devices.empty() ? device_for_local_rank(r) : devices[std::size_t(r) % devices.size()];
        return transport::over(std::move(boot), d, opts.timeout);
      },
      std::forward<F>(f), opts);
}

}  // namespace collx::cuda
