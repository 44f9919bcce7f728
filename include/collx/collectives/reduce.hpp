#pragma once
#include "common.hpp"

namespace collx {

namespace detail {
/// reduce with the concrete policy `pol` (not with_policy's lambda: a policy automatic chooses
/// and the same policy named by the caller share one instantiation).
template <class T, class E, class Op, class P>
void reduce_with(communicator<T>& comm, const call_info& call, std::span<const E> in, std::span<E> out, const Op& op,
                 int root, const P& pol) {
  static_assert(check_reducing<E, Op, P>());
  static_assert(requires(const algo::reduce_problem& p, const node_map& m) { pol.reduce(p); } ||
                    requires(const algo::reduce_problem& p, const node_map& m) { pol.reduce(p, m); },
                "collx: this policy has no reduce schedule (ring, tree and recursive_halving have one)");
  const algo::reduce_problem p{comm.rank(), comm.size(), root, in.size(), sizeof(E), is_commutative_v<Op>,
                                algo::is_deterministic_v<P> && stepwise_exact_v<Op, E>};
  const auto s = cached(comm, pol, p, [&] {
        schedule x = plan(comm, [&](const auto&... m) -> decltype(pol.reduce(p, m...)) { return pol.reduce(p, m...); });
        if (!algo::is_deterministic_v<P> && p.rank == p.root) x.finalize({buf::out, 0, p.count});  // (deterministic's folds finalize)
        return x;
      });
  if constexpr (has_prescale_v<Op, E>) {  // premul_sum: this rank's input scaled, in a copy
    std::vector<E> scaled(in.size());
    prescale<E>(comm, op, in.data(), scaled.data(), in.size());
    execute(comm, call, *s, static_cast<const E*>(scaled.data()), out.data(), op);
  } else {
    execute(comm, call, *s, in.data(), out.data(), op);
  }
}
}  // namespace detail

/// Reduce: out on root receives in_0 ⊕ ... ⊕ in_(n-1); out is not touched (and may be empty)
/// on the other ranks.
template <class T, class E, class Op, class Algo = algo::automatic>
void reduce(communicator<T>& comm, std::span<const std::type_identity_t<E>> in, std::span<E> out, Op op, int root,
            Algo a = {}) {
  static_assert(detail::check_reducing<E, Op, Algo>());
  const detail::call_queue::turn turn(detail::queue_of(comm, "reduce"), "reduce");
  auto call = detail::make_call<E, Op>(comm, "reduce", Algo::name, in.size(), root);
  COLLX_REQUIRE(root >= 0 && root < comm.size(), comm, call,
                  "root " + std::to_string(root) + " is out of range [0, " + std::to_string(comm.size()) + ")");
  if (comm.rank() == root) {
    COLLX_REQUIRE(out.size() == in.size(), comm, call,
                    "the output at the root has " + detail::n_elems(out.size()) + " but the input has " +
                        std::to_string(in.size()));
    COLLX_REQUIRE(!detail::partially_overlap(in, out), comm, call, "the input and output overlap");
  }
  detail::with_policy<Op, algo::collective::reduce, E>(
      a, comm, in.size(), call, [&](const auto& pol) { detail::reduce_with<T, E>(comm, call, in, out, op, root, pol); });
}

}  // namespace collx
