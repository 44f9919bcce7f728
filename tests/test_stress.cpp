// Many small collectives back to back, on more ranks than cores: the interleavings where a peer
// finishes, leaves or races ahead of this rank. Every result is checked.
#include <catch2/catch.hpp>

#include "harness.hpp"

using namespace collx_test;
namespace algo = collx::algo;

TEST_CASE("thousands of back-to-back collectives stay correct when ranks race ahead", "[stress]") {
  for (int n : {2, 3, 8, 13}) {
    CAPTURE(n);
    failures f(n);
    collx::launch_threads(n, [&](auto& comm) {
      const int r = comm.rank();
      for (int it = 0; it < 150; ++it) {
        const std::size_t count = std::size_t(it % 7 == 0 ? 0 : (it * 37) % 61);
        std::vector<std::int32_t> v(count), out(count);
        for (std::size_t i = 0; i < count; ++i) v[i] = std::int32_t(r + int(i));
        const auto want_sum = [&](std::size_t i) { return std::int32_t(n * (n - 1) / 2 + n * int(i)); };
        switch (it % 6) {
          case 0: collx::all_reduce(comm, std::span{v}, collx::ops::sum{}, algo::ring{}); break;
          case 1: collx::all_reduce(comm, std::span{v}, collx::ops::sum{}, algo::tree{}); break;
          case 2: collx::all_reduce(comm, std::span{v}, collx::ops::sum{}, algo::recursive_halving{}); break;
          case 3: collx::reduce(comm, std::span<const std::int32_t>{v}, std::span{out}, collx::ops::sum{}, it % n, algo::tree{}); break;
          case 4: collx::broadcast(comm, std::span{v}, it % n, algo::ring{.chunk_bytes = 16}); break;
          case 5: collx::barrier(comm); break;
        }
        for (std::size_t i = 0; i < count; ++i) {
          const bool ok = it % 6 <= 2   ? v[i] == want_sum(i)
                          : it % 6 == 3 ? (r != it % n || out[i] == want_sum(i))
                          : it % 6 == 4 ? v[i] == std::int32_t(it % n + int(i))
                                        : true;
          if (!ok) {
            f.note(r, "iteration " + std::to_string(it) + " element " + std::to_string(i) + " wrong");
            break;
          }
        }
      }
    });
    CHECK(f.first() == "");
  }
}
