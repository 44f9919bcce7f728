#pragma once
// Reductions on the device: dst = left ⊕ right over n elements, for every element type and op of
// cuda/list.cuh and for any user functor whose operator() is __host__ __device__ (it is called
// as it is, inlined into the kernel).
//
// Memory is moved 16 bytes at a time (ld.global.v4 / st.global.v4) when the three pointers are
// 16-byte aligned and 16 is a multiple of the element size; the rest, and other element sizes,
// go element by element. Narrow floats (f16, bf16, fp8 e4m3 / e5m2) are reduced in float and
// rounded once per step, as the host does (ops/ops.hpp): each received block is combined with
// the local one and the result stored back in the element type, so an n-rank sum is rounded
// n-1 times along its path, the same times and places as on the host. For f16 and bf16 sum and
// prod the packed half2 / bf162 instructions are used: one correctly rounded operation in the
// narrow type gives the same bits as computing in float and rounding once (float has more than
// 2p + 2 bits of precision for p = 11 and 8), so this is exact, not an approximation. min and
// max compare in float with the host's rule (b < a ? b : a: a NaN in `right` is passed over),
// not with __hmin2, whose NaN rule differs.
#if !defined(__CUDACC__)
#error "collx/cuda/*.cuh headers compile only under nvcc"
#endif
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "../ops/ops.hpp"
#include "../core/types.hpp"

