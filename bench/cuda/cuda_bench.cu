// collx-cuda-bench: the CUDA path against its yardsticks, in one run, on one GPU.
//   1. dst = a + b (f32) at 256 MiB and 1 GiB: collx's reduction kernel against
//      cub::DeviceTransform's add over the same bytes (3 bytes moved per byte of dst), TB/s and
//      the fraction of the 4.8 TB/s H200 spec;
//   2. a device-to-device copy of 1 GiB (2 bytes moved per byte);
//   3. all_reduce, reduce_scatter and all_gather of 1 GiB over N = 2, 4, 8 thread-ranks on the
//      GPU: the HBM bytes each must move, summed over the ranks from their device plans (a copy
//      or plain receive reads and writes its bytes, a reducing receive reads two operands and
//      writes one), per second, against the copy's rate;
//   4. an 8 B all_reduce at N = 2: time per call, and NCCL's one-rank all_reduce beside it
//      (NCCL refuses two ranks on one GPU).
// Medians of several runs. Usage: collx-cuda-bench [--quick]
#include <collx/collx.hpp>
#include <collx/cuda/transport.cuh>

#include <cub/device/device_transform.cuh>
#include <cuda/std/functional>
#include <cuda/std/tuple>

#if defined(COLLX_HAVE_NCCL)
#include <nccl.h>
#endif

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <vector>

namespace {

using clk = std::chrono::steady_clock;
constexpr double kSpec = 4.8e12;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

template <class F>
double time_events(F f, int reps) {
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  std::vector<double> t;
  f();  // warm-up
  cudaDeviceSynchronize();
  for (int i = 0; i < reps; ++i) {
    cudaEventRecord(a);
    f();
    cudaEventRecord(b);
    cudaEventSynchronize(b);
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    t.push_back(ms * 1e-3);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return median(t);
}

/// HBM bytes one rank's call moves, from its lowered plan.
std::uint64_t hbm_bytes(const collx::device::plan& p) {
  std::uint64_t b = 0;
  for (const auto& o : p.ops) {
    if (o.kind == collx::device::op_kind::copy) b += 2 * o.bytes;
    if (o.kind == collx::device::op_kind::pull) b += (o.how == 0 ? 2 : 3) * o.bytes;
  }
  return b;
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IONBF, 0);  // run.sh may kill it at its limit: what it printed stays
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("skipped: no CUDA device here\n");
    return 77;
  }
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  std::printf("device 0: %s, %d SMs\n", prop.name, prop.multiProcessorCount);
  const int reps = quick ? 3 : 7;

  // 1 and 2: the reduction and the copy against their roofline.
  double copy_rate = 0;
  for (std::size_t bytes : {std::size_t(256) << 20, std::size_t(1) << 30}) {
    const std::size_t n = bytes / sizeof(float);
    float *a, *b, *d;
    cudaMalloc(&a, bytes);
    cudaMalloc(&b, bytes);
    cudaMalloc(&d, bytes);
    cudaMemset(a, 0, bytes);
    cudaMemset(b, 0, bytes);
    const double tc = time_events([&] { collx::cuda::reduce(collx::ops::sum{}, d, a, b, n, nullptr, prop.multiProcessorCount); }, reps);
    const double tcub = time_events([&] {
      cub::DeviceTransform::Transform(::cuda::std::make_tuple(a, b), d, n, ::cuda::std::plus<float>{});
    }, reps);
    const double tcp = time_events([&] { cudaMemcpyAsync(d, a, bytes, cudaMemcpyDeviceToDevice); }, reps);
    const double rc = 3.0 * double(bytes) / tc, rcub = 3.0 * double(bytes) / tcub, rcp = 2.0 * double(bytes) / tcp;
    std::printf("reduce f32 %5zu MiB: collx %.2f TB/s (%.0f%% of spec), cub::DeviceTransform %.2f TB/s (%.0f%%): collx/cub = %.2f\n",
                bytes >> 20, rc / 1e12, 100 * rc / kSpec, rcub / 1e12, 100 * rcub / kSpec, rc / rcub);
    std::printf("copy d2d   %5zu MiB: %.2f TB/s (%.0f%% of spec)\n", bytes >> 20, rcp / 1e12, 100 * rcp / kSpec);
    copy_rate = rcp;
    cudaFree(a);
    cudaFree(b);
    cudaFree(d);
  }

