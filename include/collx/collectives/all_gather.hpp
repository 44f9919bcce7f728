#pragma once
#include "common.hpp"

namespace collx {

namespace detail {
/// All-gather over any block layout: rank r's block comes from in (or is already at its offset
/// in out when in_place) and every rank ends with all blocks in out.
template <class T, class E, class Algo>
void all_gather_blocks(communicator<T>& comm, const call_info& call, const E* in, E* out, const partition& blocks,
                       bool in_place, const Algo& a) {
  static_assert(check_policy<Algo>());
  static_assert(requires(const algo::ag_problem& p, const node_map& m) { a.all_gather(p); } ||
                    requires(const algo::ag_problem& p, const node_map& m) { a.all_gather(p, m); },
                "collx: this policy has no all_gather schedule (ring, tree and recursive_halving have one)");
  const algo::ag_problem p{comm.rank(), comm.size(), blocks, in_place, 0, sizeof(E)};
  const auto s = cached(comm, a, p, [&] {
    return plan(comm, [&](const auto&... m) -> decltype(a.all_gather(p, m...)) { return a.all_gather(p, m...); });
  });
  execute(comm, call, *s, in, out, no_op{});
}
}  // namespace detail

/// All-gather: every rank contributes k elements; every rank receives all n·k, in rank order.
/// In place when `in` is this rank's block of `out` (in.data() == out.data() + rank·k, as NCCL
/// defines it): the block is already where it belongs.
template <class T, class E, class Algo = algo::automatic>
void all_gather(communicator<T>& comm, std::span<const std::type_identity_t<E>> in, std::span<E> out, Algo a = {}) {
  static_assert(std::is_trivially_copyable_v<E>, "collx: element types must be trivially copyable");
  static_assert(check_policy<Algo>());
  const detail::call_queue::turn turn(detail::queue_of(comm, "all_gather"), "all_gather");
  auto call = detail::make_call<E, no_op>(comm, "all_gather", Algo::name, in.size());
  const auto n = std::size_t(comm.size());
  COLLX_REQUIRE(out.size() / n == in.size() && out.size() % n == 0, comm, call,
                  "the output has " + detail::n_elems(out.size()) + " but must have size x input = " +
                      std::to_string(n) + " x " + std::to_string(in.size()));
  const bool in_place = !in.empty() && in.data() == out.data() + std::size_t(comm.rank()) * in.size();
  COLLX_REQUIRE(in_place || !detail::partially_overlap(in, out), comm, call,
                  "the input and output overlap (in place, the input is this rank's block of the output)");
  detail::with_policy<no_op, algo::collective::all_gather, E>(a, comm, in.size(), call,
                                [&](const auto& pol) {
                                  detail::all_gather_blocks(comm, call, in.data(), out.data(),
                                                            partition(out.size(), comm.size()), in_place, pol);
                                });
}

}  // namespace collx
