// Cost formulas asserted against what transport::counting records in real runs.
#include <catch2/catch.hpp>

#include <mutex>

#include "harness.hpp"

using namespace collx_test;
namespace algo = collx::algo;
using collx::transport::traffic;

namespace {
/// Runs f on n counting thread-ranks; returns each rank's traffic.
template <class F>
std::vector<traffic> count_traffic(int n, F f) {
  std::vector<traffic> t(static_cast<std::size_t>(n));
  collx::launch_threads<collx::transport::counting>(n, [&](auto& comm) {
    f(comm);
    t[std::size_t(comm.rank())] = comm.transport().counts();
  });
  return t;
}
}  // namespace

TEST_CASE("ring all_reduce: 2(N-1) steps, 2(N-1)/N·D bytes sent, (N-1)/N·D reduced per rank", "[cost][ring]") {
  for (int n : {2, 3, 4, 5, 7, 8, 13, 16})
    for (std::size_t count : {std::size_t(n) * 1000, std::size_t(100003)}) {
      CAPTURE(n, count);
      const auto t = count_traffic(n, [&](auto& comm) {
        std::vector<float> v(count, 1.0f);
        collx::all_reduce(comm, std::span{v}, collx::ops::sum{}, algo::ring{});
      });
      const collx::partition blk(count, n);
      for (int r = 0; r < n; ++r) {
        CAPTURE(r);
        const std::size_t D = count * 4;
        // exactly: all blocks but its own (reduce-scatter) and all but its successor's (all-gather)
        const std::size_t sent = (D - blk.count(r) * 4) + (D - blk.count(algo::mod(r + 1, n)) * 4);
        CHECK(t[std::size_t(r)].steps == std::uint64_t(2 * (n - 1)));
        CHECK(t[std::size_t(r)].messages_sent == std::uint64_t(2 * (n - 1)));
        CHECK(t[std::size_t(r)].bytes_sent == sent);
        CHECK(t[std::size_t(r)].bytes_reduced == D - blk.count(algo::mod(r - 1, n)) * 4);
        if (count % std::size_t(n) == 0) CHECK(t[std::size_t(r)].bytes_sent * std::uint64_t(n) == 2 * std::uint64_t(n - 1) * D);
        // up to partition rounding: within 2 elements of the formula
        const double formula = 2.0 * (n - 1) / n * double(D);
        CHECK(std::abs(double(t[std::size_t(r)].bytes_sent) - formula) <= 8.0);
      }
    }
}

TEST_CASE("recursive halving all_reduce: 2·log2 N steps and 2(N-1)/N·D bytes for powers of two", "[cost][halving]") {
  for (int n : {2, 4, 8, 16}) {
    CAPTURE(n);
    const std::size_t count = std::size_t(n) * 4096;
    const auto t = count_traffic(n, [&](auto& comm) {
      std::vector<float> v(count, 1.0f);
      collx::all_reduce(comm, std::span{v}, collx::ops::sum{}, algo::recursive_halving{});
    });
    const int lg = algo::ceil_log2(n);
    for (const auto& x : t) {
      CHECK(x.steps == std::uint64_t(2 * lg));
      CHECK(x.bytes_sent * std::uint64_t(n) == 2 * std::uint64_t(n - 1) * count * 4);
      CHECK(x.bytes_reduced * std::uint64_t(n) == std::uint64_t(n - 1) * count * 4);
    }
  }
  SECTION("other N fold in two extra steps on the first 2(N - p) ranks") {
    for (int n : {3, 5, 6, 7, 12, 13}) {
      CAPTURE(n);
      const auto t = count_traffic(n, [&](auto& comm) {
        std::vector<float> v(1000, 1.0f);
        collx::all_reduce(comm, std::span{v}, collx::ops::sum{}, algo::recursive_halving{});
      });
      const int p = algo::floor_pow2(n), lgp = algo::ceil_log2(p);
      for (int r = 0; r < n; ++r) {
        CAPTURE(r);
        const bool folded = r < 2 * (n - p);
        const bool even = r % 2 == 0;
        // even folded ranks: 1 send + 1 receive per phase; others: log2 p exchanges (+2 if odd folded)
        CHECK(t[std::size_t(r)].steps == std::uint64_t(folded && even ? 4 : 2 * lgp + (folded ? 4 : 0)));
      }
    }
  }
}

TEST_CASE("recursive doubling all_reduce: log2 N steps of the whole vector", "[cost][doubling]") {
  for (int n : {2, 4, 8, 16}) {
    CAPTURE(n);
    const std::size_t count = 1000;
    const auto t = count_traffic(n, [&](auto& comm) {
      std::vector<float> v(count, 1.0f);
      collx::all_reduce(comm, std::span{v}, collx::ops::sum{}, algo::recursive_doubling{});
    });
    const int lg = algo::ceil_log2(n);
    for (const auto& x : t) {
      CHECK(x.steps == std::uint64_t(lg));
      CHECK(x.bytes_sent == std::uint64_t(lg) * count * 4);
      CHECK(x.bytes_reduced == std::uint64_t(lg) * count * 4);
    }
  }
}

