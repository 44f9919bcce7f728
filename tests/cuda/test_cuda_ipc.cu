// The GPU tests of process-ranks: cuda::launch_processes forks the ranks (before this process
// touches CUDA: a child of fork() cannot use its parent's context), each on device r % devices
// (on a one-GPU machine every rank shares device 0: their kernels are time-sliced, slow but
// correct), its group mapped through the VMM API with descriptors passed over Unix sockets, or
// through cudaIpc handles (COLLX_CUDA_IPC=legacy). Every collective x policy at N = 2 and 3
// against the serial reference, with buffers of the three kinds a program may hold: cudaMalloc
// memory (mapped in place through its cudaIpc handle), alloc_exportable's VMM memory (mapped in
// place through its descriptor), and a stream-ordered pool's (staged); stream-ordered
// nonblocking calls; a split; then the errors: a mismatch, a rank that never calls, a rank
// killed mid-job. Without a CUDA device it says why and exits 77.
//
//   test_cuda_ipc [--quick]      (--quick: ring and automatic only)
#include <collx/features/async.hpp>
#include <collx/collx.hpp>
#include <collx/cuda/transport.cuh>

#include "expect.hpp"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace {

using collx_gpu_test::checks;
using collx_gpu_test::expect;
using collx_gpu_test::failures;

/// How a rank's buffers are allocated.
enum class kind { cuda_malloc, exportable, pool };
const char* name(kind k) { return k == kind::cuda_malloc ? "cudaMalloc" : k == kind::exportable ? "alloc_exportable" : "pool"; }

template <class E>
struct buffer {
  E* p = nullptr;
  std::size_t n = 0;
  kind k;
  int dev;
  buffer(std::size_t count, kind how, int device) : n(count), k(how), dev(device) {
    const std::size_t bytes = std::max<std::size_t>(1, n) * sizeof(E);
    if (k == kind::cuda_malloc) collx::cuda::check(cudaMalloc(&p, bytes), "cudaMalloc");
    else if (k == kind::exportable) p = static_cast<E*>(collx::cuda::alloc_exportable(bytes, dev));
    else collx::cuda::check(cudaMallocAsync(&p, bytes, cudaStreamPerThread), "cudaMallocAsync");
    collx::cuda::check(cudaMemsetAsync(p, 0, bytes, cudaStreamPerThread), "cudaMemsetAsync");
    collx::cuda::check(cudaStreamSynchronize(cudaStreamPerThread), "cudaStreamSynchronize");
  }
  buffer(const std::vector<E>& h, kind how, int device) : buffer(h.size(), how, device) { put(h); }
  buffer(const buffer&) = delete;
  buffer& operator=(const buffer&) = delete;
  ~buffer() {
    if (k == kind::cuda_malloc) cudaFree(p);
    else if (k == kind::exportable) collx::cuda::free_exportable(p);
    else cudaFreeAsync(p, cudaStreamPerThread);
  }
  void put(const std::vector<E>& h) {
    // (from pageable memory cudaMemcpy may return before its DMA lands, and the collective's
    // kernel runs on a non-blocking stream: waited for here)
    collx::cuda::check(cudaMemcpy(p, h.data(), h.size() * sizeof(E), cudaMemcpyHostToDevice), "cudaMemcpy");
    collx::cuda::check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  }
  std::vector<E> get() const {
    std::vector<E> h(n);
    collx::cuda::check(cudaMemcpy(h.data(), p, n * sizeof(E), cudaMemcpyDeviceToHost), "cudaMemcpy");
    return h;
  }
  std::span<E> span() { return {p, n}; }
  std::span<const E> cspan() const { return {p, n}; }
};

std::int32_t val(int r, std::size_t i) { return std::int32_t((r + 1) * 1000003 + std::int64_t(i) * 7) % 100000; }

collx::options bounded(int seconds = 20) {
  collx::options o;
  o.timeout = std::chrono::seconds(seconds);
  return o;
}

/// Runs f on n process-ranks; "" or the error.
template <class F>
std::string run(int n, F f, collx::options o = bounded()) {
  try {
    collx::cuda::launch_processes(n, f, o);
  } catch (const std::exception& e) {
    return e.what();
  }
  return {};
}

namespace al = collx::algo;
template <class A>
constexpr bool has_ar = std::is_same_v<A, al::automatic> || requires(const A& a, const al::rs_problem& p) { a.reduce_scatter(p); } ||
                        requires(const A& a, const al::ar_problem& p) { a.all_reduce(p); };
