#pragma once
// algo::automatic — picks a policy per call from the collective, the rank count, the message size
// and whether the op is commutative. Every rank computes the same choice from the same arguments,
// so no agreement step is needed (a rank that passed a different count gets errc::mismatch).
#include <cstddef>

#include "../concepts.hpp"
#include "tuning.hpp"

namespace collx::algo {

struct automatic {
  using algorithm_policy_concept = algorithm_policy_tag;
  static constexpr const char* name = "automatic";
};

enum class collective { all_reduce, reduce_scatter, all_gather, broadcast, reduce, all_to_all };

enum class choice { ring, tree, recursive_halving, recursive_doubling, pairwise };

/// The rule automatic follows (to be replaced by the cost model's least predicted time): small
/// messages go to the log-step policies, large ones to the bandwidth-optimal ring, and
/// non-commutative reductions to recursive halving, which keeps rank order at every size.
/// Two ranks count as small: every policy is then the same single exchange.
constexpr choice choose(collective c, int n, std::size_t bytes, bool commutative) {
  const bool small = bytes <= tuning::small_message_bytes || n <= 2;
  switch (c) {
    case collective::all_to_all: return choice::pairwise;
    case collective::broadcast: return small ? choice::tree : choice::ring;
    case collective::reduce:
      if (!commutative) return choice::recursive_halving;
      return small ? choice::tree : choice::ring;
    case collective::all_reduce:
      if (bytes <= tuning::latency_bound_bytes) return choice::recursive_doubling;
      if (!commutative) return choice::recursive_halving;
      return small ? choice::tree : choice::ring;
    case collective::all_gather:
    case collective::reduce_scatter:
      if (!commutative || small) return choice::recursive_halving;
      return choice::ring;
  }
  return choice::ring;
}

}  // namespace collx::algo
