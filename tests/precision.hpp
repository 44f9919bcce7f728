#pragma once
// A reduction's error against a float64 reference, in units in the last place (ulp) of the
// result's element type: test_deterministic's bound (one rounding is within 0.5 ulp) and
// collx-precision's table of each policy's error (docs/precision.md) measure it alike.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <vector>

#include <collx/core/types.hpp>

namespace collx_precision {

/// A floating type's significand bits (the hidden one counted) and its smallest normal exponent.
template <class E>
struct format;
template <>
struct format<float> {
  static constexpr int digits = 24, min_exponent = -126;
};
template <>
struct format<collx::half> {
  static constexpr int digits = 11, min_exponent = -14;
};
template <>
struct format<collx::bfloat16> {
  static constexpr int digits = 8, min_exponent = -126;
};

/// The spacing of E's values at x (at its subnormals below the smallest normal).
template <class E>
double ulp(double x) {
  const int e = x == 0 ? format<E>::min_exponent : std::max(std::ilogb(x), format<E>::min_exponent);
  return std::ldexp(1.0, e - (format<E>::digits - 1));
}

/// Rank r's input element i: ±m, m in [2^-6, 1], a value of E, from a hash of (seed, r, i).
/// Every such value is a multiple of 2^-29 (float), 2^-16 (half) or 2^-13 (bfloat16), so a sum of
/// up to 64 of them is exact in double, and for half and bfloat16 in float (22 bits at most): the
/// float64 reference is the exact sum, and one rounding of a float accumulator (double for float)
/// is the correctly rounded result.
template <class E>
E input(int r, std::size_t i, std::uint64_t seed = 1) {
  std::uint64_t h = (seed * 0xD1B54A32D192ED03ull) ^ (std::uint64_t(r) + 1) * 0x9E3779B97F4A7C15ull ^
                    (std::uint64_t(i) + 7) * 0xC2B2AE3D27D4EB4Full;
  h ^= h >> 29;
  h *= 0xBF58476D1CE4E5B9ull;
  h ^= h >> 32;
  const double u = double(h & 0xFFFFFF) / double(0x1000000);  // [0, 1)
  const double m = std::ldexp(1.0, -6) + u * (1 - std::ldexp(1.0, -6));
  return E(float((h >> 40) & 1 ? -m : m));
}

/// The exact (float64) sums of n ranks' inputs (input()), and the sums of their magnitudes
/// (what a rounding per step is bounded by: |error| <= (steps) x u x sum |x_i|).
struct exact {
  std::vector<double> sum, magnitude;
};
template <class E>
exact exact_sums(int n, std::size_t count, std::uint64_t seed = 1) {
  exact x{std::vector<double>(count), std::vector<double>(count)};
  for (std::size_t i = 0; i < count; ++i)
    for (int r = 0; r < n; ++r) {
      const double v = double(float(input<E>(r, i, seed)));
      x.sum[i] += v;
      x.magnitude[i] += std::fabs(v);
    }
  return x;
}

/// The error of a result against the exact sums, element by element: in ulp of E at the exact
/// sum (0.5 at most for a correctly rounded sum), and in ulp of E at the sum of the magnitudes
/// (which does not blow up where the ranks' inputs cancel).
struct error {
  double max_ulp = 0;        // the largest |result - exact| / ulp(exact)
  double max_of_sum_abs = 0;  // the largest |result - exact| / ulp(sum |x_i|)
  std::size_t wrong = 0;     // elements that are not the correctly rounded sum
  std::size_t worst = 0;     // the element of max_ulp
  std::vector<double> ulps;  // each element's |result - exact| / ulp(exact)

  template <class E>
  void add(const E* result, const exact& x, std::size_t count) {
    for (std::size_t i = 0; i < count; ++i) {
      const double d = std::fabs(double(float(result[i])) - x.sum[i]);
      const double e = d / ulp<E>(x.sum[i]);
      if (e > max_ulp) {
        max_ulp = e;
        worst = ulps.size();
      }
      max_of_sum_abs = std::max(max_of_sum_abs, d / ulp<E>(x.magnitude[i]));
      ulps.push_back(e);
      // the correctly rounded sum: the exact sum (a float for half and bfloat16, a double for
      // float, by input()'s range) rounded to E once
      const E want = E(float(x.sum[i]));
      wrong += float(want) != float(result[i]);
    }
  }
  std::size_t n() const { return ulps.size(); }
  double wrong_fraction() const { return ulps.empty() ? 0 : double(wrong) / double(ulps.size()); }
  /// The q-quantile (0..1) of the elements' errors in ulp.
  double quantile(double q) const {
    if (ulps.empty()) return 0;
    std::vector<double> v = ulps;
    const auto k = std::size_t(q * double(v.size() - 1));
    std::nth_element(v.begin(), v.begin() + std::ptrdiff_t(k), v.end());
    return v[k];
  }
};

}  // namespace collx_precision