TEST_CASE("binomial tree: ceil(log2 N) steps at the root, D bytes per step", "[cost][tree]") {
  for (int n : {2, 3, 5, 8, 13, 16}) {
    CAPTURE(n);
    const std::size_t count = 777;
    const int root = n / 2, lg = algo::ceil_log2(n);
    const auto t = count_traffic(n, [&](auto& comm) {
      std::vector<float> v(count, 1.0f), out(count);
      collx::broadcast(comm, std::span{v}, root, algo::tree{});
      comm.transport().reset();
      collx::reduce(comm, std::span<const float>{v}, std::span{out}, collx::ops::sum{}, root, algo::tree{});
      if (comm.rank() == root) {  // keep the root's reduce counts, then measure a broadcast alone
        const auto red = comm.transport().counts();
        comm.transport().reset();
        collx::broadcast(comm, std::span{v}, root, algo::tree{});
        const auto bc = comm.transport().counts();
        comm.transport().reset();
        if (red.messages_received != std::uint64_t(lg) || red.bytes_reduced != std::uint64_t(lg) * count * 4 ||
            bc.bytes_sent != std::uint64_t(lg) * count * 4 || bc.steps != std::uint64_t(lg))
          throw std::runtime_error("root traffic differs from ceil(log2 N)·D");
      } else {
        comm.transport().reset();
        collx::broadcast(comm, std::span{v}, root, algo::tree{});
        if (comm.transport().counts().bytes_received != count * 4) throw std::runtime_error("a non-root received twice");
      }
    });
    (void)t;
  }
}

TEST_CASE("double binary tree: every rank sends at most 2·D, all ranks together 2(N-1)·D", "[cost][tree]") {
  for (int n : {2, 3, 4, 5, 8, 13, 16}) {
    CAPTURE(n);
    const std::size_t count = std::size_t(n) * 2 * 64;  // halves divide evenly
    const auto t = count_traffic(n, [&](auto& comm) {
      std::vector<float> v(count, 1.0f);
      collx::all_reduce(comm, std::span{v}, collx::ops::sum{}, algo::tree{});
    });
    std::uint64_t total = 0;
    for (const auto& x : t) {
      CHECK(x.bytes_sent <= 2 * count * 4);
      total += x.bytes_sent;
    }
    CHECK(total == 2 * std::uint64_t(n - 1) * count * 4);
  }
}

TEST_CASE("pairwise all_to_all: N-1 steps, (N-1)/N·D bytes per rank", "[cost][pairwise]") {
  // Blocks just over tuning::a2a_one_step_bytes: one exchange per step.
  const std::size_t k = algo::tuning::a2a_one_step_bytes / sizeof(int) + 1;
  for (int n : {2, 3}) {  // (blocks of 32 MiB: a few ranks are enough)
    CAPTURE(n);
    const auto t = count_traffic(n, [&](auto& comm) {
      std::vector<int> in(k * std::size_t(n)), out(in.size());
      collx::all_to_all(comm, std::span<const int>{in}, std::span{out});
    });
    for (const auto& x : t) {
      CHECK(x.steps == std::uint64_t(n - 1));
      CHECK(x.bytes_sent == std::uint64_t(n - 1) * k * 4);
    }
  }
  for (int n : {2, 3, 7, 16}) {
    CAPTURE(n);
    // Tiny blocks (<= tuning::a2a_one_step_bytes): every exchange in one step.
    const auto tiny = count_traffic(n, [&](auto& comm) {
      std::vector<int> in(8 * std::size_t(n)), out(in.size());
      collx::all_to_all(comm, std::span<const int>{in}, std::span{out});
    });
    for (const auto& x : tiny) {
      CHECK(x.steps == 1);
      CHECK(x.messages_sent == std::uint64_t(n - 1));
    }
  }
}

TEST_CASE("calls with zero elements exchange nothing, whatever the policy", "[cost][empty]") {
  for (int n : {1, 2, 3, 5, 7}) {
    CAPTURE(n);
    std::vector<std::uint64_t> calls(static_cast<std::size_t>(n));
    const auto t = count_traffic(n, [&](auto& comm) {
      std::vector<float> none, out;
      collx::all_reduce(comm, std::span{none}, collx::ops::sum{});
      collx::all_reduce(comm, std::span{none}, collx::ops::sum{}, algo::ring{});
      collx::all_reduce(comm, std::span<const float>{none}, std::span{out}, collx::ops::max{}, algo::tree{});
      collx::reduce_scatter(comm, std::span<const float>{none}, std::span{out}, collx::ops::sum{}, algo::recursive_halving{});
      collx::all_gather(comm, std::span<const float>{none}, std::span{out}, algo::pairwise{});
      collx::broadcast(comm, std::span{none}, n - 1);
      collx::reduce(comm, std::span<const float>{none}, std::span{out}, collx::ops::sum{}, 0);
      collx::all_to_all(comm, std::span<const float>{none}, std::span{out});
      collx::gather(comm, std::span<const float>{none}, std::span{out}, 0);
      collx::scatter(comm, std::span<const float>{none}, std::span{out}, n / 2);
      calls[std::size_t(comm.rank())] = comm.calls();
    });
    for (std::size_t r = 0; r < t.size(); ++r) {
      CAPTURE(r);
      CHECK(t[r] == traffic{});
      CHECK(calls[r] == 10);  // each still takes its sequence number
    }
  }
  SECTION("a bad root is still an error") {
    std::vector<int> refused(2, 0);  // Catch's assertions are not thread-safe: checked on this thread
    const auto t = count_traffic(2, [&](auto& comm) {
      std::vector<float> none;
      try {
        collx::broadcast(comm, std::span{none}, 2);
      } catch (const collx::error& e) {
        refused[std::size_t(comm.rank())] = e.code() == collx::errc::invalid_argument ? 1 : 2;
      }
    });
    CHECK(refused == std::vector<int>{1, 1});
    CHECK(t[0] == traffic{});
  }
}
