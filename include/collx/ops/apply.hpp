#pragma once
// The host reduction loop: dst[i] = left[i] ⊕ right[i]. It is the inner loop of every reducing
// collective, so it is written for the vectoriser: three loops for the three aliasing cases
// (accumulate into left, into right, or into a third buffer), each with restrict-qualified
// pointers, so the compiler needs no runtime overlap check and emits packed SIMD for the
// arithmetic types. bench/reduce_bench.cpp measures it against memcpy and a plain add loop.
#include <algorithm>
#include <cstddef>
#include <cstring>
#include <span>
#include <type_traits>

#include "../core/concepts.hpp"
#include "ops.hpp"

namespace collx::ops {

template <class E, class Op>
inline void apply(const Op& op, E* dst, const E* left, const E* right, std::size_t n) {
  if (dst == left) {
    E* __restrict d = dst;
    const E* __restrict r = right;
    for (std::size_t i = 0; i < n; ++i) d[i] = op(d[i], r[i]);
  } else if (dst == right) {
    E* __restrict d = dst;
    const E* __restrict l = left;
    for (std::size_t i = 0; i < n; ++i) d[i] = op(l[i], d[i]);
  } else {
    E* __restrict d = dst;
    const E* __restrict l = left;
    const E* __restrict r = right;
    for (std::size_t i = 0; i < n; ++i) d[i] = op(l[i], r[i]);
  }
}

/// dst[i] = src[0][i] ⊕ src[1][i] ⊕ ... in that order, in the accumulator type A (ops.hpp:
/// accumulator_t), rounded to E once. Taken in blocks, so each source is read as a stream the
/// vectoriser packs; dst may be one of the sources (a block is read whole before it is written).
/// finalize_n > 0: the op's finalize (avg: divided by finalize_n) on the accumulator, before the
/// rounding, so that a half or bfloat16 average is rounded once too.
template <class E, class Op>
inline void fold_into(const Op& op, E* dst, std::span<const E* const> src, std::size_t n, int finalize_n = 0) {
  using A = accumulator_t<Op, E>;
  static_assert(std::is_convertible_v<E, A> && std::is_constructible_v<E, A>,
                "collx: a fold accumulates in the op's accumulator type, which must convert from and to the element type");
  static_assert(!is_reduced_float_v<E> || !std::is_floating_point_v<A> || std::is_same_v<A, float>,
                "collx: half and bfloat16 accumulate in float (ops::accumulate_in<float>): they convert through float, so a "
                "double accumulator would round twice");
  static_assert(!std::is_floating_point_v<E> || sizeof(A) >= sizeof(E),
                "collx: the accumulator is at least as wide as the element type (ops::accumulate_in<double> for double)");
  constexpr std::size_t kBlock = 256;
  A acc[kBlock];
  for (std::size_t i0 = 0; i0 < n; i0 += kBlock) {
    const std::size_t m = std::min(kBlock, n - i0);
    const E* s0 = src[0] + i0;  // (dst may be this source: in place; a block is read before it is written)
    for (std::size_t j = 0; j < m; ++j) acc[j] = A(s0[j]);
    for (std::size_t k = 1; k < src.size(); ++k) {
      const E* __restrict sk = src[k] + i0;
      for (std::size_t j = 0; j < m; ++j) acc[j] = op(acc[j], A(sk[j]));
    }
    if constexpr (has_finalize_v<Op, A>)
      if (finalize_n > 0)
        for (std::size_t j = 0; j < m; ++j) acc[j] = Op::finalize(acc[j], finalize_n);
    E* d = dst + i0;
    for (std::size_t j = 0; j < m; ++j) d[j] = E(acc[j]);
  }
}

/// The type-erased host combiner for element type E and op Op; `op` must outlive its use.
template <class E, class Op>
combiner host_combiner(const Op& op) {
  combiner c;
  c.fn = [](const void* o, void* d, const void* l, const void* r, std::size_t n) {
    apply<E>(*static_cast<const Op*>(o), static_cast<E*>(d), static_cast<const E*>(l), static_cast<const E*>(r), n);
  };
  c.op = &op;
  c.elem_size = sizeof(E);
  return c;
}

}  // namespace collx::ops
