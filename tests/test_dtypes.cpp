// Every element type with sum, over every reducing collective and policy.
#include <catch2/catch.hpp>

#include "harness.hpp"

using namespace collx_test;
using collx::ops::sum;

#define COLLX_POLICIES collx::algo::ring, collx::algo::tree, collx::algo::recursive_halving

TEMPLATE_PRODUCT_TEST_CASE("every dtype sums exactly", "[dtypes]", std::tuple,
                           ((std::int8_t, collx::algo::ring), (std::uint8_t, collx::algo::tree),
                            (std::int16_t, collx::algo::recursive_halving), (std::uint16_t, collx::algo::ring),
                            (std::int32_t, collx::algo::tree), (std::uint32_t, collx::algo::recursive_halving),
                            (std::int64_t, collx::algo::ring), (std::uint64_t, collx::algo::tree),
                            (float, collx::algo::recursive_halving), (double, collx::algo::ring),
                            (collx::half, collx::algo::tree), (collx::half, collx::algo::ring),
                            (collx::half, collx::algo::recursive_halving), (collx::bfloat16, collx::algo::ring),
                            (collx::bfloat16, collx::algo::tree), (collx::bfloat16, collx::algo::recursive_halving),
                            (double, collx::algo::tree), (float, collx::algo::ring))) {
  using E = std::tuple_element_t<0, TestType>;
  using A = std::tuple_element_t<1, TestType>;
  for (int n : {1, 3, 8, 13})
    for (std::size_t count : {std::size_t(n + 1), std::size_t(100003)}) {
      CAPTURE(n, count);
      CHECK(run_all_reduce<E, sum, A>(n, count, false) == "");
      CHECK(run_all_reduce<E, sum, A>(n, count, true) == "");
      CHECK(run_reduce_scatter<E, sum, A>(n, count / std::size_t(n) + 1) == "");
      CHECK(run_reduce<E, sum, A>(n, count, n / 2) == "");
    }
}
