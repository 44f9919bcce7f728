#pragma once
// algo::automatic — picks a policy per call: the one with the least time predicted by the cost
// model (algo/model.hpp), from the collective, the rank count, the message size, the element size,
// whether the op is commutative, and α, β, γ for the transport (algo/calibration.hpp).
//
// Every rank must choose alike, so at a communicator's first automatic call rank 0's parameters
// and its COLLX_ALGO reach every rank in one small broadcast (a job whose hosts have different
// calibrations still agrees); from then on each rank computes the same choice from the same
// arguments, with no further communication (a rank that passed a different count gets
// errc::mismatch, as with any policy).
//
// COLLX_ALGO overrides the model: a policy name for every collective that has that policy
// (`COLLX_ALGO=ring`), or per collective (`COLLX_ALGO=all_reduce=tree,all_gather=ring`), or both
// (`ring,broadcast=tree`: a collective named explicitly takes its own). `automatic` is allowed
// and means the model. A misspelt name, or a policy that has no schedule for the collective
// named, is an errc::invalid_argument error, never a silent default; a per-collective override
// that cannot honour a non-commutative op is an error at the call, a global one yields to the
// model for that call.
#include <cstddef>
#include <cstdint>

#include "../core/concepts.hpp"
#include "collectives.hpp"

namespace collx::algo {

struct automatic {
  using algorithm_policy_concept = algorithm_policy_tag;
  static constexpr const char* name = "automatic";
};

/// A concrete policy: its place in algo::policies (algo/policies.hpp), where the list is.
enum class choice : std::int8_t {};

}  // namespace collx::algo
