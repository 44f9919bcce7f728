#pragma once
#include "common.hpp"

namespace collx {

/// Broadcast: buf on root is copied to buf on every rank.
template <class T, class E, class Algo = algo::automatic>
void broadcast(communicator<T>& comm, std::span<E> buf, int root, Algo a = {}) {
  static_assert(std::is_trivially_copyable_v<E>, "collx: element types must be trivially copyable");
  static_assert(check_policy<Algo>());
  const detail::call_queue::turn turn(detail::queue_of(comm, "broadcast"), "broadcast");
  auto call = detail::make_call<E, no_op>(comm, "broadcast", Algo::name, buf.size(), root);
  COLLX_REQUIRE(root >= 0 && root < comm.size(), comm, call,
                  "root " + std::to_string(root) + " is out of range [0, " + std::to_string(comm.size()) + ")");
  detail::with_policy<no_op, algo::collective::broadcast, E>(a, comm, buf.size(), call, [&](const auto& pol) {
    static_assert(requires(const algo::bcast_problem& p, const node_map& m) { pol.broadcast(p); } ||
                      requires(const algo::bcast_problem& p, const node_map& m) { pol.broadcast(p, m); },
                  "collx: this policy has no broadcast schedule (ring, tree and recursive_halving have one)");
    const algo::bcast_problem p{comm.rank(), comm.size(), root, buf.size(), sizeof(E)};
    const auto s = detail::cached(comm, pol, p, [&] {
      return detail::plan(comm, [&](const auto&... m) -> decltype(pol.broadcast(p, m...)) { return pol.broadcast(p, m...); });
    });
    detail::execute(comm, call, *s, static_cast<const E*>(buf.data()), buf.data(), no_op{});
  });
}

}  // namespace collx
