#pragma once
// The policies algo::automatic chooses among, COLLX_ALGO names, the cost model analyses and
// collx-explain prints: one list. A new policy is its file and one line here; its name, its
// place in the model's tables, the collectives it serves (by the schedules it has) and the
// dispatch of automatic all follow from the list.
#include <cstdint>
#include <tuple>
#include <type_traits>
#include <utility>

#include "automatic.hpp"
#include "pairwise.hpp"
#include "recursive_doubling.hpp"
#include "recursive_halving.hpp"
#include "ring.hpp"
#include "tree.hpp"

namespace collx::algo {

template <class... P>
struct policy_list {
  static constexpr std::size_t size = sizeof...(P);
  using tuple = std::tuple<P...>;
};

/// The list. Order matters only where the model's predictions tie (the first wins).
using policies = policy_list<ring, tree, recursive_halving, recursive_doubling, pairwise>;
using policy_tuple = policies::tuple;

namespace detail {
template <class A, class... P>
constexpr int index_in(policy_list<P...>) {
  int i = 0, found = -1;
  ((std::is_same_v<A, P> ? (found = i, ++i) : ++i), ...);
  return found;
}
template <class F, class... P>
constexpr void each(policy_list<P...>, F&& f) {
  (f.template operator()<P>(), ...);
}
}  // namespace detail

/// A policy's choice: its place in the list.
template <class A>
inline constexpr choice choice_of = [] {
  constexpr int i = detail::index_in<A>(policies{});
  static_assert(i >= 0, "collx: this policy is not in algo::policies (algo/policies.hpp)");
  return choice(i);
}();

/// Calls f.template operator()<P>() for every policy P, in the list's order.
template <class F>
constexpr void for_each_policy(F&& f) {
  detail::each(policies{}, std::forward<F>(f));
}

static_assert(policies::size <= std::size_t(policy_fit::kPolicies),
              "collx: more policies than policy_fit::kPolicies (algo/profile.hpp) has room for");

}  // namespace collx::algo
