#include <collx/collx.hpp>
// A lambda wrapped as non-commutative cannot run on the ring (ring order is not rank order).
int main() {
  collx::launch_threads(1, [](auto& comm) {
    std::vector<int> v(4);
    auto concat = collx::ops::make([](int a, int b) { return a * 10 + b; }, collx::ops::non_commutative);
    collx::all_reduce(comm, std::span{v}, concat, collx::algo::ring{});
  });
}
