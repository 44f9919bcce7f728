#include <catch2/catch.hpp>

#include "harness.hpp"

using namespace collx_test;

TEMPLATE_TEST_CASE("reduce_scatter equals the serial reference for every rank count and size", "[reduce_scatter]",
                   collx::algo::ring, collx::algo::tree, collx::algo::recursive_halving, collx::algo::automatic) {
  for (int n : rank_counts())
    for (std::size_t count : counts_for(n)) {
      const std::size_t k = count / std::size_t(n) + (count % 2);  // per-rank block: 0, 1, and uneven totals
      CAPTURE(n, count, k);
      CHECK(run_reduce_scatter<float, collx::ops::sum, TestType>(n, k) == "");
      CHECK(run_reduce_scatter<std::int64_t, collx::ops::sum, TestType>(n, k) == "");
    }
}
