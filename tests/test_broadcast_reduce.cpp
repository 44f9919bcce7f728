#include <catch2/catch.hpp>

#include "harness.hpp"

using namespace collx_test;

TEMPLATE_TEST_CASE("broadcast delivers the root's buffer from every root", "[broadcast]", collx::algo::ring,
                   collx::algo::tree, collx::algo::recursive_halving, collx::algo::automatic) {
  for (int n : rank_counts())
    for (std::size_t count : counts_for(n))
      for (int root : {0, n / 2, n - 1}) {
        CAPTURE(n, count, root);
        CHECK(run_broadcast<float, TestType>(n, count, root) == "");
      }
}

TEST_CASE("the ring broadcast pipelines in chunks", "[broadcast]") {
  for (int n : {2, 5, 8}) {
    CAPTURE(n);
    CHECK(run_broadcast<std::int32_t>(n, 100003, 1 % n, collx::algo::ring{.chunk_bytes = 4096}) == "");
  }
}

TEMPLATE_TEST_CASE("reduce leaves the serial reference at every root", "[reduce]", collx::algo::ring, collx::algo::tree,
                   collx::algo::recursive_halving, collx::algo::automatic) {
  for (int n : rank_counts())
    for (std::size_t count : counts_for(n))
      for (int root : {0, n / 2, n - 1}) {
        CAPTURE(n, count, root);
        CHECK(run_reduce<float, collx::ops::sum, TestType>(n, count, root) == "");
        CHECK(run_reduce<std::int32_t, collx::ops::sum, TestType>(n, count, root) == "");
      }
}

TEST_CASE("the ring reduce pipelines in chunks", "[reduce]") {
  for (int n : {2, 5, 8}) {
    CAPTURE(n);
    CHECK(run_reduce<float, collx::ops::sum>(n, 100003, n - 1, collx::ops::sum{}, collx::algo::ring{.chunk_bytes = 4096}) == "");
  }
}
