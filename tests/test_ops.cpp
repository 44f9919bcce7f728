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

// ---- premul_sum (torch's PREMUL_SUM): each rank's input times its own factor, then summed -----

/// Rank r's input and factor: halves and small integers, so every product and sum is exact in
/// float (and in bfloat16 for the few ranks it is run at).
template <class E>
E premul_input(int r, std::size_t i) {
  return E(float(int((i * 7 + std::size_t(r) * 3) % 15) - 7));
}
inline double premul_factor(int r) { return 0.5 * (r + 1); }
template <class E>
std::vector<E> premul_reference(int n, std::size_t count, std::size_t block = 0) {
  std::vector<E> v(count);
  for (std::size_t i = 0; i < count; ++i) {
    double s = 0;
    for (int r = 0; r < n; ++r) s += double(float(premul_input<E>(r, block + i))) * premul_factor(r);
    v[i] = E(float(s));
  }
  return v;
}

template <class E, class Algo>
std::string run_premul(int n, std::size_t count) {
  return run_checked<threads>(n, [&](auto& comm, auto note) {
    const int r = comm.rank();
    const ops::premul_sum op{premul_factor(r)};
    std::vector<E> in(count);
    for (std::size_t i = 0; i < count; ++i) in[i] = premul_input<E>(r, i);
    const std::vector<E> original = in;
    const auto want = premul_reference<E>(n, count);
    // all_reduce, out of place (the input untouched) and in place
    std::vector<E> out(count);
    collx::all_reduce(comm, std::span<const E>(in), std::span<E>(out), op, Algo{});
    if (auto d = compare(out, want); !d.empty()) note("all_reduce: " + d);
    if (in != original) note("all_reduce changed its input");
    std::vector<E> buf = in;
    collx::all_reduce(comm, std::span<E>(buf), op, Algo{});
    if (auto d = compare(buf, want); !d.empty()) note("all_reduce in place: " + d);
    if constexpr (!std::is_same_v<Algo, algo::recursive_doubling>) {
      // reduce to the last rank, the input untouched
      std::vector<E> red(r == n - 1 ? count : 0);
      collx::reduce(comm, std::span<const E>(in), std::span<E>(red), op, n - 1, Algo{});
      if (r == n - 1)
        if (auto d = compare(red, want); !d.empty()) note("reduce: " + d);
      if (in != original) note("reduce changed its input");
      // reduce_scatter of n blocks of `count`: out of place, then in place
      std::vector<E> full(count * std::size_t(n));
      for (std::size_t i = 0; i < full.size(); ++i) full[i] = premul_input<E>(r, i);
      const std::vector<E> full0 = full;
      const auto mine = premul_reference<E>(n, count, std::size_t(r) * count);
      std::vector<E> block(count);
      collx::reduce_scatter(comm, std::span<const E>(full), std::span<E>(block), op, Algo{});
      if (auto d = compare(block, mine); !d.empty()) note("reduce_scatter: " + d);
      if (full != full0) note("reduce_scatter changed its input");
      collx::reduce_scatter(comm, std::span<const E>(full), std::span<E>(full.data() + std::size_t(r) * count, count), op, Algo{});
      if (auto d = compare(full, mine, std::size_t(r) * count); !d.empty()) note("reduce_scatter in place: " + d);
    }
  });
}

TEST_CASE("premul_sum: every rank's input times its own factor, summed, by every reducing collective", "[ops][premul]") {
  for (int n : {1, 2, 3, 5, 7, 13})
    for (std::size_t count : {std::size_t(0), std::size_t(1), std::size_t(n - 1), std::size_t(n + 1), std::size_t(10007)}) {
      CAPTURE(n, count);
      CHECK(run_premul<float, algo::automatic>(n, count) == "");
      CHECK(run_premul<float, algo::ring>(n, count) == "");
      CHECK(run_premul<float, algo::tree>(n, count) == "");
      CHECK(run_premul<float, algo::recursive_halving>(n, count) == "");
      CHECK(run_premul<double, algo::recursive_doubling>(n, count) == "");
      if (n <= 5) CHECK(run_premul<collx::bfloat16, algo::automatic>(n, count) == "");
    }
}

TEST_CASE("premul_sum in a fused batch: each part scaled once, whatever the batch packs", "[ops][premul]") {
  for (int n : {1, 3, 5})
    CHECK(run_checked<threads>(n, [&](auto& comm, auto note) {
            const int r = comm.rank();
            const ops::premul_sum op{premul_factor(r)};
            std::vector<std::vector<float>> parts;
            for (std::size_t c : {std::size_t(3), std::size_t(0), std::size_t(17), std::size_t(1)}) {
              parts.emplace_back(c);
              for (std::size_t i = 0; i < c; ++i) parts.back()[i] = premul_input<float>(r, i);
            }
            collx::fused f(comm);
            for (auto& p : parts) f.all_reduce(std::span<float>(p), op);
            f.run();
            for (auto& p : parts)
              if (auto d = compare(p, premul_reference<float>(n, p.size())); !d.empty()) note("fused: " + d);
          }) == "");
}
