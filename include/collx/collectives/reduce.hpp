#pragma once
#include "common.hpp"

namespace collx {

/// Reduce: out on root receives in_0 ⊕ ... ⊕ in_(n-1); out is not touched (and may be empty)
/// on the other ranks.
template <class T, class E, class Op, class Algo = algo::automatic>
void reduce(communicator<T>& comm, std::span<const std::type_identity_t<E>> in, std::span<E> out, Op op, int root,
            Algo a = {}) {
  static_assert(detail::check_reducing<E, Op, Algo>());
  auto call = detail::make_call<E, Op>(comm, "reduce", Algo::name, in.size(), root);
  detail::require(root >= 0 && root < comm.size(), call,
                  "root " + std::to_string(root) + " is out of range [0, " + std::to_string(comm.size()) + ")");
  if (comm.rank() == root) {
    detail::require(out.size() == in.size(), call,
                    "the output at the root has " + detail::n_elems(out.size()) + " but the input has " +
                        std::to_string(in.size()));
    detail::require(!detail::partially_overlap(in, out), call, "the input and output overlap");
  }
  detail::with_policy<Op>(a, algo::collective::reduce, comm.size(), in.size_bytes(), call, [&](const auto& pol) {
    static_assert(detail::check_reducing<E, Op, std::decay_t<decltype(pol)>>());
    static_assert(requires(const algo::reduce_problem& p) { pol.reduce(p); },
                  "collx: this policy has no reduce schedule (ring, tree and recursive_halving have one)");
    schedule s = pol.reduce({comm.rank(), comm.size(), root, in.size(), sizeof(E), is_commutative_v<Op>});
    if (comm.rank() == root) s.finalize({buf::out, 0, in.size()});
    detail::execute(comm, call, s, in.data(), out.data(), op);
  });
}

}  // namespace collx
