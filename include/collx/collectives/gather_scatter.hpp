#pragma once
// gather and scatter move each rank's block straight to or from the root: the root receives (or
// sends) (n-1)·k elements in n-1 messages of one step, the least any algorithm can move through
// the root, so there is no policy to choose.
#include "common.hpp"

namespace collx {

namespace detail {
template <class T>
void check_root(communicator<T>& comm, int root, const call_info& call) {
  COLLX_REQUIRE(root >= 0 && root < comm.size(), comm, call,
                "root " + std::to_string(root) + " is out of range [0, " + std::to_string(comm.size()) + ")");
}
/// gather's, scatter's and barrier's schedules are cached by this shape, as every collective's.
struct direct_shape {
  int rank = 0, size = 1, root = 0;
  std::size_t count = 0;
};

/// They have one schedule each, so automatic is the only policy they take (the policy last, as
/// every collective's).
template <class Algo>
constexpr bool check_direct_policy(const char* = nullptr) {
  static_assert(std::is_same_v<Algo, algo::automatic>,
                "collx: gather, scatter and barrier have one schedule each (straight to or from the root; "
                "dissemination): pass collx::algo::automatic{} or no policy");
  return true;
}
}  // namespace detail

/// Gather: the root receives every rank's k elements in out (n·k, rank order); out is unused
/// elsewhere.
template <class T, class E, class Algo = algo::automatic>
void gather(communicator<T>& comm, std::span<const std::type_identity_t<E>> in, std::span<E> out, int root, Algo = {}) {
  static_assert(std::is_trivially_copyable_v<E>, "collx: element types must be trivially copyable");
  static_assert(detail::check_direct_policy<Algo>());
  const detail::call_queue::turn turn(detail::queue_of(comm, "gather"), "gather");
  auto call = detail::make_call<E, no_op>(comm, "gather", "direct", in.size(), root);
  detail::check_root(comm, root, call);
  const int n = comm.size(), r = comm.rank();
  const std::size_t k = in.size();
  if (r == root) {
    COLLX_REQUIRE(out.size() == detail::checked_mul(comm, call, std::size_t(n), k, "size x input"), comm, call,
                    "the output at the root has " + detail::n_elems(out.size()) + " but must have size x input = " +
                        std::to_string(n) + " x " + std::to_string(k));
    COLLX_REQUIRE(!detail::partially_overlap(in, out), comm, call, "the input and output overlap");
  }
  if (detail::skip_if_empty(comm, call)) return;
  const auto s = detail::cached<1>(comm, algo::automatic{}, detail::direct_shape{r, n, root, k}, [&] {
    schedule g;
    if (r == root) {
      g.copy({buf::out, std::size_t(r) * k, k}, {buf::in, 0, k});
      for (int i = 0; i < n; ++i)
        if (i != r) g.recv(i, {buf::out, std::size_t(i) * k, k});
    } else {
      g.send(root, {buf::in, 0, k});
    }
    return g;
  });
  detail::execute(comm, call, *s, in.data(), out.data(), no_op{});
}

/// Scatter: the root's in (n·k elements, rank order) is split so rank i receives block i in out.
template <class T, class E, class Algo = algo::automatic>
void scatter(communicator<T>& comm, std::span<const std::type_identity_t<E>> in, std::span<E> out, int root, Algo = {}) {
  static_assert(std::is_trivially_copyable_v<E>, "collx: element types must be trivially copyable");
  static_assert(detail::check_direct_policy<Algo>());
  const detail::call_queue::turn turn(detail::queue_of(comm, "scatter"), "scatter");
  auto call = detail::make_call<E, no_op>(comm, "scatter", "direct", out.size(), root);
  detail::check_root(comm, root, call);
  const int n = comm.size(), r = comm.rank();
  const std::size_t k = out.size();
  if (r == root) {
    COLLX_REQUIRE(in.size() == detail::checked_mul(comm, call, std::size_t(n), k, "size x output"), comm, call,
                    "the input at the root has " + detail::n_elems(in.size()) + " but must have size x output = " +
                        std::to_string(n) + " x " + std::to_string(k));
    COLLX_REQUIRE(!detail::partially_overlap(in, out), comm, call, "the input and output overlap");
  }
  if (detail::skip_if_empty(comm, call)) return;
  const auto s = detail::cached<2>(comm, algo::automatic{}, detail::direct_shape{r, n, root, k}, [&] {
    schedule g;
    if (r == root) {
      g.copy({buf::out, 0, k}, {buf::in, std::size_t(r) * k, k});
      for (int i = 0; i < n; ++i)
        if (i != r) g.send(i, {buf::in, std::size_t(i) * k, k});
    } else {
      g.recv(root, {buf::out, 0, k});
    }
    return g;
  });
  detail::execute(comm, call, *s, in.data(), out.data(), no_op{});
}
}  // namespace collx
