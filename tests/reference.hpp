#pragma once
// Inputs whose reductions are exact in any order, and a serial reference to check against.
//
// The nccl-tests technique: pick values so that every partial result of the reduction is exactly
// representable in the element type, whatever order a policy combines them in. Then floats can be
// compared bit for bit, like integers. Sums use small integers (at most 16 ranks: rank values in
// [0, 8) keep every partial sum <= 120, exact even in bfloat16's 8-bit significand); products use
// ±1 and a rare 2, so the magnitude stays a small power of two.
#include <collx/collx.hpp>

#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

namespace collx_test {

using collx::bfloat16;
using collx::half;

template <class E>
E from_int(long v) {
  if constexpr (collx::is_reduced_float_v<E>) return E(float(v));
  else return static_cast<E>(v);
}

/// The input of `rank` at element i for reductions with op Op.
template <class E, class Op>
E input(int rank, std::size_t i) {
  const long h = long((i * 2654435761u + std::size_t(rank) * 40503u) % 1000003u);
  if constexpr (std::is_same_v<Op, collx::ops::prod>) {
    if ((i + std::size_t(rank)) % 11 == 0) return from_int<E>(2);
    if constexpr (std::is_unsigned_v<E>) return from_int<E>(1);
    else return from_int<E>(h % 3 == 0 ? -1 : 1);
  } else if constexpr (std::is_same_v<Op, collx::ops::min> || std::is_same_v<Op, collx::ops::max>) {
    if constexpr (std::is_unsigned_v<E>) return from_int<E>(h % 100);
    else return from_int<E>(h % 100 - 50);
  } else if constexpr (std::is_same_v<Op, collx::ops::band> || std::is_same_v<Op, collx::ops::bor> ||
                       std::is_same_v<Op, collx::ops::bxor>) {
    return static_cast<E>(h * 7919 + rank);
  } else {  // sum, avg and anything additive
    return from_int<E>(h % 8);
  }
}

/// Plain data for payload-only collectives: distinct per rank and position, exact in every type.
template <class E>
E payload(int rank, std::size_t i) {
  if constexpr (std::is_trivially_constructible_v<E> && !std::is_arithmetic_v<E> && !collx::is_reduced_float_v<E>) {
    E e;
    std::memset(&e, rank * 31 + int(i % 97), sizeof e);
    return e;
  } else {
    return from_int<E>(long((std::size_t(rank) * 131 + i * 7) % 113));
  }
}

/// The serial reference: in_0 ⊕ in_1 ⊕ ... ⊕ in_(n-1), left to right, then finalize.
template <class E, class Op>
E reduced(const Op& op, int n, std::size_t i) {
  E acc = input<E, Op>(0, i);
  for (int r = 1; r < n; ++r) acc = op(acc, input<E, Op>(r, i));
  if constexpr (collx::has_finalize_v<Op, E>) acc = Op::finalize(acc, n);
  return acc;
}

template <class E>
bool same(const E& a, const E& b) {
  return std::memcmp(&a, &b, sizeof(E)) == 0;
}

/// Per-rank failure notes, filled by the rank threads and asserted on the main thread (Catch2
/// assertions are not thread-safe).
struct failures {
  std::vector<std::string> notes;
  explicit failures(int n) : notes(std::size_t(n)) {}
  void note(int rank, const std::string& s) {
    if (notes[std::size_t(rank)].empty()) notes[std::size_t(rank)] = s;
  }
  std::string first() const {
    for (std::size_t r = 0; r < notes.size(); ++r)
      if (!notes[r].empty()) return "rank " + std::to_string(r) + ": " + notes[r];
    return {};
  }
};

/// A well-mixed 64-bit hash of (rank, i): the bits test inputs are drawn from; u() of it is in
/// [-1, 1) with 24 bits, and its bits 24 and up are free for an exponent.
inline std::uint64_t mixed(int rank, std::size_t i) {
  std::uint64_t h = (std::uint64_t(rank) + 1) * 0x9E3779B97F4A7C15ull ^ (std::uint64_t(i) + 7) * 0xC2B2AE3D27D4EB4Full;
  h ^= h >> 29;
  h *= 0xBF58476D1CE4E5B9ull;
  h ^= h >> 32;
  return h;
}
inline double unit_of(std::uint64_t h) { return double(h & 0xFFFFFF) / double(0x1000000) * 2 - 1; }

inline std::vector<std::size_t> counts_for(int n) {
  return {0, 1, std::size_t(n > 1 ? n - 1 : 2), std::size_t(n), std::size_t(n + 1), 100003};
}

/// Whether this build runs under ThreadSanitizer: its run is for who touches what, and some
/// sweeps there keep to the cases that differ in that (their other cases run under ASan).
#if defined(__SANITIZE_THREAD__)
inline constexpr bool kThreadSanitizer = true;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
inline constexpr bool kThreadSanitizer = true;
#else
inline constexpr bool kThreadSanitizer = false;
#endif
#else
inline constexpr bool kThreadSanitizer = false;
#endif

/// The rank counts a sweep runs: under ThreadSanitizer those that differ in who touches what
/// (one, two, odd, a power of two, a large odd count), the others under ASan (16 thread-ranks of
/// every policy and size were most of the TSan stage's two longest tests: test_all_reduce 90 s,
/// test_broadcast_reduce 68 s, at 4dcaf23).
inline const std::vector<int>& rank_counts() {
  static const std::vector<int> v = kThreadSanitizer ? std::vector<int>{1, 2, 3, 5, 8, 13} : std::vector<int>{1, 2, 3, 4, 5, 7, 8, 13, 16};
  return v;
}

}  // namespace collx_test
