#pragma once
// The kernel that runs a collective: one launch per call and rank, walking the rank's device
// plan (device/plan.hpp: the same run_plan() the host interpreter runs, transport/planned.hpp)
// with this environment:
//   - a worker is a block; a phase's chunks are dealt to the blocks round robin, and the
//     blocks of a rank meet at a grid barrier (a 64-bit counter in device memory) after each
//     phase, so every block of the rank must be resident at once: the transport sizes the grid
//     so that the kernels of every rank on a device fit together (transport.cuh);
//   - peers synchronise through monotonic 64-bit counters in memory every peer can reach (one
//     device, or peer-mapped), stored with release and loaded with acquire semantics at system
//     scope (cuda::atomic_ref<..., thread_scope_system>: st.release.sys / ld.acquire.sys);
//   - every spin has a deadline (the %globaltimer clock) and watches the group's abort flag and
//     its own rank's status: a wait that cannot end sets the status (timeout, mismatch, peer
//     lost, naming the peer) and the kernel returns; the host turns it into a collx::error. A
//     bad call never hangs the GPU.
#if !defined(__CUDACC__)
#error "collx/cuda/*.cuh headers compile only under nvcc"
#endif
#include <cuda/atomic>

#include <cstddef>
#include <cstdint>

#include "../device/layout.hpp"
#include "../device/plan.hpp"
#include "reduce.cuh"

