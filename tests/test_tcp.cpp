// transport::tcp: the core's test matrix over real processes and loopback sockets, and what
// only sockets can show: rendezvous through both stores, strangers refused, garbage on the wire,
// a peer killed, reset, stopped mid-message or late.
#include <catch2/catch.hpp>

#include <dirent.h>
#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <numeric>
#include <thread>

#include "harness.hpp"

using namespace collx_test;
using namespace std::chrono_literals;
using Catch::Matchers::Contains;
namespace algo = collx::algo;
namespace net = collx::transport::net;

namespace {
const std::vector<int>& tcp_ranks() {
  static const std::vector<int> v{1, 2, 3, 4, 5, 8};
  return v;
}
}  // namespace

TEMPLATE_TEST_CASE("over tcp: reducing collectives equal the serial reference", "[tcp]", algo::ring, algo::tree,
                   algo::recursive_halving, algo::automatic) {
  for (int n : tcp_ranks())
    for (std::size_t count : counts_for(n)) {
      CAPTURE(n, count);
      const std::size_t k = count / std::size_t(n) + (count % 2);
      CHECK(run_all_reduce<float, collx::ops::sum, TestType, processes_tcp>(n, count, false) == "");
      CHECK(run_all_reduce<std::int32_t, collx::ops::sum, TestType, processes_tcp>(n, count, true) == "");
      CHECK(run_reduce_scatter<float, collx::ops::sum, TestType, processes_tcp>(n, k) == "");
      CHECK(run_reduce<std::int32_t, collx::ops::sum, TestType, processes_tcp>(n, count, n - 1) == "");
    }
}

TEMPLATE_TEST_CASE("over tcp: data-moving collectives deliver every block", "[tcp]", algo::ring, algo::tree,
                   algo::recursive_halving, algo::automatic) {
  for (int n : tcp_ranks())
    for (std::size_t count : counts_for(n)) {
      CAPTURE(n, count);
      const std::size_t k = count / std::size_t(n) + (count % 2);
      CHECK(run_all_gather<float, TestType, processes_tcp>(n, k) == "");
      CHECK(run_broadcast<std::int32_t, TestType, processes_tcp>(n, count, n / 2) == "");
    }
}