template <class A>
constexpr bool has_ag = std::is_same_v<A, al::automatic> || requires(const A& a, const al::ag_problem& p) { a.all_gather(p); };
template <class A>
constexpr bool has_bcast = std::is_same_v<A, al::automatic> || requires(const A& a, const al::bcast_problem& p) { a.broadcast(p); };

/// Every collective of policy Algo on the ranks of comm, counts 0, 1, N + 1 and a large prime,
/// buffers of kind k; throws naming the first wrong element.
template <class Algo, class C>
void collectives(C& comm, kind k, const char* pname) {
  const int n = comm.size(), r = comm.rank(), dev = comm.transport().device();
  for (std::size_t count : {std::size_t(0), std::size_t(1), std::size_t(n + 1), std::size_t(100003)}) {
    auto fail = [&](const std::string& s) {
      throw std::runtime_error(std::string(pname) + ", " + name(k) + ", count " + std::to_string(count) + ": rank " + std::to_string(r) +
                               ": " + s);
    };
    std::vector<std::int32_t> h(count);
    for (std::size_t i = 0; i < count; ++i) h[i] = val(r, i);
    if constexpr (has_ar<Algo>) {
      buffer<std::int32_t> d(h, k, dev);
      collx::all_reduce(comm, d.span(), collx::ops::sum{}, Algo{});
      const auto got = d.get();
      for (std::size_t i = 0; i < count; ++i) {
        std::int32_t want = 0;
        for (int q = 0; q < n; ++q) want += val(q, i);
        if (got[i] != want) fail("all_reduce wrong at " + std::to_string(i));
      }
      buffer<std::int32_t> din(h, k, dev), dout(count, k, dev);
      collx::all_reduce(comm, din.cspan(), dout.span(), collx::ops::max{}, Algo{});
      const auto out = dout.get();
      for (std::size_t i = 0; i < count; ++i) {
        std::int32_t want = val(0, i);
        for (int q = 1; q < n; ++q) want = std::max(want, val(q, i));
        if (out[i] != want) fail("all_reduce (max, out of place) wrong at " + std::to_string(i));
      }
    }
    const std::size_t kb = count / std::size_t(n) + (count % 2);
    if constexpr (has_ag<Algo>) {
      std::vector<std::int32_t> mine(kb);
      for (std::size_t i = 0; i < kb; ++i) mine[i] = val(r, i);
      buffer<std::int32_t> dm(mine, k, dev), dall(kb * std::size_t(n), k, dev);
      collx::all_gather(comm, dm.cspan(), dall.span(), Algo{});
      const auto all = dall.get();
      for (int q = 0; q < n; ++q)
        for (std::size_t i = 0; i < kb; ++i)
          if (all[std::size_t(q) * kb + i] != val(q, i)) fail("all_gather wrong at block " + std::to_string(q));
    }
    if constexpr (has_bcast<Algo>) {
      buffer<std::int32_t> d(h, k, dev);
      collx::broadcast(comm, d.span(), n - 1, Algo{});
      const auto got = d.get();
      for (std::size_t i = 0; i < count; ++i)
        if (got[i] != val(n - 1, i)) fail("broadcast wrong at " + std::to_string(i));
    }
    {
      std::vector<std::int32_t> in(kb * std::size_t(n));
      for (int q = 0; q < n; ++q)
        for (std::size_t i = 0; i < kb; ++i) in[std::size_t(q) * kb + i] = r * 1000 + q * 10 + std::int32_t(i % 7);
      buffer<std::int32_t> din(in, k, dev), dout(in.size(), k, dev);
      collx::all_to_all(comm, din.cspan(), dout.span());
      const auto got = dout.get();
      for (int q = 0; q < n; ++q)
        for (std::size_t i = 0; i < kb; ++i)
          if (got[std::size_t(q) * kb + i] != q * 1000 + r * 10 + std::int32_t(i % 7)) fail("all_to_all wrong from " + std::to_string(q));
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IONBF, 0);
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  // Whether there is a device, asked in a child: this process must not touch CUDA (its
  // children use it).
  int devices = 0;
  {
    int p[2];
    if (pipe(p) != 0) return 1;
    const pid_t c = fork();
    if (c == 0) {
      int k = 0;
      if (cudaGetDeviceCount(&k) != cudaSuccess) k = 0;
      (void)!write(p[1], &k, sizeof k);
      _exit(0);
    }
    close(p[1]);
    if (read(p[0], &devices, sizeof devices) != ssize_t(sizeof devices)) devices = 0;
    close(p[0]);
    waitpid(c, nullptr, 0);
  }
  if (devices == 0) {
    std::printf("skipped: no CUDA device here\n");
    return 77;
  }
  std::printf("process-ranks on %d device(s)%s\n", devices, devices == 1 ? " (every rank on device 0: time-sliced)" : "");

  // One job per way of mapping, rank count and kind of buffer: every policy and count in it
  // (a process-rank's CUDA context takes a while to make).
  for (const char* mode : {"vmm", "legacy"}) {
    setenv("COLLX_CUDA_IPC", mode, 1);
    const auto t0 = std::chrono::steady_clock::now();
    for (int n : {2, 3}) {
      for (kind k : {kind::cuda_malloc, kind::exportable, kind::pool}) {
        if (k == kind::exportable && std::strcmp(mode, "legacy") == 0) continue;  // (VMM memory; mapped the same either way)
        const std::string e = run(n, [&](auto& comm) {
          collectives<collx::algo::ring>(comm, k, "ring");
          collectives<collx::algo::automatic>(comm, k, "automatic");
          if (quick) return;
          collectives<collx::algo::tree>(comm, k, "tree");
          collectives<collx::algo::recursive_halving>(comm, k, "recursive_halving");
          collectives<collx::algo::recursive_doubling>(comm, k, "recursive_doubling");
        });
        expect(e.empty(), std::string("COLLX_CUDA_IPC=") + mode + ", N=" + std::to_string(n) + ", " + name(k) + ": " + e);
      }
    }
    std::printf("collectives over process-ranks, COLLX_CUDA_IPC=%s: done (%.1f s)\n", mode,
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  unsetenv("COLLX_CUDA_IPC");

  // Stream-ordered nonblocking calls: several in flight (more than the status slots), then waited.
  {
    const std::string e = run(2, [](auto& comm) {
      const int dev = comm.transport().device();
      std::vector<std::unique_ptr<buffer<float>>> bufs;
      std::vector<collx::work> works;
      for (int c = 0; c < 80; ++c) {
        bufs.push_back(std::make_unique<buffer<float>>(std::vector<float>(1000, float(comm.rank() + c)), kind::cuda_malloc, dev));
        works.push_back(collx::async::all_reduce(comm, bufs.back()->span(), collx::ops::sum{}));
      }
      for (auto& w : works) w.wait();
      for (int c = 0; c < 80; ++c)
        if (bufs[std::size_t(c)]->get()[999] != float(1 + 2 * c)) throw std::runtime_error("async call " + std::to_string(c) + " wrong");
    });
    expect(e.empty(), "stream-ordered calls over process-ranks: " + e);
  }
  // A split: pairs of a job of 4, each reducing on its own.
  {
    const std::string e = run(4, [](auto& comm) {
      auto pair = comm.split(comm.rank() / 2, comm.rank(), "pair");
      buffer<std::int32_t> d(std::vector<std::int32_t>(100, comm.rank()), kind::cuda_malloc, comm.transport().device());
      collx::all_reduce(pair, d.span(), collx::ops::sum{});
      const int want = comm.rank() / 2 * 4 + 1;
      if (d.get()[99] != want) throw std::runtime_error("the pair's sum is wrong");
    });
    expect(e.empty(), "a split of process-ranks: " + e);
  }
  std::printf("async, split: done\n");

  // Errors.
  {
    const std::string e = run(2, [](auto& comm) {
      buffer<float> d(comm.rank() == 1 ? 12 : 10, kind::cuda_malloc, comm.transport().device());
      collx::all_reduce(comm, d.span(), collx::ops::sum{}, collx::algo::ring{});
    });
    expect(e.find("made different calls") != std::string::npos, "mismatched sizes: " + e);
    std::printf("mismatch: %s\n", e.c_str());
  }
  {
    const auto t = std::chrono::steady_clock::now();
    const std::string e = run(2, [](auto& comm) {
      buffer<float> d(1 << 20, kind::cuda_malloc, comm.transport().device());
      collx::all_reduce(comm, d.span(), collx::ops::sum{}, collx::algo::ring{});
      if (comm.rank() == 1) ::kill(::getpid(), SIGKILL);
      for (int i = 0; i < 5; ++i) collx::all_reduce(comm, d.span(), collx::ops::sum{}, collx::algo::ring{});
    });
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
    expect(e.find("rank 1") != std::string::npos && s < 15, "a rank killed: " + e);
    std::printf("killed (%.2f s): %s\n", s, e.c_str());
  }
  std::printf("%d checks, %d failed\n", checks, failures);
  return failures == 0 ? 0 : 1;
}
