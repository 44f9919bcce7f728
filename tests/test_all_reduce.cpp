#include <catch2/catch.hpp>

#include "harness.hpp"

using namespace collx_test;

TEMPLATE_TEST_CASE("all_reduce equals the serial reference for every rank count and size", "[all_reduce]",
                   collx::algo::ring, collx::algo::tree, collx::algo::recursive_halving, collx::algo::recursive_doubling,
                   collx::algo::automatic) {
  for (int n : rank_counts())
    for (std::size_t count : counts_for(n))
      for (bool in_place : {false, true}) {
        CAPTURE(n, count, in_place);
        CHECK(run_all_reduce<float, collx::ops::sum, TestType>(n, count, in_place) == "");
        CHECK(run_all_reduce<std::int32_t, collx::ops::sum, TestType>(n, count, in_place) == "");
      }
}

TEST_CASE("all_reduce with a small chunk pipelines the tree and ring chains", "[all_reduce]") {
  for (int n : {3, 6, 8}) {
    CAPTURE(n);
    CHECK(run_all_reduce<float, collx::ops::sum>(n, 10007, false, collx::ops::sum{}, collx::algo::tree{.chunk_bytes = 1024}) == "");
    CHECK(run_all_reduce<float, collx::ops::sum>(n, 10007, true, collx::ops::sum{}, collx::algo::tree{.chunk_bytes = 100}) == "");
  }
}

TEMPLATE_TEST_CASE("a large all_reduce runs in segments and still equals the reference", "[all_reduce][segments]",
                   collx::algo::ring, collx::algo::recursive_halving, collx::algo::automatic) {
  // Past tuning::all_reduce_segment_from_bytes, with a partial last segment.
  const std::size_t count = collx::algo::tuning::all_reduce_segment_from_bytes / 4 + 262147;
  for (int n : {1, 3, 5}) {
    CAPTURE(n);
    CHECK(run_all_reduce<float, collx::ops::sum, TestType>(n, count, false) == "");
    // (Under TSan the segments' hand-offs between threads are the first call's; other types and
    // ops, in place, are the same traffic: ~1 min of CI's TSan stage.)
    if (kThreadSanitizer) continue;
    CHECK(run_all_reduce<float, collx::ops::avg, TestType>(n, count, true) == "");
    CHECK(run_all_reduce<std::int32_t, collx::ops::max, TestType>(n, count, true) == "");
  }
  CHECK(run_all_reduce<float, collx::ops::sum, TestType, processes>(3, count, true) == "");
}
