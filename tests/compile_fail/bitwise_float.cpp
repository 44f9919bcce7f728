#include <collx/collx.hpp>
int main() {
  collx::launch_threads(1, [](auto& comm) {
    std::vector<float> v(4);
    collx::all_reduce(comm, std::span{v}, collx::ops::band{});
  });
}
