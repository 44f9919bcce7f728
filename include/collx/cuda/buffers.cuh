#pragma once
// collx::cuda's device memory: the buffers a transport holds, a rank's view of its peers'
// regions, and what every kind of group offers its transports (group_base). Part of
// cuda/transport.cuh (include that).
#if !defined(__CUDACC__)
#error "collx/cuda/*.cuh headers compile only under nvcc"
#endif
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "../comm/communicator.hpp"
#include "../core/concepts.hpp"
#include "../features/device_ipc.hpp"
#include "../device/job.hpp"
#include "../device/plan.hpp"
#include "../core/error.hpp"
#include "../launch/processes.hpp"
#include "../core/call_info.hpp"
#include "../core/split_plan.hpp"
#include "../transport/any.hpp"
#include "../core/work.hpp"
#include "ipc.cuh"
#include "plan_kernel.cuh"
#include "reduce.cuh"

namespace collx::cuda {

/// The memory_space of device buffers.
struct device_memory {};

/// Bytes a block moves at a time on the device.
inline constexpr std::uint64_t kDeviceChunk = 256 * 1024;

/// Device memory a transport holds (its scratch, its staging, its pack buffer).
struct dev_buffer {
  std::byte* p = nullptr;
  std::size_t bytes = 0;
  CUmemGenericAllocationHandle h = 0;  // (a process group's VMM allocation)
};

/// What one rank's launches need of its group.
struct rank_view {
  int rank = 0, size = 1, device = 0, sms = 1, sharing = 1;
  std::byte* region = nullptr;          // the rank's region (device address: layout.hpp)
  device::job_rank* job = nullptr;      // its entry of the job block, as the host reads it
  device::job_rank* job_dev = nullptr;  // and as kernels do
  int* abort_dev = nullptr;             // the group's abort flag, as kernels read it
};

/// A group of ranks: threads of one process (thread_group) or processes (process_group).
class group_base {
 public:
  virtual ~group_base() = default;
  virtual int size() const noexcept = 0;
  virtual rank_view view(int r) const = 0;
  virtual const device::job_view& jobs() const noexcept = 0;
  /// Waits until no peer of r has a launch that may read r's memory (r failed), at most `limit`.
  virtual bool wait_peers_idle(int r, std::chrono::nanoseconds limit) noexcept = 0;
  /// Processes: a peer whose process ended without leaving (now marked failed), else -1.
  virtual int peer_gone() noexcept { return -1; }
  /// Processes: peers do not read the addresses posted; see exchange().
  virtual bool between_processes() const noexcept { return false; }
  /// Whether the peers can map [p, p + bytes) (else it is staged). Threads share an address space.
  virtual bool exportable(const std::byte*, std::size_t) { return true; }
  /// Processes: the call's exchange (features/device_ipc.hpp): every rank's signature and the buffers it
  /// posts from; fills peer_base ([rank][3]).
  virtual void exchange(const call_info&, std::byte* const (&)[4], const device::plan&, std::uint64_t*) {}
  /// Device memory of rank r's own, that its peers may read (processes: exportable; threads:
  /// stream-ordered, no wait for the whole device, where other ranks' kernels wait for this one).
  virtual dev_buffer allocate(int r, std::size_t bytes, cudaStream_t s) = 0;
  virtual void release(int r, dev_buffer& b, cudaStream_t s) noexcept = 0;
  virtual split_offer prepare_split() { return {}; }
  virtual std::shared_ptr<group_base> split(const std::shared_ptr<group_base>& self, const split_plan& p, split_offer&& o) = 0;
  virtual void leave(int r) noexcept { jobs().leave(r); }
  /// How many ranks' kernels may be on rank r's device at once, this group's and any other's of
  /// the process (processes: this group's; other processes' kernels are time-sliced with ours).
  virtual int residents(int r) const noexcept { return std::max(1, view(r).sharing); }
  /// Processes: rank r failed; peers waiting in the bootstrap (a call's exchange) learn it too.
  virtual void abort_boot(const std::string&) noexcept {}
};

}  // namespace collx::cuda
