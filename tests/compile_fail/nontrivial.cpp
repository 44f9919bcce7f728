#include <collx/collx.hpp>
#include <string>
int main() {
  collx::launch_threads(1, [](auto& comm) {
    std::vector<std::string> a(1), b(1);
    collx::broadcast(comm, std::span{a}, 0);
  });
}
