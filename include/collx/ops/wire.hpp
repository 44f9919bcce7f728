#pragma once
// Wire formats: how float values travel compressed (algo::compressed), and how a receiver adds
// what arrives to a float accumulator. A format packs values into units (the element type the
// collectives move): encode() packs n floats, add() adds n packed values to float accumulators,
// decode() unpacks them. Each loop is branch-free integer and float arithmetic, so the compiler
// vectorizes it.
//
//   wire::bf16    2 bytes a value: float rounded to bfloat16 (nearest even), as torch's bf16
//                 compression hook sends gradients. Relative error 2^-8 at most per rounding.
//   wire::mxfp8   33 bytes per 32 values: blocks of 32 sharing one power-of-two scale (a byte,
//                 E8M0), each value an 8-bit float e4m3 (1 sign, 4 exponent, 3 mantissa bits,
//                 largest 448), as OCP's MXFP8. The scale puts the block's largest magnitude in
//                 (224, 448]; a value's error is at most 2^-4 of itself, or 2^-10 of the scale
//                 (e4m3's subnormal step, 2^-9, halved) for the block's small values.
#include <algorithm>
#include <bit>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>

namespace collx::wire {

struct bf16 {
  using unit = std::uint16_t;
  static constexpr const char* name = "bf16";
  /// Values per group that shares anything (1: each value stands alone).
  static constexpr std::size_t group = 1;
  static constexpr std::size_t units(std::size_t n) noexcept { return n; }

  static void encode(const float* x, std::size_t n, unit* out) noexcept {
    for (std::size_t i = 0; i < n; ++i) {
      const std::uint32_t b = std::bit_cast<std::uint32_t>(x[i]);
      const std::uint32_t rounded = (b + 0x7FFFu + ((b >> 16) & 1u)) >> 16;
      const bool nan = (b & 0x7FFFFFFFu) > 0x7F800000u;
      out[i] = std::uint16_t(nan ? (b >> 16) | 0x40u : rounded);  // (a NaN stays a quiet NaN)
    }
  }
  static float value(unit u) noexcept { return std::bit_cast<float>(std::uint32_t(u) << 16); }
  static void add(const unit* in, std::size_t n, float* acc) noexcept {
    for (std::size_t i = 0; i < n; ++i) acc[i] += value(in[i]);
  }
  static void decode(const unit* in, std::size_t n, float* out) noexcept {
    for (std::size_t i = 0; i < n; ++i) out[i] = value(in[i]);
  }
};

struct mxfp8 {
  using unit = std::uint8_t;
  static constexpr const char* name = "mxfp8";
  static constexpr std::size_t group = 32;
  static constexpr float max_value = 448.0f;  // e4m3's largest: 1.75 x 2^8
  /// A block of 32 values: its scale byte, then 32 codes; a last partial block has fewer codes.
  static constexpr std::size_t units(std::size_t n) noexcept { return n + (n + group - 1) / group; }

