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
// and means the model. `two_level` names algo::two_level: it runs on a communicator laid out on
// several nodes, for a collective and op it has a form for, and elsewhere (a non-commutative op
// too, per collective or not) the model chooses. A misspelt name, or a policy that has no
// schedule for the collective named, is an errc::invalid_argument error, never a silent default; a per-collective override
// of a flat policy that cannot honour a non-commutative op is an error at the call, a global one
// yields to the model for that call.
//
// Learning from the calls (COLLX_AUTOTUNE=1). The model is only as good as its parameters, and a
// machine with no calibration of its own has the shipped ones, measured elsewhere. With
// COLLX_AUTOTUNE=1 (rank 0's setting counts), a new shape's (collective, count, element size)
// first call runs the model's pick untimed (it pays what a first call pays: schedules built,
// memory touched), then the next calls try the model's closest candidates (up to three,
// predicted within 2.5x of its pick; two above 5 ms) in turn, each for a few calls (4 below 20
// us predicted, 2 below 200 us, else 1), timed, the model's pick last. Then, in that shape's
// next call, the ranks pool their timings (a gather and a broadcast of a few doubles, bytes
// only) and all keep the candidate whose slowest rank was fastest; the model's pick keeps its
// place unless another is more than 3% faster. The trying calls are real calls with real
// results, only in another policy; every rank takes the same turns (the calls are the same on
// every rank) and the same verdict (the same pooled numbers). Off by default: measured in
// bench/compare_gloo.sh's and compare_mpi.sh's sweeps, whose 1-3 timed calls at large sizes
// leave no room for trying, it did not bring automatic within 10% of the best (docs/automatic.md).
#include <cstddef>
#include <cstdint>
#include <span>

#include "../core/concepts.hpp"
#include "collectives.hpp"

namespace collx::algo {

struct automatic {
  using algorithm_policy_concept = algorithm_policy_tag;
  static constexpr const char* name = "automatic";
};

/// A concrete policy: its place in algo::policies (algo/policies.hpp), where the list is.
enum class choice : std::int8_t {};

/// COLLX_AUTOTUNE's verdict on one shape: `slowest[i]`, candidate i's time (its slowest rank's
/// fastest call); `model`, the model's pick. The fastest, unless the model's pick is within 3%
/// of it (a tie in the noise goes to the model).
inline int settle(std::span<const double> slowest, int model) {
  int fastest = model;
  for (int i = 0; i < int(slowest.size()); ++i)
    if (slowest[std::size_t(i)] < slowest[std::size_t(fastest)]) fastest = i;
  return slowest[std::size_t(model)] <= slowest[std::size_t(fastest)] * 1.03 ? model : fastest;
}

}  // namespace collx::algo
