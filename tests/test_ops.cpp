// Every built-in op with int32, float and bfloat16 (bitwise ops: integers only).
#include <catch2/catch.hpp>

#include <mutex>

#include "harness.hpp"

using namespace collx_test;
namespace ops = collx::ops;
namespace algo = collx::algo;

template <class E, class Op>
void check_op() {
  for (int n : {1, 2, 5, 8, 13})
    for (std::size_t count : {std::size_t(0), std::size_t(n + 1), std::size_t(100003)}) {
      CAPTURE(n, count);
      CHECK(run_all_reduce<E, Op, algo::ring>(n, count, false) == "");
      CHECK(run_all_reduce<E, Op, algo::tree>(n, count, true) == "");
      CHECK(run_all_reduce<E, Op, algo::recursive_halving>(n, count, false) == "");
      CHECK(run_all_reduce<E, Op, algo::automatic>(n, count, true) == "");
      CHECK(run_reduce_scatter<E, Op, algo::ring>(n, count / std::size_t(n) + 1) == "");
      CHECK(run_reduce_scatter<E, Op, algo::recursive_halving>(n, count / std::size_t(n) + 1) == "");
      CHECK(run_reduce<E, Op, algo::tree>(n, count, n - 1) == "");
      CHECK(run_reduce<E, Op, algo::ring>(n, count, 0) == "");
    }
}

TEMPLATE_TEST_CASE("arithmetic ops reduce int32, float and bfloat16 exactly", "[ops]", std::int32_t, float,
                   collx::bfloat16) {
  SECTION("sum") { check_op<TestType, ops::sum>(); }
  SECTION("prod") { check_op<TestType, ops::prod>(); }
  SECTION("min") { check_op<TestType, ops::min>(); }
  SECTION("max") { check_op<TestType, ops::max>(); }
  SECTION("avg") { check_op<TestType, ops::avg>(); }
}

TEST_CASE("bitwise ops reduce int32", "[ops]") {
  SECTION("band") { check_op<std::int32_t, ops::band>(); }
  SECTION("bor") { check_op<std::int32_t, ops::bor>(); }
  SECTION("bxor") { check_op<std::int32_t, ops::bxor>(); }
}

TEST_CASE("avg divides once, after the sum (integer division for integers)", "[ops]") {
  collx::launch_threads(3, [](auto& comm) {
    std::vector<int> v{comm.rank() + 1};  // 1 + 2 + 3 = 6, / 3 = 2
    std::vector<float> f{float(comm.rank())};  // 0 + 1 + 2 = 3, / 3 = 1
    collx::all_reduce(comm, std::span{v}, ops::avg{});
    collx::all_reduce(comm, std::span{f}, ops::avg{});
    if (v[0] != 2 || f[0] != 1.0f) throw std::runtime_error("avg wrong");
  });
}

TEST_CASE("avg of small integers at many ranks divides in a wide type (uint8_t(256) is 0)", "[ops][overflow]") {
  // before: x / uint8_t(256), a division by zero; int8_t(200) is negative
  CHECK(ops::avg::finalize(std::uint8_t(255), 256) == 0);
  CHECK(ops::avg::finalize(std::uint8_t(255), 255) == 1);
  CHECK(ops::avg::finalize(std::int8_t(-100), 200) == 0);
  CHECK(ops::avg::finalize(std::int8_t(-100), 50) == -2);
  CHECK(ops::avg::finalize(std::uint16_t(65535), 70000) == 0);
  CHECK(ops::avg::finalize(std::int32_t(-7), 2) == -3);
  // 256 ranks, each contributing 1: the uint8 sum wraps to 0, and 0 / 256 is 0 on every rank
  std::vector<std::string> bad;
  std::mutex mu;
  collx::launch_threads(256, [&](auto& comm) {
    std::vector<std::uint8_t> v(3, 1);
    collx::all_reduce(comm, std::span{v}, ops::avg{}, algo::recursive_doubling{});
    if (v != std::vector<std::uint8_t>(3, 0)) {
      std::lock_guard lk(mu);
      bad.push_back(std::to_string(comm.rank()));
    }
  });
  CHECK(bad.empty());
}
