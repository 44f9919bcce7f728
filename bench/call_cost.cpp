// call_cost: the per-call bookkeeping of collx, without a peer to wait for. One thread-rank
// (launch_threads(1): no message moves) makes `calls` 8 B all_reduces (ring) and as many 8 B
// broadcasts (tree); run under callgrind, the difference between two call counts, divided by
// the calls, is the instructions one call costs: a count the machine's noise cannot move.
// bench/call_instructions.sh builds it at two commits and prints that count for each.
//
//   call_cost [calls (100000)]
//
// It uses only what every collx since 987e05e has (launch_threads, all_reduce, broadcast).
#include <collx/collx.hpp>

#include <cstdlib>
#include <span>
#include <vector>

int main(int argc, char** argv) {
  const long calls = argc > 1 ? std::atol(argv[1]) : 100000;
  collx::launch_threads(1, [&](auto& comm) {
    std::vector<float> v(2, 1.0f);
    for (long i = 0; i < calls; ++i) collx::all_reduce(comm, std::span{v}, collx::ops::sum{}, collx::algo::ring{});
    for (long i = 0; i < calls; ++i) collx::broadcast(comm, std::span{v}, 0, collx::algo::tree{});
  });
}
