#pragma once
#include "common.hpp"

namespace collx {

namespace detail {
/// Reduce-scatter over any block layout: the input blocks lie in `src` (in, or out when in
/// place) at `blocks`' offsets; `work` is buf::out when the output has the full layout (the rank's
/// block lands at its offset), buf::none when the output holds only the rank's block.
template <class T, class E, class Op, class Algo>
void reduce_scatter_blocks(communicator<T>& comm, const call_info& call, const E* in, E* out, const partition& blocks,
                           buf src, buf work, const Op& op, const Algo& a) {
  static_assert(check_reducing<E, Op, Algo>());
  static_assert(requires(const algo::rs_problem& p, const node_map& m) { a.reduce_scatter(p); } ||
                    requires(const algo::rs_problem& p, const node_map& m) { a.reduce_scatter(p, m); },
                "collx: this policy has no reduce_scatter schedule (ring, tree and recursive_halving have one)");
  const algo::rs_problem p{comm.rank(), comm.size(), blocks, src, work, sizeof(E), is_commutative_v<Op>,
                            algo::is_deterministic_v<Algo> && stepwise_exact_v<Op, E>};
  const auto s = cached(comm, a, p, [&] {
        schedule x = plan(comm, [&](const auto&... m) -> decltype(a.reduce_scatter(p, m...)) { return a.reduce_scatter(p, m...); });
        if constexpr (!algo::is_deterministic_v<Algo>) x.finalize(p.result());  // (deterministic's fold finalizes)
        return x;
      });
  execute(comm, call, *s, in, out, op);
}
}  // namespace detail

/// Reduce-scatter: in holds n·k elements (k per rank, in rank order); rank r receives the
/// reduction of everyone's r-th block in out (k elements). In place when `out` is this rank's
/// block of `in` (out.data() == in.data() + rank·k, as NCCL defines it): the result lands there,
/// and the buffer's other blocks are overwritten with partial results.
template <class T, class E, class Op, class Algo = algo::automatic>
void reduce_scatter(communicator<T>& comm, std::span<const std::type_identity_t<E>> in, std::span<E> out, Op op,
                    Algo a = {}) {
  static_assert(detail::check_reducing<E, Op, Algo>());
  const detail::call_queue::turn turn(detail::queue_of(comm, "reduce_scatter"), "reduce_scatter");
  auto call = detail::make_call<E, Op>(comm, "reduce_scatter", Algo::name, out.size());
  const auto n = std::size_t(comm.size());
  COLLX_REQUIRE(in.size() / n == out.size() && in.size() % n == 0, comm, call,
                  "the input has " + detail::n_elems(in.size()) + " but must have size x output = " +
                      std::to_string(n) + " x " + std::to_string(out.size()));
  const std::size_t k = out.size();
  const bool in_place = k != 0 && out.data() == in.data() + std::size_t(comm.rank()) * k;
  COLLX_REQUIRE(in_place || !detail::partially_overlap(in, out), comm, call,
                  "the input and output overlap (in place, the output is this rank's block of the input)");
  detail::with_policy<Op, algo::collective::reduce_scatter, E>(a, comm, k, call, [&](const auto& pol) {
    if (in_place) {  // the whole buffer is the work space, as in all_reduce's reduce-scatter
      E* full = out.data() - std::size_t(comm.rank()) * k;
      if constexpr (has_prescale_v<Op, E>) detail::prescale<E>(comm, op, full, full, in.size());  // (premul_sum)
      detail::reduce_scatter_blocks(comm, call, static_cast<const E*>(full), full, partition(in.size(), comm.size()), buf::out,
                                    buf::out, op, pol);
    } else if constexpr (has_prescale_v<Op, E>) {  // premul_sum: this rank's input scaled, in a copy
      std::vector<E> scaled(in.size());
      detail::prescale<E>(comm, op, in.data(), scaled.data(), in.size());
      detail::reduce_scatter_blocks(comm, call, static_cast<const E*>(scaled.data()), out.data(), partition(in.size(), comm.size()),
                                    buf::in, buf::none, op, pol);
    } else {
      detail::reduce_scatter_blocks(comm, call, in.data(), out.data(), partition(in.size(), comm.size()), buf::in, buf::none,
                                    op, pol);
    }
  });
}

}  // namespace collx
