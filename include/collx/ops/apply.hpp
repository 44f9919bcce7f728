#pragma once
// The host reduction loop: dst[i] = left[i] ⊕ right[i]. It is the inner loop of every reducing
// collective, so it is written for the vectoriser: three loops for the three aliasing cases
// (accumulate into left, into right, or into a third buffer), each with restrict-qualified
// pointers, so the compiler needs no runtime overlap check and emits packed SIMD for the
// arithmetic types. bench/reduce_bench.cpp measures it against memcpy and a plain add loop.
#include <cstddef>
#include <cstring>

#include "../core/concepts.hpp"

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
