#include <collx/collx.hpp>
int main() {
  collx::launch_threads(1, [](auto& comm) {
    std::vector<int> a(1), b(1);
    collx::gather(comm, std::span<const int>{a}, std::span{b}, 0, collx::algo::ring{});
  });
}