namespace collx::cuda {

using device::ack;
using device::inbox;
using device::message;
using device::plan_status;
using device::st_aborted;
using device::st_bad_address;
using device::st_mismatch_bytes;
using device::st_mismatch_call;
using device::st_ok;
using device::st_timeout;

/// The most ranks of a group of processes: each launch carries where every peer's buffers are
/// mapped (plan_args::peer_base), 3 addresses a rank.
inline constexpr int kMaxProcessRanks = 32;

/// Everything one rank's launch reads, by value.
struct plan_args {
  device::plan_view plan;      // device copies of the plan's arrays
  std::uint64_t* bases;        // [3][n]: sent, taken, received (device memory; advanced here)
  const std::uint64_t* totals; // [3][n]: what this plan moves per peer (msgs_to, chunks_to, msgs_from)
  std::byte* bufs[4];          // none, in, out, tmp (device pointers)
  inbox* const* in_from;       // [n]: the pair (peer -> me), in memory I poll
  inbox* const* out_to;        // [n]: the pair (me -> peer), where I post
  ack* const* acks_mine;       // [n]: (me -> peer)'s taken, which I poll
  ack* const* acks_theirs;     // [n]: (peer -> me)'s taken, which I raise
  std::uint64_t* barrier;      // this rank's grid barrier counter
  std::uint64_t* barrier_base; // the counter's value when this launch began (device memory:
                               // block 0 advances it at the end, as it does the pair bases)
  plan_status* status;         // this call's (mapped host memory: one slot per call in flight)
  int* abort;                  // the group's: nonzero once any rank failed (a failing kernel raises it)
  std::uint64_t sig;           // this call's signature hash
  std::uint64_t timeout_ns;
  int rank, size;
  std::uint64_t* exited;       // the rank's count of ended blocks (its region: layout.hpp)
  std::uint64_t exit_target;   // what it reaches when this launch's last block has ended
  std::uint64_t* finished;     // the rank's count of ended launches (mapped host memory), or null
  std::uint64_t launch;        // this launch's number: `finished` becomes it
  int translate;               // between processes: posts name (buffer, offset), looked up in peer_base
  std::uint64_t peer_base[3 * kMaxProcessRanks];  // [rank][buf - 1]: where each peer's in, out, tmp are mapped
};

__device__ __forceinline__ std::uint64_t global_ns() {
  std::uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

template <class T>
__device__ __forceinline__ T load_acquire_sys(T& x) {
  return ::cuda::atomic_ref<T, ::cuda::thread_scope_system>(x).load(::cuda::memory_order_acquire);
}
template <class T>
__device__ __forceinline__ void store_release_sys(T& x, T v) {
  ::cuda::atomic_ref<T, ::cuda::thread_scope_system>(x).store(v, ::cuda::memory_order_release);
}

template <class E, class Op>
struct device_env {
  const plan_args& a;
  Op op;
  std::uint64_t start;         // *a.barrier_base, read at the block's start
  std::uint64_t barriers = 0;  // grid barriers this block has passed in this launch

  __device__ int worker() const { return int(blockIdx.x); }
  __device__ int workers() const { return int(gridDim.x); }
  __device__ bool reversed() const { return false; }
  __device__ std::byte* base(std::uint8_t b) const { return a.bufs[b & 3]; }

  /// Records why this rank stops (the first reason wins) and tells the group: the abort flag
  /// ends every peer's waits at once, without waiting for this rank's grid to end and its host
  /// to abort (a grid some of whose blocks are not resident yet could not end).
  __device__ void fail(int code, int peer, std::uint64_t aux) {
    if (atomicCAS(&a.status->code, 0, code) == 0) {
      a.status->peer = peer;
      a.status->aux = aux;
    }
    __threadfence_system();
    if (code != st_aborted) store_release_sys(*a.abort, 1);
  }
  __device__ bool stopped() const {
    return ::cuda::atomic_ref<const int, ::cuda::thread_scope_system>(*a.abort).load(::cuda::memory_order_relaxed) != 0 ||
           ::cuda::atomic_ref<int, ::cuda::thread_scope_system>(a.status->code).load(::cuda::memory_order_relaxed) != 0;
  }

  /// Thread 0 spins until ready() (or the wait's deadline, the call's timeout from its start,
  /// as on the host; or an abort), the block learns the outcome.
  template <class Ready>
  __device__ bool wait_block(int peer, Ready ready) {
    __shared__ int ok;
    __syncthreads();  // every thread has read the previous wait's `ok` before thread 0 resets it
    if (threadIdx.x == 0) {
      ok = 1;
      unsigned backoff = 32;
      std::uint64_t deadline = 0;
      // The abort flag and the rank's status are in mapped host memory: each look is a round
      // trip over the host link (~1 us), so they are looked at every 8th turn, not between
      // every two looks at the counter (device memory), which would delay seeing it move.
      for (unsigned turn = 0; !ready(); ++turn) {
        // A barrier among this rank's own blocks (peer -1) waits twice as long: a block that
        // reached it early must not time out before the block still waiting on a peer does,
        // which names that peer (the first reason is the one reported).
        if (deadline == 0) deadline = global_ns() + (peer < 0 ? 2 * a.timeout_ns : a.timeout_ns);
        if ((turn & 7) == 7 && stopped()) {
          fail(st_aborted, peer, 0);
          ok = 0;
          break;
        }
        if (global_ns() > deadline) {
          fail(st_timeout, peer, 0);
          ok = 0;
          break;
        }
        __nanosleep(backoff);
        if (backoff < 1024) backoff *= 2;
      }
    }
    __syncthreads();
    return ok != 0;
  }

  __device__ void post(int q, std::uint64_t index, std::uint8_t buf, std::uint64_t off, std::uint64_t bytes) {
    if (threadIdx.x != 0) return;
    inbox& box = *a.out_to[q];
    message& m = box.slots[index % device::kSlots];
    m.addr = a.translate ? device::address_of_buffer(buf, off) : reinterpret_cast<std::uint64_t>(base(buf) + off);
    m.bytes = bytes;
    m.sig = a.sig;
    store_release_sys(box.posted, index + 1);
  }

  __device__ bool arrived(int q, std::uint64_t index, std::uint64_t bytes, const std::byte*& data) {
    inbox& box = *a.in_from[q];
    if (!wait_block(q, [&] { return load_acquire_sys(box.posted) > index; })) return false;
    __shared__ const std::byte* where;
    __shared__ int ok;
    if (threadIdx.x == 0) {
      const message& m = box.slots[index % device::kSlots];
      ok = 1;
      where = reinterpret_cast<const std::byte*>(m.addr);
      if (m.sig != a.sig) {
        fail(st_mismatch_call, q, m.bytes);
        ok = 0;
      } else if (m.bytes != bytes) {
        fail(st_mismatch_bytes, q, m.bytes);
        ok = 0;
      } else if (m.bytes == 0) {
        where = nullptr;  // (a message of no bytes names no buffer)
      } else if ((m.addr & device::kBufferAddress) != 0) {  // a peer process's buffer, as mapped here
        const std::uint8_t b = device::buffer_of_address(m.addr);
        const std::uint64_t at = b >= 1 && b <= 3 && q < kMaxProcessRanks ? a.peer_base[q * 3 + b - 1] : 0;
        if (at == 0) {
          fail(st_bad_address, q, m.addr);
          ok = 0;
        }
        where = reinterpret_cast<const std::byte*>(at + device::offset_of_address(m.addr));
      }
    }
    __syncthreads();
    data = where;
    return ok != 0;
  }

  __device__ void copy(std::byte* d, const std::byte* s, std::uint64_t bytes) {
    copy_range(d, s, bytes, threadIdx.x, blockDim.x);
  }
  /// Overlapping source and destination (rare in schedules): one thread, in the safe direction.
  __device__ void move(std::byte* d, const std::byte* s, std::uint64_t bytes) {
    if (threadIdx.x == 0) {
      if (d < s)
        for (std::uint64_t i = 0; i < bytes; ++i) d[i] = s[i];
      else
        for (std::uint64_t i = bytes; i-- > 0;) d[i] = s[i];
    }
    __syncthreads();
  }

  __device__ void combine(int, std::byte* d, const std::byte* with, const std::byte* recv, std::uint64_t bytes,
                          std::uint8_t how) {
    if (how == std::uint8_t(collx::combine::copy)) {
      copy_range(d, recv, bytes, threadIdx.x, blockDim.x);
    } else if constexpr (!std::is_same_v<Op, collx::no_op>) {
      const std::size_t n = bytes / sizeof(E);
      auto* dst = reinterpret_cast<E*>(d);
      const auto* w = reinterpret_cast<const E*>(with);
      const auto* r = reinterpret_cast<const E*>(recv);
      if (how == std::uint8_t(collx::combine::received_left)) reduce_range<E>(op, dst, r, w, n, threadIdx.x, blockDim.x);
      else reduce_range<E>(op, dst, w, r, n, threadIdx.x, blockDim.x);
    }
  }

  /// One more chunk taken: every thread's reads of it are done (the barrier), then thread 0
  /// raises the sender's counter.
  __device__ void take(int q) {
    __syncthreads();
    if (threadIdx.x == 0) {
      __threadfence_system();
      ::cuda::atomic_ref<std::uint64_t, ::cuda::thread_scope_system>(a.acks_theirs[q]->taken)
          .fetch_add(1, ::cuda::memory_order_release);
    }
  }

  __device__ bool taken(int q, std::uint64_t chunks) {
    ack& k = *a.acks_mine[q];
    return wait_block(q, [&] { return load_acquire_sys(k.taken) >= chunks; });
  }

  /// Every block of this rank meets; what each wrote before is visible to all after (system
  /// scope: the data a block wrote may be read next by a peer's kernel).
  /// (A one-block grid meets itself: the counter is left alone, and so is barrier_base.) False
  /// when a block of this rank failed or the group aborted meanwhile: the walk stops.
  __device__ bool barrier() {
    __syncthreads();
    ++barriers;
    if (gridDim.x == 1) return true;
    const std::uint64_t target = start + barriers * gridDim.x;
    if (threadIdx.x == 0) {
      __threadfence_system();
      ::cuda::atomic_ref<std::uint64_t, ::cuda::thread_scope_device>(*a.barrier).fetch_add(1, ::cuda::memory_order_acq_rel);
    }
    return wait_block(-1, [&] {
      return ::cuda::atomic_ref<std::uint64_t, ::cuda::thread_scope_device>(*a.barrier).load(::cuda::memory_order_acquire) >=
             target;
    });
  }
};

/// Barriers one launch of plan p passes (block 0 advances barrier_base by this x the grid, for
/// a grid of more than one block).
inline std::uint64_t barriers_of(const device::plan& p) {
  std::uint64_t k = 0;
  for (const auto& ph : p.phases) k += ph.barrier != 0;
  return k;
}

template <class E, class Op>
__global__ void __launch_bounds__(kThreads) plan_kernel(plan_args a, Op op) {
  device_env<E, Op> env{a, op, *a.barrier_base};
  const bool ok = device::run_plan(a.plan, device::bases{a.bases, a.bases + a.size, a.bases + 2 * a.size}, env);
  // Every block has passed the last barrier (a plan ends with one), so nobody reads the bases
  // any more (each block read barrier_base at its start, before it could reach the first
  // barrier): block 0 advances them for the next call.
  if (ok && blockIdx.x == 0) {
    for (int i = int(threadIdx.x); i < 3 * a.size; i += int(blockDim.x)) a.bases[i] += a.totals[i];
    if (threadIdx.x == 0 && gridDim.x > 1 && env.barriers != 0) *a.barrier_base += env.barriers * gridDim.x;
  }
  // This block reads no peer's memory any more. The last block out counts the launch as ended
  // (a failing rank waits for its peers' launches to end before it frees what they may read).
  __syncthreads();
  if (threadIdx.x == 0 && a.exited != nullptr) {
    __threadfence_system();
    const unsigned long long before = atomicAdd(reinterpret_cast<unsigned long long*>(a.exited), 1ull);
    if (before + 1 == a.exit_target && a.finished != nullptr) store_release_sys(*a.finished, a.launch);
  }
}

/// Launches one rank's plan on `stream`.
template <class E, class Op>
cudaError_t launch_plan(const plan_args& a, const Op& op, int blocks, cudaStream_t stream) {
  (void)cudaGetLastError();  // (what it returns after the launch is then this launch's own)
  plan_kernel<E, Op><<<blocks, kThreads, 0, stream>>>(a, op);
  return cudaGetLastError();
}

}  // namespace collx::cuda