namespace collx::cuda {

/// The device type of a host element type: collx::half and collx::bfloat16 have the bits of
/// __half and __nv_bfloat16.
template <class E>
struct device_type {
  using type = E;
};
template <>
struct device_type<collx::half> {
  using type = __half;
};
template <>
struct device_type<collx::bfloat16> {
  using type = __nv_bfloat16;
};
template <class E>
using device_type_t = typename device_type<E>::type;

template <class E>
inline constexpr bool is_narrow_float_v = std::is_same_v<E, __half> || std::is_same_v<E, __nv_bfloat16> ||
                                          std::is_same_v<E, __nv_fp8_e4m3> || std::is_same_v<E, __nv_fp8_e5m2>;

/// What a reduction computes in: float for the narrow floats, the type itself otherwise.
template <class E>
using acc_t = std::conditional_t<is_narrow_float_v<E>, float, E>;

template <class E>
__host__ __device__ __forceinline__ acc_t<E> widen(E x) {
  if constexpr (std::is_same_v<E, __half>) return __half2float(x);
  else if constexpr (std::is_same_v<E, __nv_bfloat16>) return __bfloat162float(x);
  else if constexpr (is_narrow_float_v<E>) return float(x);  // fp8: explicit conversion
  else return x;
}

/// Rounds to nearest even; fp8 saturates to its largest finite value (cuda_fp8.h's default,
/// __NV_SATFINITE), as NCCL's fp8 reductions do.
template <class E>
__host__ __device__ __forceinline__ E narrow(acc_t<E> x) {
  if constexpr (std::is_same_v<E, __half>) return __float2half_rn(x);
  else if constexpr (std::is_same_v<E, __nv_bfloat16>) return __float2bfloat16_rn(x);
  else if constexpr (is_narrow_float_v<E>) return E(x);
  else return x;
}

/// An op on the device. The built-in ops by what they mean (computed in acc_t, rounded once);
/// any other functor is called as it is: it must be __host__ __device__ (or constexpr, with
/// --expt-relaxed-constexpr) and take two E.
template <class Op>
struct device_op {
  template <class E>
  __device__ __forceinline__ static E apply(const Op& op, E a, E b) {
    return op(a, b);
  }
};
template <>
struct device_op<ops::sum> {
  template <class E>
  __device__ __forceinline__ static E apply(const ops::sum&, E a, E b) {
    if constexpr (is_narrow_float_v<E>) return narrow<E>(widen(a) + widen(b));
    else return E(a + b);
  }
};
template <>
struct device_op<ops::avg> : device_op<ops::sum> {
  template <class E>
  __device__ __forceinline__ static E apply(const ops::avg&, E a, E b) {
    return device_op<ops::sum>::apply(ops::sum{}, a, b);
  }
};
template <>
struct device_op<ops::prod> {
  template <class E>
  __device__ __forceinline__ static E apply(const ops::prod&, E a, E b) {
    if constexpr (is_narrow_float_v<E>) return narrow<E>(widen(a) * widen(b));
    else return E(a * b);
  }
};
template <>
struct device_op<ops::min> {
  template <class E>
  __device__ __forceinline__ static E apply(const ops::min&, E a, E b) {
    return widen(b) < widen(a) ? b : a;
  }
};
template <>
struct device_op<ops::max> {
  template <class E>
  __device__ __forceinline__ static E apply(const ops::max&, E a, E b) {
    return widen(a) < widen(b) ? b : a;
  }
};
template <>
struct device_op<ops::band> {
  template <class E>
  __device__ __forceinline__ static E apply(const ops::band&, E a, E b) { return E(a & b); }
};
template <>
struct device_op<ops::bor> {
  template <class E>
  __device__ __forceinline__ static E apply(const ops::bor&, E a, E b) { return E(a | b); }
};
template <>
struct device_op<ops::bxor> {
  template <class E>
  __device__ __forceinline__ static E apply(const ops::bxor&, E a, E b) { return E(a ^ b); }
};

/// 16 bytes of elements, combined. f16 / bf16 sum and prod use the packed instructions (exact:
/// see the top); everything else goes element by element in registers.
template <class E, class Op>
__device__ __forceinline__ uint4 apply16(const Op& op, uint4 a, uint4 b) {
  constexpr int V = 16 / int(sizeof(E));
  uint4 d;
  constexpr bool is_sum = std::is_same_v<Op, ops::sum> || std::is_same_v<Op, ops::avg>;
  constexpr bool packed = (std::is_same_v<E, __half> || std::is_same_v<E, __nv_bfloat16>) && (is_sum || std::is_same_v<Op, ops::prod>);
  if constexpr (packed) {
    using P = std::conditional_t<std::is_same_v<E, __half>, __half2, __nv_bfloat162>;
    auto* x = reinterpret_cast<P*>(&a);
    auto* y = reinterpret_cast<P*>(&b);
    auto* z = reinterpret_cast<P*>(&d);
#pragma unroll
    for (int i = 0; i < 4; ++i) z[i] = is_sum ? __hadd2(x[i], y[i]) : __hmul2(x[i], y[i]);
  } else {
    const E* x = reinterpret_cast<const E*>(&a);
    const E* y = reinterpret_cast<const E*>(&b);
    E* z = reinterpret_cast<E*>(&d);
#pragma unroll
    for (int i = 0; i < V; ++i) z[i] = device_op<Op>::apply(op, x[i], y[i]);
  }
  return d;
}

/// dst[i] = left[i] ⊕ right[i], i in [0, n), shared by `nthreads` threads of which this is `tid`
/// (a block, or a whole grid). dst may equal left or right.
template <class E, class Op>
__device__ __forceinline__ void reduce_range(const Op& op, E* dst, const E* left, const E* right, std::size_t n,
                                             std::size_t tid, std::size_t nthreads) {
  std::size_t head = 0;
  if constexpr (sizeof(E) <= 16 && 16 % sizeof(E) == 0) {
    constexpr std::size_t V = 16 / sizeof(E);
    const auto bits = reinterpret_cast<std::uintptr_t>(dst) | reinterpret_cast<std::uintptr_t>(left) |
                      reinterpret_cast<std::uintptr_t>(right);
    if (bits % 16 == 0) {
      const std::size_t nv = n / V;
      auto* d = reinterpret_cast<uint4*>(dst);
      const auto* l = reinterpret_cast<const uint4*>(left);
      const auto* r = reinterpret_cast<const uint4*>(right);
      // Two vectors in flight per thread and iteration: loads of the second issue before the
      // first's arithmetic.
      std::size_t i = tid;
      for (; i + nthreads < nv; i += 2 * nthreads) {
        const uint4 a0 = l[i], b0 = r[i], a1 = l[i + nthreads], b1 = r[i + nthreads];
        d[i] = apply16<E>(op, a0, b0);
        d[i + nthreads] = apply16<E>(op, a1, b1);
      }
      if (i < nv) d[i] = apply16<E>(op, l[i], r[i]);
      head = nv * V;
    }
  }
  for (std::size_t i = head + tid; i < n; i += nthreads) dst[i] = device_op<Op>::apply(op, left[i], right[i]);
}

/// bytes from src to dst, 16 at a time when both are aligned (else byte by byte), shared like
/// reduce_range. They must not overlap.
__device__ __forceinline__ void copy_range(std::byte* dst, const std::byte* src, std::size_t bytes, std::size_t tid,
                                           std::size_t nthreads) {
  std::size_t head = 0;
  if (((reinterpret_cast<std::uintptr_t>(dst) | reinterpret_cast<std::uintptr_t>(src)) % 16) == 0) {
    const std::size_t nv = bytes / 16;
    auto* d = reinterpret_cast<uint4*>(dst);
    const auto* s = reinterpret_cast<const uint4*>(src);
    for (std::size_t i = tid; i < nv; i += nthreads) d[i] = s[i];
    head = nv * 16;
  }
  for (std::size_t i = head + tid; i < bytes; i += nthreads) dst[i] = src[i];
}

/// The host's finalize (avg's division), on the device: in float for the narrow floats, in the
/// widest integer of the type's signedness for integers (n may not fit E), else in E.
template <class E, class Op>
__device__ __forceinline__ E finalize_one(E x, int n) {
  if constexpr (is_narrow_float_v<E>) return narrow<E>(widen(x) / float(n));
  else if constexpr (std::is_integral_v<E>) {
    using W = std::conditional_t<std::is_signed_v<E>, long long, unsigned long long>;
    return E(W(x) / W(n));
  } else return E(x / E(n));
}

template <class E, class Op>
__global__ void reduce_kernel(Op op, E* dst, const E* left, const E* right, std::size_t n) {
  reduce_range<E>(op, dst, left, right, n, std::size_t(blockIdx.x) * blockDim.x + threadIdx.x,
                  std::size_t(gridDim.x) * blockDim.x);
}

template <class E, class Op>
__global__ void finalize_kernel(E* p, std::size_t n, int ranks) {
  for (std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += std::size_t(gridDim.x) * blockDim.x)
    p[i] = finalize_one<E, Op>(p[i], ranks);
}

/// Threads per block of collx's kernels.
inline constexpr int kThreads = 512;

/// Blocks for `bytes` of work: enough to fill the device (`sms` multiprocessors, 2 blocks each),
/// not more than there are 16-byte vectors to hand out.
inline int blocks_for(std::size_t bytes, int sms) {
  const std::size_t vectors = (bytes + 15) / 16;
  const std::size_t want = (vectors + kThreads - 1) / kThreads;
  const std::size_t most = std::size_t(sms > 0 ? sms : 1) * 2;
  return int(want < 1 ? 1 : want > most ? most : want);
}

/// dst = left ⊕ right on `stream`, device pointers.
template <class E, class Op>
cudaError_t reduce(const Op& op, E* dst, const E* left, const E* right, std::size_t n, cudaStream_t stream, int sms) {
  if (n == 0) return cudaSuccess;
  reduce_kernel<E, Op><<<blocks_for(n * sizeof(E), sms), kThreads, 0, stream>>>(op, dst, left, right, n);
  return cudaGetLastError();
}

template <class E, class Op>
cudaError_t finalize(E* p, std::size_t n, int ranks, cudaStream_t stream, int sms) {
  if (n == 0) return cudaSuccess;
  finalize_kernel<E, Op><<<blocks_for(n * sizeof(E), sms), kThreads, 0, stream>>>(p, n, ranks);
  return cudaGetLastError();
}

}  // namespace collx::cuda
