#pragma once
// collx::half (IEEE binary16) and collx::bfloat16: 16-bit storage types. Arithmetic on them goes
// through float: a reduction widens both operands, computes in float and rounds once per step
// (round to nearest, ties to even), which is what NCCL does for these types on the host side.
#include <bit>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

namespace collx {

namespace detail {
/// c ? a : b without a branch: written with masks so the compiler cannot sink the (already
/// computed) alternatives into branches, which under the default -ftrapping-math would stop it
/// from vectorising loops over half.
constexpr std::uint32_t select(bool c, std::uint32_t a, std::uint32_t b) noexcept {
  const std::uint32_t m = 0u - std::uint32_t(c);
  return (a & m) | (b & ~m);
}

// Branch-light conversions (after F. Giesen's public-domain half<->float routines): the special
// cases become selects, so the compiler can vectorise a reduction loop over half. Checked
// against the compiler's _Float16 for every half and for millions of floats (tests/test_types).
inline float half_bits_to_float(std::uint16_t h) noexcept {
  constexpr std::uint32_t shifted_exp = 0x7c00u << 13;
  std::uint32_t o = std::uint32_t(h & 0x7fffu) << 13;
  const std::uint32_t exp = shifted_exp & o;
  o += (127u - 15u) << 23;
  const std::uint32_t inf_nan = o + ((128u - 16u) << 23);
  // zero or subnormal: renormalise through a float subtraction
  const float sub = std::bit_cast<float>(o + (1u << 23)) - std::bit_cast<float>(113u << 23);
  o = select(exp == shifted_exp, inf_nan, select(exp == 0, std::bit_cast<std::uint32_t>(sub), o));
  return std::bit_cast<float>(o | (std::uint32_t(h & 0x8000u) << 16));
}

/// float -> half, round to nearest, ties to even; overflow gives inf, NaN a quiet NaN.
inline std::uint16_t float_to_half_bits(float f) noexcept {
  constexpr std::uint32_t f32infty = 255u << 23, f16max = (127u + 16u) << 23;
  constexpr std::uint32_t magic_bits = ((127u - 15u) + (23u - 10u) + 1u) << 23;
  std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  const std::uint32_t sign = x & 0x80000000u;
  x ^= sign;
  // subnormal or zero: let the FPU round by adding a magic number
  const float sub = std::bit_cast<float>(x) + std::bit_cast<float>(magic_bits);
  const std::uint32_t o_sub = std::bit_cast<std::uint32_t>(sub) - magic_bits;
  // normal: rebias, round to nearest even on the 13 dropped bits
  const std::uint32_t mant_odd = (x >> 13) & 1u;
  const std::uint32_t o_norm = (x + ((15u - 127u) << 23) + 0xfffu + mant_odd) >> 13;
  const std::uint32_t o_big = select(x > f32infty, 0x7e00u, 0x7c00u);
  const std::uint32_t o = select(x >= f16max, o_big, select(x < (113u << 23), o_sub, o_norm));
  return std::uint16_t(o | (sign >> 16));
}

inline std::uint16_t float_to_bf16_bits(float f) noexcept {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return std::uint16_t((x >> 16) | 0x40u);  // quiet nan
  const std::uint32_t rounding = 0x7fffu + ((x >> 16) & 1u);
  return std::uint16_t((x + rounding) >> 16);
}
}  // namespace detail

/// IEEE 754 binary16. Converts to and from float; arithmetic is done in float by the caller.
struct half {
  std::uint16_t bits = 0;
  half() = default;
  half(float f) noexcept : bits(detail::float_to_half_bits(f)) {}  // NOLINT: implicit, like a float
  operator float() const noexcept { return detail::half_bits_to_float(bits); }
  static half from_bits(std::uint16_t b) noexcept { half h; h.bits = b; return h; }
  friend bool operator==(half a, half b) noexcept { return a.bits == b.bits; }
};

/// bfloat16: the upper half of a float. Converts to and from float (round to nearest even).
struct bfloat16 {
  std::uint16_t bits = 0;
  bfloat16() = default;
  bfloat16(float f) noexcept : bits(detail::float_to_bf16_bits(f)) {}  // NOLINT: implicit, like a float
  operator float() const noexcept { return std::bit_cast<float>(std::uint32_t(bits) << 16); }
  static bfloat16 from_bits(std::uint16_t b) noexcept { bfloat16 h; h.bits = b; return h; }
  friend bool operator==(bfloat16 a, bfloat16 b) noexcept { return a.bits == b.bits; }
};

/// True for the 16-bit floating types whose arithmetic collx performs in float.
template <class E>
inline constexpr bool is_reduced_float_v = std::is_same_v<E, half> || std::is_same_v<E, bfloat16>;

/// The type a reduction computes in: float for half and bfloat16, E itself otherwise.
template <class E>
using compute_type_t = std::conditional_t<is_reduced_float_v<E>, float, E>;

}  // namespace collx
