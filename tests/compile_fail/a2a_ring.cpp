#include <collx/collx.hpp>
int main() {
  collx::launch_threads(1, [](auto& comm) {
    std::vector<int> a(4), b(4);
    collx::all_to_all(comm, std::span<const int>{a}, std::span{b}, collx::algo::ring{});
  });
}
