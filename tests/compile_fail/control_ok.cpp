// The control: the same shapes, used correctly, compile.
#include <collx/collx.hpp>
struct concat {
  using reduction_op_concept = collx::reduction_op_tag;
  static constexpr bool commutative = false;
  int operator()(int a, int b) const { return a * 10 + b; }
};
int main() {
  collx::launch_threads(1, [](auto& comm) {
    std::vector<int> v(4), w(4);
    collx::all_reduce(comm, std::span{v}, concat{}, collx::algo::tree{});
    collx::all_reduce(comm, std::span{v}, collx::ops::band{});
    collx::all_to_all(comm, std::span<const int>{v}, std::span{w}, collx::algo::pairwise{});
    // every collective takes the policy last
    collx::gather(comm, std::span<const int>{v.data(), 1}, std::span{w.data(), 1}, 0, collx::algo::automatic{});
    collx::scatter(comm, std::span<const int>{v.data(), 1}, std::span{w.data(), 1}, 0, collx::algo::automatic{});
    collx::barrier(comm, collx::algo::automatic{});
    const std::size_t c[1] = {4};
    collx::all_to_all_v(comm, std::span<const int>{v}, std::span{c}, std::span{w}, std::span{c}, collx::algo::pairwise{});
    collx::all_reduce(comm, std::span{v}, collx::ops::make([](int a, int b) { return a + b; }, collx::ops::commutative));
  });
}
