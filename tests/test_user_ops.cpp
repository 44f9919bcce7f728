// User functors over user structs: a commutative one, and a non-commutative one that every
// policy must either reduce in rank order or refuse at compile time (tests/compile_fail).
#include <catch2/catch.hpp>

#include <mutex>

#include "harness.hpp"

namespace algo = collx::algo;

namespace {
/// A user struct: running statistics.
struct stats {
  std::int64_t n, sum, lo, hi;
};
struct merge_stats {
  using reduction_op_concept = collx::reduction_op_tag;
  stats operator()(const stats& a, const stats& b) const {
    return {a.n + b.n, a.sum + b.sum, std::min(a.lo, b.lo), std::max(a.hi, b.hi)};
  }
};

/// 2x2 matrices of uint32 under multiplication (mod 2^32): associative, not commutative.
struct mat2 {
  std::uint32_t a, b, c, d;
};
struct matmul {
  using reduction_op_concept = collx::reduction_op_tag;
  static constexpr bool commutative = false;
  mat2 operator()(const mat2& x, const mat2& y) const {
    return {x.a * y.a + x.b * y.c, x.a * y.b + x.b * y.d, x.c * y.a + x.d * y.c, x.c * y.b + x.d * y.d};
  }
};
}  // namespace

namespace collx_test {
template <>
stats input<stats, merge_stats>(int rank, std::size_t i) {
  const auto v = std::int64_t((i * 31 + std::size_t(rank) * 17) % 101);
  return {1, v, v, v};
}
template <>
mat2 input<mat2, matmul>(int rank, std::size_t i) {
  const auto h = std::uint32_t(i * 2654435761u) ^ std::uint32_t(rank * 40503 + 7);
  return {h | 1u, h >> 7, h >> 3, (h >> 11) | 2u};
}
}  // namespace collx_test

using namespace collx_test;

TEMPLATE_TEST_CASE("a user functor over a user struct", "[user_op]", algo::ring, algo::tree, algo::recursive_halving,
                   algo::automatic) {
  for (int n : {1, 2, 3, 5, 8, 13})
    for (std::size_t count : {std::size_t(0), std::size_t(n - 1), std::size_t(n + 1), std::size_t(10007)}) {
      CAPTURE(n, count);
      CHECK(run_all_reduce<stats, merge_stats, TestType>(n, count, false) == "");
      CHECK(run_reduce_scatter<stats, merge_stats, TestType>(n, count / std::size_t(n) + 1) == "");
      CHECK(run_reduce<stats, merge_stats, TestType>(n, count, n - 1) == "");
    }
}

TEMPLATE_TEST_CASE("a non-commutative op gives the rank-ordered product", "[user_op][noncommutative]", algo::tree,
                   algo::recursive_halving, algo::automatic) {
  for (int n : rank_counts())
    for (std::size_t count : {std::size_t(1), std::size_t(n + 1), std::size_t(4099)}) {
      CAPTURE(n, count);
      CHECK(run_all_reduce<mat2, matmul, TestType>(n, count, false) == "");
      CHECK(run_all_reduce<mat2, matmul, TestType>(n, count, true) == "");
      CHECK(run_reduce_scatter<mat2, matmul, TestType>(n, count / std::size_t(n) + 1) == "");
      for (int root : {0, n / 2, n - 1}) {
        CAPTURE(root);
        CHECK(run_reduce<mat2, matmul, TestType>(n, count, root) == "");
      }
    }
}

TEST_CASE("a large non-commutative all_reduce in segments keeps rank order", "[user_op][noncommutative][segments]") {
  const std::size_t count = algo::tuning::all_reduce_segment_from_bytes / sizeof(mat2) + 4099;
  for (int n : {3, 5}) {
    CAPTURE(n);
    CHECK(run_all_reduce<mat2, matmul, algo::recursive_halving>(n, count, false) == "");
    CHECK(run_all_reduce<mat2, matmul, algo::recursive_halving>(n, count, true) == "");
  }
}

TEST_CASE("recursive doubling all-reduces a non-commutative op in rank order", "[user_op][noncommutative]") {
  for (int n : rank_counts())
    for (std::size_t count : {std::size_t(0), std::size_t(1), std::size_t(n + 1), std::size_t(4099)}) {
      CAPTURE(n, count);
      CHECK(run_all_reduce<mat2, matmul, algo::recursive_doubling>(n, count, false) == "");
      CHECK(run_all_reduce<mat2, matmul, algo::recursive_doubling>(n, count, true) == "");
    }
}

TEST_CASE("ops::make wraps a lambda, and says whether it is commutative", "[user_op]") {
  auto absmax = collx::ops::make([](float a, float b) { return std::max(std::abs(a), std::abs(b)); }, collx::ops::commutative);
  static_assert(collx::is_commutative_v<decltype(absmax)>);
  collx::launch_threads(5, [&](auto& comm) {
    std::vector<float> v(17, comm.rank() % 2 ? -float(comm.rank()) : float(comm.rank()));
    collx::all_reduce(comm, std::span{v}, absmax);
    for (float x : v)
      if (x != 4.0f) throw std::runtime_error("absmax wrong");
  });
  // Non-commutative (and associative): appending decimal digits, "12" (+) "3" = "123"; every
  // policy that takes it returns in0 (+) in1 (+) ... in rank order (the ring refuses it at
  // compile time: tests/compile_fail/ring_make_noncommutative.cpp).
  struct digits {
    std::uint64_t v, p;  // the number, and 10^(its digits)
  };
  auto append = collx::ops::make([](digits a, digits b) { return digits{a.v * b.p + b.v, a.p * b.p}; },
                                 collx::ops::non_commutative);
  static_assert(!collx::is_commutative_v<decltype(append)>);
  for (int n : {1, 2, 3, 5, 7}) {
    std::uint64_t want = 0;
    for (int r = 0; r < n; ++r) want = want * 10 + std::uint64_t(r + 1);
    std::vector<std::string> bad;
    std::mutex mu;
    auto check = [&](auto algo) {
      collx::launch_threads(n, [&](auto& comm) {
        std::vector<digits> v(9, digits{std::uint64_t(comm.rank() + 1), 10});
        collx::all_reduce(comm, std::span{v}, append, algo);
        for (auto x : v)
          if (x.v != want) {
            std::lock_guard lk(mu);
            bad.push_back(std::to_string(x.v));
          }
      });
    };
    check(algo::tree{});
    check(algo::recursive_halving{});
    check(algo::recursive_doubling{});
    check(algo::automatic{});
    CAPTURE(n, want);
    CHECK(bad.empty());
  }
}
