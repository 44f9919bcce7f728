#pragma once
// all_reduce is reduce_scatter followed by all_gather over the same blocks — no loop of its own
// (algo/compose.hpp builds the pair, in segments for large buffers).
// A policy whose natural all-reduce is something else (tree: reduce + broadcast over a double
// binary tree) supplies all_reduce() itself, and then that runs instead.
#include "all_gather.hpp"
#include "reduce_scatter.hpp"
#include "../algo/compose.hpp"

namespace collx {

namespace detail {
template <class T, class E, class Op, class Algo>
void all_reduce_impl(communicator<T>& comm, call_info& call, const E* in, E* out, std::size_t count, Op op,
                     Algo a) {
  const buf src = in == out ? buf::out : buf::in;
  with_policy<Op, algo::collective::all_reduce, E>(a, comm, count, call, [&](const auto& pol) {
    if constexpr (requires(const algo::ar_problem& p) { pol.all_reduce(p); }) {
      using P = std::decay_t<decltype(pol)>;
      static_assert(check_reducing<E, Op, P>());
      const algo::ar_problem p{comm.rank(), comm.size(), count, sizeof(E), is_commutative_v<Op>, src};
      const schedule& s = cached<P, algo::ar_problem>(
          comm, pol, {rank_and_size(p.rank, p.size), count, sizeof(E), p.commutative, std::uint64_t(src)}, [&] {
            schedule x = pol.all_reduce(p);
            x.finalize({buf::out, 0, count});
            return x;
          });
      execute(comm, call, s, in, out, op);
    } else {
      using P = std::decay_t<decltype(pol)>;
      static_assert(check_reducing<E, Op, P>());
      const algo::ar_problem p{comm.rank(), comm.size(), count, sizeof(E), is_commutative_v<Op>, src};
      const schedule& s = cached<P, algo::ar_problem>(
          comm, pol, {rank_and_size(p.rank, p.size), count, sizeof(E), p.commutative, std::uint64_t(src)},
          [&] { return algo::composed_all_reduce(pol, p); });
      execute(comm, call, s, in, out, op);
    }
  });
}
}  // namespace detail

/// All-reduce, out of place: out[i] = in_0[i] ⊕ in_1[i] ⊕ ... ⊕ in_(n-1)[i] on every rank.
template <class T, class E, class Op, class Algo = algo::automatic>
void all_reduce(communicator<T>& comm, std::span<const std::type_identity_t<E>> in, std::span<E> out, Op op,
                Algo a = {}) {
  static_assert(detail::check_reducing<E, Op, Algo>());
  auto call = detail::make_call<E, Op>(comm, "all_reduce", Algo::name, in.size());
  COLLX_REQUIRE(out.size() == in.size(), call,
                  "the output has " + detail::n_elems(out.size()) + " but the input has " + std::to_string(in.size()));
  COLLX_REQUIRE(!detail::partially_overlap(in, out), call, "the input and output overlap");
  detail::all_reduce_impl(comm, call, in.data(), out.data(), in.size(), op, a);
}

/// All-reduce in place.
template <class T, class E, class Op, class Algo = algo::automatic>
  requires(!detail::is_span_v<Op>)
void all_reduce(communicator<T>& comm, std::span<E> buf, Op op, Algo a = {}) {
  static_assert(detail::check_reducing<E, Op, Algo>());
  auto call = detail::make_call<E, Op>(comm, "all_reduce", Algo::name, buf.size());
  detail::all_reduce_impl(comm, call, static_cast<const E*>(buf.data()), buf.data(), buf.size(), op, a);
}

}  // namespace collx
