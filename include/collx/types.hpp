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
inline float half_bits_to_float(std::uint16_t h) noexcept {
  const std::uint32_t sign = std::uint32_t(h & 0x8000u) << 16;
  std::uint32_t exp = (h >> 10) & 0x1fu;
  std::uint32_t man = h & 0x3ffu;
  std::uint32_t bits;
  if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      exp = 127 - 15 + 1;
      while ((man & 0x400u) == 0) { man <<= 1; --exp; }
      man &= 0x3ffu;
      bits = sign | (exp << 23) | (man << 13);
    }
  } else if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (man << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
  }
  return std::bit_cast<float>(bits);
}

inline std::uint16_t float_to_half_bits(float f) noexcept {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  const std::uint16_t sign = std::uint16_t((x >> 16) & 0x8000u);
  const std::uint32_t absx = x & 0x7fffffffu;
  if (absx >= 0x7f800000u)  // inf or nan
    return std::uint16_t(sign | 0x7c00u | (absx > 0x7f800000u ? 0x200u : 0u));
  if (absx >= 0x477ff000u) return std::uint16_t(sign | 0x7c00u);  // rounds to >= 65520: inf
  if (absx < 0x38800000u) {  // below the smallest normal half: subnormal or zero
    if (absx < 0x33000000u) return sign;  // < 2^-25 rounds to zero
    // value = man * 2^(e-150) with the implicit bit in man; a half subnormal counts units of
    // 2^-24, so units = man >> (126 - e), rounded to nearest even on the dropped bits.
    const std::uint32_t man = (absx & 0x7fffffu) | 0x800000u;
    const std::uint32_t drop = 126u - (absx >> 23);  // 14..24
    std::uint32_t units = man >> drop;
    const std::uint32_t rem = man & ((1u << drop) - 1u);
    const std::uint32_t halfway = 1u << (drop - 1);
    if (rem > halfway || (rem == halfway && (units & 1u))) ++units;
    return std::uint16_t(sign | units);
  }
  // normal: rebias exponent, round mantissa from 23 to 10 bits
  std::uint32_t bits = ((absx >> 23) - 127 + 15) << 10 | ((absx >> 13) & 0x3ffu);
  const std::uint32_t rem = absx & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (bits & 1u))) ++bits;  // may carry into the exponent: correct
  return std::uint16_t(sign | bits);
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
