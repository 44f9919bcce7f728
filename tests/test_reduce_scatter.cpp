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

TEMPLATE_TEST_CASE("reduce_scatter in place: the output is this rank's block of the input", "[reduce_scatter][in_place]",
                   collx::algo::ring, collx::algo::tree, collx::algo::recursive_halving, collx::algo::automatic) {
  // before: refused as "the input and output overlap"
  for (int n : rank_counts())
    for (std::size_t count : counts_for(n)) {
      const std::size_t k = count / std::size_t(n) + (count % 2);
      CAPTURE(n, k);
      CHECK(run_reduce_scatter_in_place<float, collx::ops::sum, TestType>(n, k) == "");
      CHECK(run_reduce_scatter_in_place<std::int32_t, collx::ops::avg, TestType>(n, k) == "");
    }
  CHECK(run_reduce_scatter_in_place<float, collx::ops::sum, collx::algo::automatic, processes>(5, 100003) == "");
  CHECK(run_reduce_scatter_in_place<float, collx::ops::sum, collx::algo::automatic, processes_tcp>(3, 1001) == "");
}
