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
    const std::uint32_t c = a < 0x3C800000u ? sub : normal;
    return std::uint8_t(sign | std::min(c, 0x7Eu));  // (saturates at 448)
  }
  /// The value of code c (unscaled).
  static float value(std::uint8_t c) noexcept {
    const std::uint32_t e = (c >> 3) & 15u, m = c & 7u;
    const float normal = std::bit_cast<float>(((e + 120u) << 23) | (m << 20));
    const float sub = float(m) * 0x1p-9f;
    const float mag = e == 0 ? sub : normal;
    return (c & 0x80u) ? -mag : mag;
  }
  /// The scale byte of a block whose largest magnitude is amax: 127 + ceil(log2(amax / 448)),
  /// within [0, 254]; 255 (no finite scale) where amax is not finite.
  static std::uint8_t scale_of(float amax) noexcept {
    if (!(amax <= 3.4e38f)) return 255;  // inf or NaN
    if (amax == 0) return 0;
    int k = 0;
    const float m = std::frexp(amax / max_value, &k);  // amax / 448 = m 2^k, m in [0.5, 1)
    const int e = m == 0.5f ? k - 1 : k;                 // ceil(log2(amax / 448))
    return std::uint8_t(std::clamp(e + 127, 0, 254));
  }
  static float scale(std::uint8_t s) noexcept { return s == 255 ? NAN : std::ldexp(1.0f, int(s) - 127); }

  static void encode(const float* x, std::size_t n, unit* out) noexcept {
    for (std::size_t at = 0; at < n; at += group, out += group + 1) {
      const std::size_t len = std::min(group, n - at);
      float amax = 0;
      bool finite = true;  // (a NaN or an infinity makes the whole block NaN: scale byte 255)
      for (std::size_t i = 0; i < len; ++i) {
        const float m = std::fabs(x[at + i]);
        amax = std::max(amax, m);
        finite &= m <= 3.4028235e38f;
      }
      const std::uint8_t s = finite ? scale_of(amax) : std::uint8_t(255);
      out[0] = s;
      const float inv = s == 255 ? NAN : std::ldexp(1.0f, 127 - int(s));
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
