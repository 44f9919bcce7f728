#pragma once
// What every collective shares: argument checks, the compile-time checks of its policy and op,
// and the resolution of algo::automatic to a concrete policy.
#include <span>
#include <string>
#include <type_traits>

#include "../algo/automatic.hpp"
#include "../algo/pairwise.hpp"
#include "../algo/recursive_doubling.hpp"
#include "../algo/recursive_halving.hpp"
#include "../algo/ring.hpp"
#include "../algo/tree.hpp"
#include "../executor.hpp"

namespace collx::detail {

template <class X>
inline constexpr bool is_span_v = false;
template <class X, std::size_t N>
inline constexpr bool is_span_v<std::span<X, N>> = true;

/// True when two spans share memory without being the same range.
template <class A, class B>
bool partially_overlap(std::span<A> a, std::span<B> b) {
  const auto* a0 = reinterpret_cast<const std::byte*>(a.data());
  const auto* b0 = reinterpret_cast<const std::byte*>(b.data());
  const auto* a1 = a0 + a.size_bytes();
  const auto* b1 = b0 + b.size_bytes();
  if (a.empty() || b.empty()) return false;
  return a0 < b1 && b0 < a1 && !(a0 == b0 && a1 == b1);
}

inline std::string n_elems(std::size_t n) { return std::to_string(n) + (n == 1 ? " element" : " elements"); }

/// The compile-time checks of a reducing collective: E, Op and Algo fit together.
template <class E, class Op, class Algo>
constexpr bool check_reducing() {
  static_assert(check_op<Op, E>());
  static_assert(check_policy<Algo>());
  if constexpr (!std::is_same_v<Algo, algo::automatic>)
    static_assert(is_commutative_v<Op> || Algo::keeps_rank_order,
                  "collx: this policy combines in ring order, not rank order, so it cannot honour an op declared "
                  "`commutative = false`: use collx::algo::tree{}, collx::algo::recursive_halving{} or "
                  "collx::algo::automatic{}");
  return true;
}

/// Calls f with the concrete policy to run: algo itself, or automatic's choice.
template <class Op, algo::collective C, class Algo, class F>
void with_policy(const Algo& a, int n, std::size_t bytes, call_info& call, F&& f) {
  if constexpr (std::is_same_v<Algo, algo::automatic>) {
    constexpr bool comm = is_commutative_v<Op>;
    switch (algo::choose(C, n, bytes, comm)) {
      case algo::choice::ring:
        if constexpr (comm) {
          set_name(call.sig.policy, algo::ring::name);
          f(algo::ring{});
          return;
        }
        break;
      case algo::choice::tree:
        set_name(call.sig.policy, algo::tree::name);
        f(algo::tree{});
        return;
      case algo::choice::recursive_doubling:
        if constexpr (C == algo::collective::all_reduce) {
          set_name(call.sig.policy, algo::recursive_doubling::name);
          f(algo::recursive_doubling{});
          return;
        }
        break;
      default: break;
    }
    set_name(call.sig.policy, algo::recursive_halving::name);
    f(algo::recursive_halving{});
  } else {
    f(a);
  }
}

}  // namespace collx::detail
