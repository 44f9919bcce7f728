#pragma once
// What each generated instance TU (cmake/cuda_instances.cmake) instantiates, and the check the
// GPU tests run for every element type x op: the device reduction (16-byte path and the
// unaligned tail) and avg's finalize against a host reference computed with the host-callable
// conversions of cuda_fp16.h, cuda_bf16.h and cuda_fp8.h.
#include <collx/cuda/plan_kernel.cuh>
#include <collx/cuda/reduce.cuh>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

// Every kernel collx launches, for one element type and op.
#define COLLX_CUDA_INSTANTIATE(E, OP)                                                                                  \
  template __global__ void collx::cuda::reduce_kernel<E, OP>(OP, E*, const E*, const E*, std::size_t);                 \
  template __global__ void collx::cuda::finalize_kernel<E, OP>(E*, std::size_t, int);                                  \
  template __global__ void collx::cuda::plan_kernel<E, OP>(collx::cuda::plan_args, OP);

namespace collx_cuda_test {

using check_fn = std::string (*)();
struct instance {
  const char* type;
  const char* op;
  check_fn check;
};
std::vector<instance> all_instances();

template <class E>
double as_double(E x) {
  if constexpr (std::is_same_v<E, __half>) return double(__half2float(x));
  else if constexpr (std::is_same_v<E, __nv_bfloat16>) return double(__bfloat162float(x));
  else if constexpr (std::is_same_v<E, __nv_fp8_e4m3> || std::is_same_v<E, __nv_fp8_e5m2>) return double(float(x));
  else return double(x);
}
template <class E>
E from_float(float f) {
  if constexpr (std::is_same_v<E, __half>) return __float2half_rn(f);
  else if constexpr (std::is_same_v<E, __nv_bfloat16>) return __float2bfloat16_rn(f);
  else if constexpr (std::is_same_v<E, __nv_fp8_e4m3> || std::is_same_v<E, __nv_fp8_e5m2>) return E(f);
  else return E(f);
}
template <class E>
inline constexpr bool narrow_v = collx::cuda::is_narrow_float_v<E>;

/// The reference: what the op means, in float for the narrow types, rounded once.
template <class E, class Op>
E ref_apply(E a, E b) {
  if constexpr (narrow_v<E>) {
    const float x = float(as_double(a)), y = float(as_double(b));
    if constexpr (std::is_same_v<Op, collx::ops::sum> || std::is_same_v<Op, collx::ops::avg>) return from_float<E>(x + y);
    else if constexpr (std::is_same_v<Op, collx::ops::prod>) return from_float<E>(x * y);
    else if constexpr (std::is_same_v<Op, collx::ops::min>) return y < x ? b : a;
    else return x < y ? b : a;
  } else {
    if constexpr (std::is_same_v<Op, collx::ops::sum> || std::is_same_v<Op, collx::ops::avg>) return E(a + b);
    else if constexpr (std::is_same_v<Op, collx::ops::prod>) return E(a * b);
    else if constexpr (std::is_same_v<Op, collx::ops::min>) return b < a ? b : a;
    else if constexpr (std::is_same_v<Op, collx::ops::max>) return a < b ? b : a;
    else if constexpr (std::is_same_v<Op, collx::ops::band>) return E(a & b);
    else if constexpr (std::is_same_v<Op, collx::ops::bor>) return E(a | b);
    else return E(a ^ b);
  }
}

template <class E>
std::vector<E> values(std::size_t n, unsigned seed) {
  std::mt19937 g(seed);
  std::vector<E> v(n);
  for (auto& x : v) {
    if constexpr (std::is_integral_v<E>) x = E(g());
    else x = from_float<E>(std::uniform_real_distribution<float>(-4.0f, 4.0f)(g));
  }
  return v;
}

template <class E>
bool same_bits(E a, E b) {
  return std::memcmp(&a, &b, sizeof(E)) == 0;
}

/// "" or the first difference: dst = a ⊕ b on the device (an aligned run and a misaligned one),
/// then avg's finalize over 7 ranks, against the host.
template <class E, class Op>
std::string check_one() {
  const std::size_t n = 100003;
  const auto a = values<E>(n, 1), b = values<E>(n, 2);
  E *da = nullptr, *db = nullptr, *dd = nullptr;
  auto fail = [&](const std::string& s) {
    cudaFree(da);
    cudaFree(db);
    cudaFree(dd);
    return s;
  };
  if (cudaMalloc(&da, n * sizeof(E)) || cudaMalloc(&db, n * sizeof(E)) || cudaMalloc(&dd, n * sizeof(E))) return fail("cudaMalloc failed");
  cudaMemcpy(da, a.data(), n * sizeof(E), cudaMemcpyHostToDevice);
  cudaMemcpy(db, b.data(), n * sizeof(E), cudaMemcpyHostToDevice);
  for (std::size_t shift : {std::size_t(0), std::size_t(1)}) {
    const std::size_t m = n - shift;
    if (collx::cuda::reduce(Op{}, dd + shift, da + shift, db, m, nullptr, 132) != cudaSuccess) return fail("the reduce kernel did not launch");
    if (cudaDeviceSynchronize() != cudaSuccess) return fail("the reduce kernel failed");
    std::vector<E> got(n);
    cudaMemcpy(got.data(), dd, n * sizeof(E), cudaMemcpyDeviceToHost);
    for (std::size_t i = 0; i < m; ++i) {
      const E want = ref_apply<E, Op>(a[shift + i], b[i]);
      if (!same_bits(got[shift + i], want) && !(std::isnan(as_double(want)) && std::isnan(as_double(got[shift + i]))))
        return fail("shift " + std::to_string(shift) + ", element " + std::to_string(i) + ": " + std::to_string(as_double(got[shift + i])) +
                    " instead of " + std::to_string(as_double(want)));
    }
  }
  if constexpr (collx::has_finalize_v<Op, E> || std::is_same_v<Op, collx::ops::avg>) {
    if (collx::cuda::finalize<E, Op>(da, n, 7, nullptr, 132) != cudaSuccess || cudaDeviceSynchronize() != cudaSuccess)
      return fail("the finalize kernel failed");
    std::vector<E> got(n);
    cudaMemcpy(got.data(), da, n * sizeof(E), cudaMemcpyDeviceToHost);
    for (std::size_t i = 0; i < n; ++i) {
      E want;
      if constexpr (narrow_v<E>) want = from_float<E>(float(as_double(a[i])) / 7.0f);
      else if constexpr (std::is_integral_v<E>) {
        using W = std::conditional_t<std::is_signed_v<E>, long long, unsigned long long>;
        want = E(W(a[i]) / W(7));
      } else want = E(a[i] / E(7));
      if (!same_bits(got[i], want)) return fail("finalize, element " + std::to_string(i) + ": " + std::to_string(as_double(got[i])) +
                                                " instead of " + std::to_string(as_double(want)));
    }
  }
  return fail("");
}

}  // namespace collx_cuda_test
