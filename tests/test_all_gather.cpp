#include <catch2/catch.hpp>

#include "harness.hpp"

using namespace collx_test;

TEMPLATE_TEST_CASE("all_gather delivers every block to every rank", "[all_gather]", collx::algo::ring,
                   collx::algo::tree, collx::algo::recursive_halving, collx::algo::pairwise,
                   collx::algo::automatic) {
  for (int n : rank_counts())
    for (std::size_t count : counts_for(n)) {
      const std::size_t k = count / std::size_t(n) + (count % 2);
      CAPTURE(n, k);
      CHECK(run_all_gather<float, TestType>(n, k) == "");
      CHECK(run_all_gather<std::uint8_t, TestType>(n, k) == "");
    }
}

TEMPLATE_TEST_CASE("all_gather in place: the input is this rank's block of the output", "[all_gather][in_place]",
                   collx::algo::ring, collx::algo::tree, collx::algo::recursive_halving, collx::algo::pairwise,
                   collx::algo::automatic) {
  // before: refused as "the input and output overlap"
  for (int n : rank_counts())
    for (std::size_t count : counts_for(n)) {
      const std::size_t k = count / std::size_t(n) + (count % 2);
      CAPTURE(n, k);
      CHECK(run_all_gather_in_place<float, TestType>(n, k) == "");
    }
  CHECK(run_all_gather_in_place<std::int32_t, collx::algo::automatic, processes>(5, 100003) == "");
  CHECK(run_all_gather_in_place<std::int32_t, collx::algo::automatic, processes_tcp>(3, 1001) == "");
}
