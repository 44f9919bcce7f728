#include <collx/collx.hpp>
// ops::make without saying whether the op is commutative must not compile.
int main() {
  collx::launch_threads(1, [](auto& comm) {
    std::vector<int> v(4);
    collx::all_reduce(comm, std::span{v}, collx::ops::make([](int a, int b) { return a + b; }));
  });
}
