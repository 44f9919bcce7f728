#pragma once
#include <numeric>
#include <vector>

#include "common.hpp"

namespace collx {

namespace detail {
/// all_to_all_v's exchange: per-peer counts, so a schedule of its own each call (the counts
/// change from call to call, as MoE's routing does).
template <class T, class E, class Algo>
void all_to_all_run(communicator<T>& comm, const call_info& call, const E* in, E* out,
                    std::span<const std::size_t> sc, std::span<const std::size_t> rc, const Algo& a) {
  const auto n = std::size_t(comm.size());
  std::vector<std::size_t> so(n), ro(n);
  std::exclusive_scan(sc.begin(), sc.end(), so.begin(), std::size_t(0));
  std::exclusive_scan(rc.begin(), rc.end(), ro.begin(), std::size_t(0));
  const schedule s = a.all_to_all({comm.rank(), comm.size(), sc, so, rc, ro, sizeof(E), false});
  execute(comm, call, s, in, out, no_op{});
}

/// The uniform all_to_all's shape: what its cached schedule is keyed by.
struct a2a_shape {
  int rank = 0, size = 1;
  std::size_t block = 0, elem_size = 1;
};

/// all_to_all's exchange: k elements per peer, its schedule cached per shape as every
/// collective's is.
template <class T, class E, class Algo>
void all_to_all_uniform(communicator<T>& comm, const call_info& call, const E* in, E* out, std::size_t k, const Algo& a) {
  const a2a_shape shape{comm.rank(), comm.size(), k, sizeof(E)};
  const auto s = cached(comm, a, shape, [&] {
    const auto n = std::size_t(shape.size);
    std::vector<std::size_t> counts(n, k), offs(n);
    for (std::size_t i = 0; i < n; ++i) offs[i] = i * k;
    return a.all_to_all({shape.rank, shape.size, counts, offs, counts, offs, sizeof(E), true});
  });
  execute(comm, call, *s, in, out, no_op{});
}

template <class Algo>
constexpr bool check_a2a_policy() {
  static_assert(check_policy<Algo>());
  static_assert(std::is_same_v<Algo, algo::pairwise> || std::is_same_v<Algo, algo::automatic>,
                "collx: all_to_all runs with collx::algo::pairwise{} (or automatic{}); ring, tree and "
                "recursive_halving have no all-to-all schedule");
  return true;
}
}  // namespace detail

/// All-to-all: in holds n blocks of k elements, block j for rank j; out receives block i from
/// rank i at position i.
template <class T, class E, class Algo = algo::automatic>
void all_to_all(communicator<T>& comm, std::span<const std::type_identity_t<E>> in, std::span<E> out, Algo a = {}) {
  static_assert(std::is_trivially_copyable_v<E>, "collx: element types must be trivially copyable");
  static_assert(detail::check_a2a_policy<Algo>());
  const detail::call_queue::turn turn(detail::queue_of(comm, "all_to_all"), "all_to_all");
  auto call = detail::make_call<E, no_op>(comm, "all_to_all", Algo::name, in.size());
  const auto n = std::size_t(comm.size());
  COLLX_REQUIRE(in.size() % n == 0, comm, call,
                  "the input has " + detail::n_elems(in.size()) + ", not a multiple of the " + std::to_string(n) + " ranks");
  COLLX_REQUIRE(out.size() == in.size(), comm, call,
                  "the output has " + detail::n_elems(out.size()) + " but the input has " + std::to_string(in.size()));
  COLLX_REQUIRE(!detail::partially_overlap(in, out) && !(in.data() == out.data() && !in.empty()), comm, call,
                  "the input and output overlap (all_to_all has no in-place form)");
  detail::with_policy<no_op, algo::collective::all_to_all, E>(a, comm, in.size() / n, call, [&](const auto& pol) {
    detail::all_to_all_uniform(comm, call, in.data(), out.data(), in.size() / n, pol);
  });
}

/// All-to-all with per-rank counts: in holds send_counts[j] elements for rank j, packed in rank
/// order; out receives recv_counts[i] elements from rank i, packed in rank order. The counts
/// must sum to the sizes of in and out, and recv_counts[i] on this rank must equal
/// send_counts[this rank] on rank i (errc::mismatch otherwise).
template <class T, class E, class Algo = algo::automatic>
void all_to_all_v(communicator<T>& comm, std::span<const std::type_identity_t<E>> in,
                  std::span<const std::size_t> send_counts, std::span<E> out,
                  std::span<const std::size_t> recv_counts, Algo = {}) {
  static_assert(std::is_trivially_copyable_v<E>, "collx: element types must be trivially copyable");
  static_assert(detail::check_a2a_policy<Algo>());
  const detail::call_queue::turn turn(detail::queue_of(comm, "all_to_all_v"), "all_to_all_v");
  auto call = detail::make_call<E, no_op>(comm, "all_to_all_v", algo::pairwise::name, 0);
  const auto n = std::size_t(comm.size());
  COLLX_REQUIRE(send_counts.size() == n && recv_counts.size() == n, comm, call,
                  "send_counts and recv_counts need one entry per rank (" + std::to_string(n) + "), got " +
                      std::to_string(send_counts.size()) + " and " + std::to_string(recv_counts.size()));
  // Sums that wrap could equal the spans' sizes and send the copies out of bounds: checked.
  std::size_t ns = 0, nr = 0;
  for (std::size_t x : send_counts) ns = detail::checked_add(comm, call, ns, x, "send_counts add up to more than");
  for (std::size_t x : recv_counts) nr = detail::checked_add(comm, call, nr, x, "recv_counts add up to more than");
  COLLX_REQUIRE(ns == in.size(), comm, call,
                  "send_counts add up to " + std::to_string(ns) + " but the input has " + detail::n_elems(in.size()));
  COLLX_REQUIRE(nr == out.size(), comm, call,
                  "recv_counts add up to " + std::to_string(nr) + " but the output has " + detail::n_elems(out.size()));
  COLLX_REQUIRE(!detail::partially_overlap(in, out) && !(in.data() == out.data() && !in.empty()), comm, call,
                  "the input and output overlap (all_to_all_v has no in-place form)");
  detail::all_to_all_run(comm, call, in.data(), out.data(), send_counts, recv_counts, algo::pairwise{});
}

}  // namespace collx
