#pragma once
// The core's test matrix, one body for every launcher of processes (shm, tcp): every collective x
// policy over the rank counts and the core's counts, every dtype and op, uneven all_to_all_v.
#include <catch2/catch.hpp>

#include <chrono>
#include <numeric>

#include "harness.hpp"

namespace collx_test {

inline const std::vector<int>& process_ranks() {
  static const std::vector<int> v{1, 2, 3, 4, 5, 8};
  return v;
}

/// `ranks`: the rank counts to sweep (a launcher with a fixed world, MPI's, passes those it has).
template <class L, class Algo>
void check_reducing_matrix(const std::vector<int>& ranks = process_ranks()) {
  for (int n : ranks)
    for (std::size_t count : counts_for(n)) {
      CAPTURE(n, count);
      const std::size_t k = count / std::size_t(n) + (count % 2);
      CHECK(run_all_reduce<float, collx::ops::sum, Algo, L>(n, count, false) == "");
      CHECK(run_all_reduce<std::int32_t, collx::ops::sum, Algo, L>(n, count, true) == "");
      CHECK(run_reduce_scatter<float, collx::ops::sum, Algo, L>(n, k) == "");
      CHECK(run_reduce<std::int32_t, collx::ops::sum, Algo, L>(n, count, n - 1) == "");
    }
}

template <class L, class Algo>
void check_moving_matrix(const std::vector<int>& ranks = process_ranks()) {
  for (int n : ranks)
    for (std::size_t count : counts_for(n)) {
      CAPTURE(n, count);
      const std::size_t k = count / std::size_t(n) + (count % 2);
      CHECK(run_all_gather<float, Algo, L>(n, k) == "");
      if constexpr (!std::is_same_v<Algo, collx::algo::pairwise>)  // pairwise has no broadcast
        CHECK(run_broadcast<std::int32_t, Algo, L>(n, count, n / 2) == "");
    }
}

template <class L>
void check_dtypes_and_ops(int n) {
  namespace algo = collx::algo;
  CAPTURE(n);
  CHECK(run_all_reduce<std::int8_t, collx::ops::sum, algo::ring, L>(n, 1001, false) == "");
  CHECK(run_all_reduce<std::uint64_t, collx::ops::sum, algo::tree, L>(n, 1001, false) == "");
  CHECK(run_all_reduce<double, collx::ops::sum, algo::recursive_halving, L>(n, 100003, true) == "");
  CHECK(run_all_reduce<collx::half, collx::ops::sum, algo::ring, L>(n, 100003, false) == "");
  CHECK(run_all_reduce<collx::bfloat16, collx::ops::sum, algo::tree, L>(n, 100003, false) == "");
  CHECK(run_all_reduce<float, collx::ops::prod, algo::ring, L>(n, 1001, false) == "");
  CHECK(run_all_reduce<float, collx::ops::min, algo::tree, L>(n, 1001, false) == "");
  CHECK(run_all_reduce<std::int32_t, collx::ops::max, algo::recursive_halving, L>(n, 1001, false) == "");
  CHECK(run_all_reduce<collx::bfloat16, collx::ops::avg, algo::ring, L>(n, 1001, false) == "");
  CHECK(run_all_reduce<std::int32_t, collx::ops::bxor, algo::ring, L>(n, 1001, false) == "");
}

/// all_to_all_v with uneven blocks (some empty) between every pair.
template <class L>
std::string run_all_to_all_v(int n) {
  return run_checked<L>(n, [n](auto& comm, auto note) {
    const int r = comm.rank();
    std::vector<std::size_t> sc(static_cast<std::size_t>(n)), rc(static_cast<std::size_t>(n));
    for (int j = 0; j < n; ++j) {
      sc[std::size_t(j)] = std::size_t((r * 7 + j * 3) % 5) * 20011;
      rc[std::size_t(j)] = std::size_t((j * 7 + r * 3) % 5) * 20011;
    }
    std::vector<std::int64_t> in(std::accumulate(sc.begin(), sc.end(), std::size_t(0)));
    std::vector<std::int64_t> out(std::accumulate(rc.begin(), rc.end(), std::size_t(0))), want(out.size());
    std::size_t o = 0;
    for (int j = 0; j < n; ++j)
      for (std::size_t i = 0; i < sc[std::size_t(j)]; ++i) in[o++] = r * 1000000 + j * 10000 + std::int64_t(i);
    o = 0;
    for (int j = 0; j < n; ++j)
      for (std::size_t i = 0; i < rc[std::size_t(j)]; ++i) want[o++] = j * 1000000 + r * 10000 + std::int64_t(i);
    collx::all_to_all_v(comm, std::span<const std::int64_t>{in}, std::span<const std::size_t>{sc}, std::span{out},
                        std::span<const std::size_t>{rc});
    note(compare(out, want));
  });
}


/// Ranks that call differently fail with errc::mismatch, both sides printed: different counts,
/// and zero-element calls that differ (caught at the next call that communicates). `launch(n, f,
/// options)` starts the ranks as processes over one transport.
template <class Launch>
void check_mismatches(Launch launch) {
  collx::options o;
  o.timeout = std::chrono::seconds(10);
  try {
    launch(3, [](auto& comm) {
      std::vector<float> v(comm.rank() == 1 ? 12 : 10, 1.0f);
      collx::all_reduce(comm, std::span{v}, collx::ops::sum{}, collx::algo::ring{});
    }, o);
    FAIL("no error");
  } catch (const collx::error& e) {
    CHECK(e.code() == collx::errc::mismatch);
    CHECK_THAT(e.what(), Catch::Matchers::Contains("12 x 4 B") && Catch::Matchers::Contains("10 x 4 B"));
  }
  try {
    launch(3, [](auto& comm) {
      std::vector<float> none, v(10, 1.0f);
      if (comm.rank() == 2) collx::broadcast(comm, std::span{none}, 1);
      else collx::broadcast(comm, std::span{none}, 0);
      collx::all_reduce(comm, std::span{v}, collx::ops::sum{}, collx::algo::ring{});
    }, o);
    FAIL("no error");
  } catch (const collx::error& e) {
    CHECK(e.code() == collx::errc::mismatch);
    CHECK_THAT(e.what(), Catch::Matchers::Contains("different calls with zero elements"));
  }
}

}  // namespace collx_test
