#pragma once
// all_reduce is reduce_scatter followed by all_gather over the same blocks — no loop of its own
// (algo/compose.hpp builds the pair, in segments for large buffers).
// A policy whose natural all-reduce is something else (tree: reduce + broadcast over a double
// binary tree) supplies all_reduce() itself, and then that runs instead.
#include "all_gather.hpp"
#include "reduce_scatter.hpp"
#include "compressed.hpp"
#include "../algo/compose.hpp"

namespace collx {

namespace detail {
/// all_reduce with the concrete policy `pol` (a function of its own, not with_policy's lambda: so
/// a policy that automatic chooses and the same policy named by the caller share one
/// instantiation).
template <class T, class E, class Op, class Bufs, class P>
void all_reduce_with(communicator<T>& comm, const call_info& call, const Bufs& b, std::size_t count, const Op& op,
                     const P& pol) {
  static_assert(check_reducing<E, Op, P>());
  const buf src = b.in_place() ? buf::out : buf::in;
  const algo::ar_problem p{comm.rank(), comm.size(), count, sizeof(E), is_commutative_v<Op>, src, algo::is_deterministic_v<P> && stepwise_exact_v<Op, E>};
  if constexpr (requires(const algo::ar_problem& q, const node_map& m) { pol.all_reduce(q); } ||
                requires(const algo::ar_problem& q, const node_map& m) { pol.all_reduce(q, m); }) {
    // The policy's own all-reduce (over the communicator's node map for a node-aware one: the
    // map is the communicator's for its life, so not in the key).
    const auto s = cached(comm, pol, p, [&] {
          schedule x = plan(comm, [&](const auto&... m) -> decltype(pol.all_reduce(p, m...)) { return pol.all_reduce(p, m...); });
          x.finalize({buf::out, 0, count});
          return x;
        });
    execute<T, E>(comm, call, *s, b, op);
  } else {
    if constexpr (algo::is_deterministic_v<P>) {
      if (P::all_reduce_gathers(p)) {
        // small: every input gathered and folded on every rank (algo/deterministic.hpp)
        const auto s = cached</*gathered*/ 2>(comm, pol, p, [&] { return P::gathered_all_reduce(p); });  // (its fold finalizes)
        execute<T, E>(comm, call, *s, b, op);
        return;
      }
    }
    // Reduce-scatter + all-gather, per segment for a large buffer (algo/compose.hpp): every
    // segment but the last has the same schedule, so two are built, and each segment runs
    // as its own schedule on its part of the buffer; avg divides once, at the end.
    const std::size_t seg = algo::tuning::all_reduce_segment(count, sizeof(E));
    auto segment = [&](std::size_t len) {
      const algo::ar_problem q{p.rank, p.size, len, p.elem_size, p.commutative, src, p.stepwise_exact};
      return cached</*composed segment*/ 1>(comm, pol, q, [&] { return algo::composed_segment(pol, q); });
    };
    const auto full = segment(std::min(seg, count));
    for (std::size_t off = 0; off < count; off += seg) {
      const std::size_t len = std::min(seg, count - off);
      if (len == std::min(seg, count)) execute<T, E>(comm, call, *full, b + off, op);
      else execute<T, E>(comm, call, *segment(len), b + off, op);
    }
    if constexpr (has_finalize_v<Op, E> && !algo::is_deterministic_v<P>)  // (deterministic's folds finalize)
      finalize_all<E, Op>(comm, b, count);
  }
}

/// Over two pointers (flat_buffers) or a fused batch's pieces (spread_buffers: features/fuse.hpp).
template <class T, class E, class Op, class Algo, class Bufs>
void all_reduce_impl(communicator<T>& comm, call_info& call, const Bufs& given, std::size_t count, Op op, Algo a) {
  if constexpr (algo::is_compressed_v<Algo>) {  // (collectives/compressed.hpp)
    static_assert(std::is_same_v<E, float>, "collx: algo::compressed sends float data in a smaller format: the elements are float");
    static_assert(std::is_same_v<Bufs, flat_buffers<E>>, "collx: algo::compressed encodes one flat buffer (a fused batch packs its parts for it)");
    if (!skip_if_empty(comm, call)) compressed_all_reduce<T, Op>(comm, call, given.in, given.out, count, a);
  } else {
    const Bufs b = prescaled<E>(comm, op, given, count);  // (premul_sum: this rank's input scaled)
    with_policy<Op, algo::collective::all_reduce, E>(
        a, comm, count, call, [&](const auto& pol) { all_reduce_with<T, E>(comm, call, b, count, op, pol); });
  }
}
}  // namespace detail

/// All-reduce, out of place: out[i] = in_0[i] ⊕ in_1[i] ⊕ ... ⊕ in_(n-1)[i] on every rank.
template <class T, class E, class Op, class Algo = algo::automatic>
void all_reduce(communicator<T>& comm, std::span<const std::type_identity_t<E>> in, std::span<E> out, Op op,
                Algo a = {}) {
  static_assert(detail::check_reducing<E, Op, Algo>());
  const detail::call_queue::turn turn(detail::queue_of(comm, "all_reduce"), "all_reduce");
  auto call = detail::make_call<E, Op>(comm, "all_reduce", Algo::name, in.size());
  COLLX_REQUIRE(out.size() == in.size(), comm, call,
                  "the output has " + detail::n_elems(out.size()) + " but the input has " + std::to_string(in.size()));
  COLLX_REQUIRE(!detail::partially_overlap(in, out), comm, call, "the input and output overlap");
  detail::all_reduce_impl<T, E>(comm, call, detail::flat_buffers<E>{in.data(), out.data()}, in.size(), op, a);
}

/// All-reduce in place.
template <class T, class E, class Op, class Algo = algo::automatic>
  requires(!detail::is_span_v<Op>)
void all_reduce(communicator<T>& comm, std::span<E> buf, Op op, Algo a = {}) {
  static_assert(detail::check_reducing<E, Op, Algo>());
  const detail::call_queue::turn turn(detail::queue_of(comm, "all_reduce"), "all_reduce");
  auto call = detail::make_call<E, Op>(comm, "all_reduce", Algo::name, buf.size());
  detail::all_reduce_impl<T, E>(comm, call, detail::flat_buffers<E>{buf.data(), buf.data()}, buf.size(), op, a);
}

}  // namespace collx
