#pragma once
// A schedule's plan lowered for the device (device/plan.hpp) and copied to device memory, cached
// with the schedule. Part of cuda/transport.cuh (include that).
#if !defined(__CUDACC__)
#error "collx/cuda/*.cuh headers compile only under nvcc"
#endif
#include "groups.cuh"

namespace collx::cuda {

// ---- plans ---------------------------------------------------------------------------------

/// A plan lowered for the device: the host plan, and its arrays and per-peer totals copied to
/// device memory (freed with it, that is with the cached schedule it belongs to).
struct device_plan {
  device::plan host;
  void* mem = nullptr;
  device::plan_view view{};
  const std::uint64_t* totals = nullptr;
  int dev = 0;
  std::uint64_t most = 0;  // bytes of its largest operation
  /// Allocated and freed stream-ordered (cudaMallocAsync / cudaFreeAsync on the calling
  /// thread's default stream): cudaMalloc and cudaFree may wait for the whole device, where
  /// other ranks' kernels wait for this rank, which would then wait out their deadline.
  device_plan(device::plan p, int device) : host(std::move(p)), dev(device) {
    for (const auto& o : host.ops) most = std::max(most, o.bytes);
    const std::size_t n = host.msgs_to.size();
    const std::size_t ops = host.ops.size() * sizeof(device::plan_op), phases = host.phases.size() * sizeof(device::plan_phase);
    const std::size_t tot = 3 * n * sizeof(std::uint64_t);
    std::vector<std::byte> staged(ops + phases + tot + 64);
    std::memcpy(staged.data(), host.ops.data(), ops);
    std::memcpy(staged.data() + ops, host.phases.data(), phases);
    std::vector<std::uint64_t> t;
    t.insert(t.end(), host.msgs_to.begin(), host.msgs_to.end());
    t.insert(t.end(), host.chunks_to.begin(), host.chunks_to.end());
    t.insert(t.end(), host.msgs_from.begin(), host.msgs_from.end());
    const std::size_t tat = (ops + phases + 7) / 8 * 8;
    std::memcpy(staged.data() + tat, t.data(), tot);
    check(cudaMallocAsync(&mem, staged.size(), cudaStreamPerThread), "cudaMallocAsync (a device plan)");
    const cudaError_t e = cudaMemcpyAsync(mem, staged.data(), staged.size(), cudaMemcpyHostToDevice, cudaStreamPerThread);
    const cudaError_t f = e == cudaSuccess ? cudaStreamSynchronize(cudaStreamPerThread) : e;
    if (f != cudaSuccess) {
      cudaFreeAsync(mem, cudaStreamPerThread);
      check(f, "copying a device plan");
    }
    auto* b = static_cast<std::byte*>(mem);
    view = {reinterpret_cast<const device::plan_op*>(b), reinterpret_cast<const device::plan_phase*>(b + ops),
            std::uint32_t(host.phases.size()), host.chunk};
    totals = reinterpret_cast<const std::uint64_t*>(b + tat);
  }
  device_plan(const device_plan&) = delete;
  device_plan& operator=(const device_plan&) = delete;
  std::size_t memory_bytes() const { return host.memory_bytes(); }
  ~device_plan() {
    if (!mem) return;
    int was = 0;
    cudaGetDevice(&was);
    cudaSetDevice(dev);
    cudaFreeAsync(mem, cudaStreamPerThread);
    cudaSetDevice(was);
  }
};

}  // namespace collx::cuda
