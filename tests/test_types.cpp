// half and bfloat16 against independent references: the compiler's _Float16 for half, and a
// nearest-neighbour search for bfloat16.
#include <catch2/catch.hpp>

#include <bit>
#include <cmath>
#include <cstring>
#include <random>

#include <collx/collx.hpp>

// The reference needs the compiler's _Float16 (GCC 12 on x86-64 has it; clang 14, which builds the
// sanitizer suites, does not): the release build checks half against it.
#ifdef __FLT16_MAX__
TEST_CASE("half converts to float exactly like _Float16, for every bit pattern", "[types]") {
  for (std::uint32_t b = 0; b < 65536; ++b) {
    const auto h = collx::half::from_bits(std::uint16_t(b));
    _Float16 ref;
    const auto b16 = std::uint16_t(b);
    std::memcpy(&ref, &b16, 2);
    const float want = float(ref);
    const float got = float(h);
    if (std::isnan(want)) {
      CHECK(std::isnan(got));
    } else if (std::bit_cast<std::uint32_t>(got) != std::bit_cast<std::uint32_t>(want)) {
      CAPTURE(b, got, want);
      FAIL("half -> float differs");
    }
  }
}

TEST_CASE("float rounds to half like _Float16 (nearest, ties to even)", "[types]") {
  std::mt19937 rng(12345);
  std::uniform_int_distribution<std::uint32_t> bits;
  int checked = 0;
  for (int i = 0; i < 2'000'000; ++i) {
    std::uint32_t x = bits(rng);
    if (i % 4 == 0) x = (x & 0x8000'0000u) | (0x3300'0000u + (x % 0x1500'0000u));  // the half range, subnormals included
    const float f = std::bit_cast<float>(x);
    if (std::isnan(f)) continue;
    const _Float16 ref = _Float16(f);
    std::uint16_t want;
    std::memcpy(&want, &ref, 2);
    const collx::half got(f);
    if (got.bits != want) {
      CAPTURE(x, f, got.bits, want);
      FAIL("float -> half differs");
    }
    ++checked;
  }
  CHECK(checked > 1'000'000);
}
#endif  // __FLT16_MAX__

TEST_CASE("float rounds to the nearest bfloat16, ties to even", "[types]") {
  std::mt19937 rng(777);
  std::uniform_int_distribution<std::uint32_t> bits;
  for (int i = 0; i < 1'000'000; ++i) {
    const std::uint32_t x = bits(rng);
    const float f = std::bit_cast<float>(x);
    if (std::isnan(f) || std::isinf(f)) continue;
    const collx::bfloat16 got(f);
    const std::uint16_t lo = std::uint16_t(x >> 16), hi = std::uint16_t(lo + 1);
    const double dl = std::abs(double(float(collx::bfloat16::from_bits(lo))) - double(f));
    // The value just past the largest finite bfloat16 is 2^128: rounding to it means overflow to inf.
    const bool hi_inf = (hi & 0x7fffu) == 0x7f80u;
    const double hv = hi_inf ? std::copysign(std::ldexp(1.0, 128), double(f)) : double(float(collx::bfloat16::from_bits(hi)));
    const double dh = std::abs(hv - double(f));
    const std::uint16_t want = dl < dh ? lo : dh < dl ? hi : (lo % 2 == 0 ? lo : hi);
    if (got.bits != want) {
      CAPTURE(x, got.bits, want);
      FAIL("float -> bfloat16 differs");
    }
  }
}

TEST_CASE("16-bit types reduce in float and round once per step", "[types]") {
  const collx::half a(1.0f), b(0.0004882812f);  // 1 + 2^-11: not representable, rounds to 1 (ties to even)
  const collx::half s = collx::ops::sum{}(a, b);
  CHECK(float(s) == 1.0f);
  const collx::bfloat16 x(3.0f), y(5.0f);
  CHECK(float(collx::ops::prod{}(x, y)) == 15.0f);
  CHECK(float(collx::ops::max{}(x, y)) == 5.0f);
}
