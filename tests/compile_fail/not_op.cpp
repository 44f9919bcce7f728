#include <collx/collx.hpp>
int main() {
  collx::launch_threads(1, [](auto& comm) {
    std::vector<float> v(4);
    auto add = [](float a, float b) { return a + b; };  // not tagged: wrap with collx::ops::make
    collx::all_reduce(comm, std::span{v}, add);
  });
}
