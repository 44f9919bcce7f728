#pragma once
// Many collectives back to back on one job, every result checked: the interleavings where a
// peer finishes, leaves or races ahead of this rank, and large messages among small ones (the
// sizes where a library returned wrong data under load). One body for every launcher: threads,
// processes over shared memory, processes over tcp.
#include "harness.hpp"

namespace collx_test {

template <class L>
std::string stress(int n, int iters) {
  namespace algo = collx::algo;
  return run_checked<L>(n, [n, iters](auto& comm, auto note) {
    const int r = comm.rank();
    for (int it = 0; it < iters; ++it) {
      // Mostly small and uneven counts; every 9th call a large one (up to ~1.5 M elements).
      const std::size_t count = it % 9 == 8 ? std::size_t(400009 + (it * 7919) % 1000003)
                                : std::size_t(it % 7 == 0 ? 0 : (it * 37) % 61);
      std::vector<std::int32_t> v(count), out(count);
      for (std::size_t i = 0; i < count; ++i) v[i] = std::int32_t(r + int(i % 1000));
      const auto want_sum = [&](std::size_t i) { return std::int32_t(n * (n - 1) / 2 + n * int(i % 1000)); };
      std::vector<std::int32_t> gathered;
      switch (it % 8) {
        case 0: collx::all_reduce(comm, std::span{v}, collx::ops::sum{}, algo::ring{}); break;
        case 1: collx::all_reduce(comm, std::span{v}, collx::ops::sum{}, algo::tree{}); break;
        case 2: collx::all_reduce(comm, std::span{v}, collx::ops::sum{}, algo::recursive_halving{}); break;
        case 3: collx::reduce(comm, std::span<const std::int32_t>{v}, std::span{out}, collx::ops::sum{}, it % n, algo::tree{}); break;
        case 4: collx::broadcast(comm, std::span{v}, it % n, algo::ring{.chunk_bytes = 4096}); break;
        case 5: collx::barrier(comm); break;
        case 6:
          gathered.resize(count * std::size_t(n));
          collx::all_gather(comm, std::span<const std::int32_t>{v}, std::span{gathered});
          break;
        case 7: collx::all_reduce(comm, std::span{v}, collx::ops::sum{}); break;
      }
      for (std::size_t i = 0; i < count * (it % 8 == 6 ? std::size_t(n) : 1); ++i) {
        bool ok = true;
        switch (it % 8) {
          case 0: case 1: case 2: case 7: ok = v[i] == want_sum(i); break;
          case 3: ok = r != it % n || out[i] == want_sum(i); break;
          case 4: ok = v[i] == std::int32_t(it % n + int(i % 1000)); break;
          case 6: ok = gathered[i] == std::int32_t(int(i / count) + int(i % count % 1000)); break;
          default: break;
        }
        if (!ok) {
          note("call " + std::to_string(it) + " (" + std::to_string(count) + " elements) element " + std::to_string(i) + " wrong");
          return;
        }
      }
    }
  });
}

}  // namespace collx_test
