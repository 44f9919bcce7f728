#include <collx/collx.hpp>
#include <cstdio>
int main() {
  int bad = 0;
  collx::launch_threads(4, [&](auto& comm) {
    std::vector<float> v(1000, float(comm.rank()));
    collx::all_reduce(comm, std::span{v}, collx::ops::sum{});
    if (comm.rank() == 0)
      for (float x : v) bad += x != 6.0f;
  });
  std::printf("consumer: all_reduce over 4 thread-ranks %s\n", bad ? "WRONG" : "ok");
  return bad != 0;
}