  /// The e4m3 code of v (|v| <= 448 after the block's scale), rounded to nearest even.
  static std::uint8_t code(float v) noexcept {
    const std::uint32_t b = std::bit_cast<std::uint32_t>(v);
    const std::uint32_t sign = (b >> 24) & 0x80u, a = b & 0x7FFFFFFFu;
    // normal (|v| >= 2^-6): the float's exponent and top 3 mantissa bits, rounded; the carry of
    // the rounding runs into the exponent as it should; exponent bias 127 -> 7
    const std::uint32_t r = (a + 0x7FFFFu + ((a >> 20) & 1u)) >> 20;
    const std::uint32_t normal = r - (120u << 3);
    // subnormal (|v| < 2^-6): a multiple of 2^-9, rounded by the float addition itself (2^14's
    // spacing is 2^-9); 8 x 2^-9 = 2^-6 reads as the smallest normal, as it should
    const float mag = std::bit_cast<float>(a);
    const std::uint32_t sub = std::bit_cast<std::uint32_t>(mag + 16384.0f) - std::bit_cast<std::uint32_t>(16384.0f);
    const std::uint32_t small = 0u - std::uint32_t(a < 0x3C800000u);  // (masks, not branches: the loop vectorizes)
    const std::uint32_t c = (sub & small) | (normal & ~small);
    return std::uint8_t(sign | std::min(c, 0x7Eu));  // (saturates at 448)
  }
  /// The value of code c (unscaled).
  static float value(std::uint8_t c) noexcept {
    const std::uint32_t w = c, e = (w >> 3) & 15u, m = w & 7u;
    const std::uint32_t normal = ((e + 120u) << 23) | (m << 20);
    const std::uint32_t sub = std::bit_cast<std::uint32_t>(float(int(m)) * 0x1p-9f);
    const std::uint32_t small = 0u - std::uint32_t(e == 0);
    return std::bit_cast<float>((sub & small) | (normal & ~small) | ((w & 0x80u) << 24));
  }
  /// The scale byte of a block whose largest magnitude is amax: 127 + ceil(log2(amax / 448)),
  /// within [0, 254] (0 for a block of zeros). From amax's bits: amax = f 2^E, f in [1, 2), and
  /// 448 = 1.75 2^8, so the exponent is E - 8, or E - 7 where f > 1.75.
  static std::uint8_t scale_of(float amax) noexcept {
    const std::uint32_t b = std::bit_cast<std::uint32_t>(amax);
    if (b < 0x00800000u) return 0;  // zero or subnormal: the smallest scale (2^-127) serves
    const int e = int(b >> 23) - 127, k = e - 8 + ((b & 0x7FFFFFu) > 0x600000u ? 1 : 0);
    return std::uint8_t(std::clamp(k + 127, 0, 254));
  }
  /// 2^(s - 127) and its inverse, from their bits (NaN for 255); both normal floats for s in [1, 254].
  static float scale(std::uint8_t s) noexcept {
    if (s == 255) return NAN;
    return s == 0 ? 0x1p-127f : std::bit_cast<float>(std::uint32_t(s) << 23);
  }
  static float inverse(std::uint8_t s) noexcept {
    if (s == 255) return NAN;
    return s >= 254 ? 0x1p-127f : std::bit_cast<float>(std::uint32_t(254 - s) << 23);
  }

  static void encode(const float* x, std::size_t n, unit* out) noexcept {
    for (std::size_t at = 0; at < n; at += group, out += group + 1) {
      const std::size_t len = std::min(group, n - at);
      // the largest magnitude, on the bits (their order is the floats' for magnitudes; a NaN or
      // an infinity is above every finite one, and makes the whole block NaN: scale byte 255)
      std::uint32_t amax = 0;
      for (std::size_t i = 0; i < len; ++i) amax = std::max(amax, std::bit_cast<std::uint32_t>(x[at + i]) & 0x7FFFFFFFu);
      const std::uint8_t s = amax < 0x7F800000u ? scale_of(std::bit_cast<float>(amax)) : std::uint8_t(255);
      out[0] = s;
      const float inv = inverse(s);
      for (std::size_t i = 0; i < len; ++i) out[1 + i] = code(x[at + i] * inv);
    }
  }
  static void add(const unit* in, std::size_t n, float* acc) noexcept {
    for (std::size_t at = 0; at < n; at += group, in += group + 1) {
      const std::size_t len = std::min(group, n - at);
      const float s = scale(in[0]);
      for (std::size_t i = 0; i < len; ++i) acc[at + i] += value(in[1 + i]) * s;
    }
  }
  static void decode(const unit* in, std::size_t n, float* out) noexcept {
    for (std::size_t at = 0; at < n; at += group, in += group + 1) {
      const std::size_t len = std::min(group, n - at);
      const float s = scale(in[0]);
      for (std::size_t i = 0; i < len; ++i) out[at + i] = value(in[1 + i]) * s;
    }
  }
};

/// True for the wire formats above (and a user's with the same members).
template <class W>
concept WireFormat = requires(const float* x, float* y, typename W::unit* u, const typename W::unit* cu, std::size_t n) {
  { W::name } -> std::convertible_to<const char*>;
  { W::units(n) } -> std::convertible_to<std::size_t>;
  W::group;
  W::encode(x, n, u);
  W::add(cu, n, y);
  W::decode(cu, n, y);
};

}  // namespace collx::wire