  // 3: collectives of 1 GiB over thread-ranks on the one GPU.
  const std::size_t big = quick ? (std::size_t(256) << 20) : (std::size_t(1) << 30);
  for (int n : {2, 4, 8}) {
    for (const char* which : {"all_reduce", "reduce_scatter", "all_gather"}) {
      std::vector<double> times(static_cast<std::size_t>(n));
      std::vector<std::uint64_t> moved(static_cast<std::size_t>(n));
      collx::cuda::launch_threads(n, [&](auto& comm) {
        const std::size_t count = big / sizeof(float), k = count / std::size_t(n);
        // Stream-ordered allocation: a cudaMalloc may wait for the whole device, where the
        // other ranks' kernels may wait for this rank.
        float *buf, *part;
        collx::cuda::check(cudaMallocAsync(&buf, big, cudaStreamPerThread), "cudaMallocAsync");
        collx::cuda::check(cudaMallocAsync(&part, k * sizeof(float), cudaStreamPerThread), "cudaMallocAsync");
        cudaMemsetAsync(buf, 0, big, cudaStreamPerThread);
        cudaMemsetAsync(part, 0, k * sizeof(float), cudaStreamPerThread);
        cudaStreamSynchronize(cudaStreamPerThread);
        auto run = [&] {
          if (which[4] == 'r') collx::all_reduce(comm, std::span{buf, count}, collx::ops::sum{}, collx::algo::ring{});
          else if (which[0] == 'r') collx::reduce_scatter(comm, std::span<const float>{buf, k * std::size_t(n)}, std::span{part, k}, collx::ops::sum{}, collx::algo::ring{});
          else collx::all_gather(comm, std::span<const float>{part, k}, std::span{buf, k * std::size_t(n)}, collx::algo::ring{});
        };
        run();
        std::vector<double> t;
        for (int i = 0; i < reps; ++i) {
          collx::barrier(comm);
          const auto t0 = clk::now();
          run();
          t.push_back(std::chrono::duration<double>(clk::now() - t0).count());
        }
        times[std::size_t(comm.rank())] = median(t);
        // The bytes this rank's plan moves: its schedule, lowered as the transport lowers it.
        collx::schedule s;
        const auto all = collx::model::schedules(collx::algo::ring{}, collx::model::problem{
            which[4] == 'r' ? collx::algo::collective::all_reduce : which[0] == 'r' ? collx::algo::collective::reduce_scatter
                                                                                  : collx::algo::collective::all_gather,
            n, which[4] == 'r' ? count : k, sizeof(float), 0, true});
        moved[std::size_t(comm.rank())] = hbm_bytes(collx::device::lower(all[std::size_t(comm.rank())], n, sizeof(float), collx::cuda::kDeviceChunk));
        cudaFreeAsync(buf, cudaStreamPerThread);
        cudaFreeAsync(part, cudaStreamPerThread);
        cudaStreamSynchronize(cudaStreamPerThread);
      });
      const double t = *std::max_element(times.begin(), times.end());
      std::uint64_t bytes = 0;
      for (auto b : moved) bytes += b;
      const double rate = double(bytes) / t;
      std::printf("%-14s 1 GiB N=%d: %.3f ms, moves %.2f GiB of HBM traffic: %.2f TB/s = %.0f%% of the copy's\n", which, n, t * 1e3,
                  double(bytes) / double(1ull << 30), rate / 1e12, 100 * rate / copy_rate);
    }
  }

  // 4: latency of an 8 B all_reduce.
  {
    double per_call = 0;
    collx::cuda::launch_threads(2, [&](auto& comm) {
      float* x;
      cudaMallocAsync(&x, 8, cudaStreamPerThread);
      cudaMemsetAsync(x, 0, 8, cudaStreamPerThread);
      cudaStreamSynchronize(cudaStreamPerThread);
      for (int i = 0; i < 100; ++i) collx::all_reduce(comm, std::span{x, 2}, collx::ops::sum{});
      std::vector<double> t;
      for (int rep = 0; rep < 5; ++rep) {
        collx::barrier(comm);
        const auto t0 = clk::now();
        for (int i = 0; i < 1000; ++i) collx::all_reduce(comm, std::span{x, 2}, collx::ops::sum{});
        t.push_back(std::chrono::duration<double>(clk::now() - t0).count() / 1000);
      }
      if (comm.rank() == 0) per_call = median(t);
      cudaFreeAsync(x, cudaStreamPerThread);
      cudaStreamSynchronize(cudaStreamPerThread);
    });
    std::printf("all_reduce 8 B, N=2 thread-ranks on one GPU: %.2f us per call\n", per_call * 1e6);
#if defined(COLLX_HAVE_NCCL)
    ncclComm_t c;
    int dev = 0;
    if (ncclCommInitAll(&c, 1, &dev) == ncclSuccess) {
      float* x;
      cudaMalloc(&x, 8);
      cudaStream_t s;
      cudaStreamCreate(&s);
      for (int i = 0; i < 100; ++i) ncclAllReduce(x, x, 2, ncclFloat, ncclSum, c, s);
      cudaStreamSynchronize(s);
      std::vector<double> t;
      for (int rep = 0; rep < 5; ++rep) {
        const auto t0 = clk::now();
        for (int i = 0; i < 1000; ++i) {
          ncclAllReduce(x, x, 2, ncclFloat, ncclSum, c, s);
          cudaStreamSynchronize(s);
        }
        t.push_back(std::chrono::duration<double>(clk::now() - t0).count() / 1000);
      }
      std::printf("NCCL all_reduce 8 B, 1 rank (it refuses two on one GPU), synchronised per call: %.2f us per call\n", median(t) * 1e6);
      ncclCommDestroy(c);
      cudaFree(x);
      cudaStreamDestroy(s);
    } else {
      std::printf("NCCL: ncclCommInitAll failed\n");
    }
#else
    std::printf("NCCL: not found at build time\n");
#endif
  }
  return 0;
}
