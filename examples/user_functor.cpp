// user_functor: reductions the library does not ship, over types it has never seen.
//
// A collx reduction op is any functor that
//   - opts in with `using reduction_op_concept = collx::reduction_op_tag;` (so nothing matches by
//     accident),
//   - combines two elements: `E operator()(const E&, const E&) const`, E trivially copyable,
//   - and is associative. It is assumed commutative unless it says
//     `static constexpr bool commutative = false;`, and then every policy either reduces in rank
//     order, result = in_0 ⊕ in_1 ⊕ ... ⊕ in_(N-1), or refuses to compile.
//
// Part 1: a commutative op over a user struct: merging Welford running statistics {count, mean,
// M2} (the parallel form of Welford's online variance, Chan, Golub and LeVeque 1979). Each rank
// summarises its own samples per feature; one all-reduce gives every rank the statistics of all
// samples, as a data-parallel job does to compute a global batch norm or to normalise inputs.
//
// Part 2: a non-commutative op: composition of affine maps x -> a·x + b over the integers mod 2^32,
// reduced with algo::tree and algo::recursive_halving, checked against a serial left-to-right fold.
// Exits non-zero if any result is wrong.
#include <collx/collx.hpp>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <span>
#include <string>
#include <vector>

namespace {

// ---- part 1: Welford statistics, commutative ------------------------------------------------

/// Running statistics of a set of samples: how many, their mean, and M2 = Σ (x - mean)²
/// (variance = M2 / (count - 1)). Trivially copyable, as every collx element type must be.
struct welford {
  double count = 0, mean = 0, m2 = 0;
};

/// Merges the statistics of two disjoint sets of samples. Exact arithmetic would make this
/// associative and commutative; in floating point both hold only up to rounding.
struct merge_welford {
  using reduction_op_concept = collx::reduction_op_tag;
  static constexpr const char* name = "merge_welford";  // optional: names the op in error messages
  welford operator()(const welford& a, const welford& b) const {
    if (a.count == 0) return b;
    if (b.count == 0) return a;
    const double n = a.count + b.count, delta = b.mean - a.mean;
    return {n, a.mean + delta * (b.count / n), a.m2 + b.m2 + delta * delta * (a.count * b.count / n)};
  }
};

constexpr int kStatRanks = 6;  // not a power of two: recursive halving folds a pair of ranks
constexpr std::size_t kFeatures = 1000;

/// Rank r holds 40 + 7r samples of each feature (uneven, as the last batch of an epoch is), here
/// a deterministic pseudo-random stream so that the reference can regenerate them.
std::size_t samples_on(int rank) { return 40 + 7 * std::size_t(rank); }
double sample(int rank, std::size_t j, std::size_t feature) {
  std::uint64_t h = (std::uint64_t(rank) << 40) ^ (std::uint64_t(j) << 20) ^ feature;
  h = (h ^ (h >> 31)) * 0x9e3779b97f4a7c15ull;
  h ^= h >> 29;
  return double(feature % 17) + double(h % 100000) / 1000.0;  // in [f % 17, f % 17 + 100): means differ per feature
}

/// The statistics of rank r's samples of one feature (Welford's online update).
welford local_stats(int rank, std::size_t feature) {
  welford w;
  for (std::size_t j = 0; j < samples_on(rank); ++j) {
    const double x = sample(rank, j, feature);
    w.count += 1;
    const double d = x - w.mean;
    w.mean += d / w.count;
    w.m2 += d * (x - w.mean);
  }
  return w;
}

/// The reference: two passes over every sample of every rank, in one place.
welford reference_stats(std::size_t feature) {
  double n = 0, sum = 0;
  for (int r = 0; r < kStatRanks; ++r)
    for (std::size_t j = 0; j < samples_on(r); ++j) { n += 1; sum += sample(r, j, feature); }
  const double mean = sum / n;
  double m2 = 0;
  for (int r = 0; r < kStatRanks; ++r)
    for (std::size_t j = 0; j < samples_on(r); ++j) m2 += (sample(r, j, feature) - mean) * (sample(r, j, feature) - mean);
  return {n, mean, m2};
}

// The check needs a tolerance: the merges happen in a different order on each policy (the ring
// merges a block's partial around the ring starting after its owner, the tree up its subtrees,
// halving between ranks N/2 apart first), and each order rounds differently. All orders agree
// with the exact value to within a few units in the last place, times the number of merges; a
// relative tolerance of 1e-12 is far above that (~1e-15 per operation) and far below any real
// error (a wrong merge formula or a lost rank moves the mean or M2 by more than 1e-3). The count
// is a sum of small integers, exact in any order, and compared exactly.
bool close(double got, double want) { return std::abs(got - want) <= 1e-12 * std::abs(want); }

template <class Algo>
bool run_welford(Algo algo) {
  std::atomic<std::size_t> wrong{0};
  double worst = 0;  // rank 0's largest relative error, for the report
  collx::launch_threads(kStatRanks, [&](auto& comm) {
    std::vector<welford> mine(kFeatures), all(kFeatures);
    for (std::size_t f = 0; f < kFeatures; ++f) mine[f] = local_stats(comm.rank(), f);
    collx::all_reduce(comm, std::span<const welford>{mine}, std::span{all}, merge_welford{}, algo);
    for (std::size_t f = 0; f < kFeatures; ++f) {
      const welford want = reference_stats(f), got = all[f];
      if (got.count != want.count || !close(got.mean, want.mean) || !close(got.m2, want.m2)) ++wrong;
      if (comm.rank() == 0)
        worst = std::max({worst, std::abs(got.mean - want.mean) / want.mean, std::abs(got.m2 - want.m2) / want.m2});
    }
  });
  const welford ex = reference_stats(0);
  std::printf("  %-18s %s  (feature 0: n = %.0f, mean = %.6f, variance = %.6f; largest relative error %.1e)\n",
              Algo::name, wrong == 0 ? "ok" : (std::to_string(wrong.load()) + " WRONG").c_str(), ex.count, ex.mean,
              ex.m2 / (ex.count - 1), worst);
  return wrong == 0;
}

// ---- part 2: composition of affine maps, not commutative -------------------------------------

/// The map x -> a·x + b over the integers mod 2^32 (unsigned arithmetic wraps, exactly).
struct affine {
  std::uint32_t a = 1, b = 0;
  friend bool operator==(const affine&, const affine&) = default;
};

/// f ⊕ g = "apply f, then g": x -> g.a·(f.a·x + f.b) + g.b. Composition is associative but not
/// commutative, so a reduction must keep rank order: in_0 ⊕ in_1 ⊕ ... ⊕ in_(N-1) applies rank
/// 0's map first and rank N-1's last, the pipeline of transforms in rank order.
struct compose {
  using reduction_op_concept = collx::reduction_op_tag;
  static constexpr bool commutative = false;
  static constexpr const char* name = "compose";
  affine operator()(const affine& f, const affine& g) const { return {g.a * f.a, g.a * f.b + g.b}; }
};

// With a non-commutative op, algo::ring does not compile:
//
//   collx::all_reduce(comm, std::span{maps}, compose{}, collx::algo::ring{});
//   error: static assertion failed: collx: this policy combines in ring order, not rank order, so it
//          cannot honour an op declared `commutative = false`: use collx::algo::tree{}, ...
//
// Why: the ring's reduce-scatter starts the partial of block b at rank b+1 and carries it once
// round the ring, so block b comes out as in_(b+1) ⊕ ... ⊕ in_(N-1) ⊕ in_0 ⊕ ... ⊕ in_b: rank order
// rotated, by a different amount for every block. tree keeps order because the subtrees it
// combines are ranges of consecutive ranks; recursive_halving switches, for such ops, to
// recursive doubling on whole vectors, where partners always hold adjacent rank ranges
// (at log2 N · D bytes per rank instead of (N-1)/N · D: the price of order). algo::automatic
// picks recursive_halving for non-commutative ops.

constexpr int kMapRanks = 7;
constexpr std::size_t kMaps = 10'007;

affine map_of(int rank, std::size_t i) {
  std::uint32_t h = std::uint32_t(i) * 2654435761u ^ std::uint32_t(rank + 1) * 40503u;
  h ^= h >> 15;
  h *= 0x2c1b3c6du;
  return {h | 1u, h >> 3};  // odd a: a product of a's is never 0 mod 2^32, so no map degenerates to a constant
}

/// The serial left-to-right fold: ((in_0 ⊕ in_1) ⊕ in_2) ⊕ ... ⊕ in_(N-1).
affine fold_in_rank_order(std::size_t i) {
  affine acc = map_of(0, i);
  for (int r = 1; r < kMapRanks; ++r) acc = compose{}(acc, map_of(r, i));
  return acc;
}

template <class Algo>
bool run_compose(Algo algo) {
  std::atomic<std::size_t> wrong{0};
  constexpr int root = 3;
  constexpr std::size_t k = kMaps / kMapRanks + 1;  // reduce_scatter: k maps per rank
  collx::launch_threads(kMapRanks, [&](auto& comm) {
    const int r = comm.rank();
    std::vector<affine> maps(kMaps), out(kMaps);
    for (std::size_t i = 0; i < kMaps; ++i) maps[i] = map_of(r, i);

    collx::all_reduce(comm, std::span<const affine>{maps}, std::span{out}, compose{}, algo);  // out of place
    for (std::size_t i = 0; i < kMaps; ++i) wrong += out[i] == fold_in_rank_order(i) ? 0 : 1;

    std::vector<affine> at_root(r == root ? kMaps : 0);
    collx::reduce(comm, std::span<const affine>{maps}, std::span{at_root}, compose{}, root, algo);
    for (std::size_t i = 0; i < at_root.size(); ++i) wrong += at_root[i] == fold_in_rank_order(i) ? 0 : 1;

    std::vector<affine> many(k * kMapRanks), mine(k);
    for (std::size_t i = 0; i < many.size(); ++i) many[i] = map_of(r, i);
    collx::reduce_scatter(comm, std::span<const affine>{many}, std::span{mine}, compose{}, algo);
    for (std::size_t i = 0; i < k; ++i) wrong += mine[i] == fold_in_rank_order(std::size_t(r) * k + i) ? 0 : 1;

    collx::all_reduce(comm, std::span{maps}, compose{}, algo);  // in place
    for (std::size_t i = 0; i < kMaps; ++i) wrong += maps[i] == fold_in_rank_order(i) ? 0 : 1;
  });
  std::printf("  %-18s all_reduce (out of place, in place), reduce (root %d), reduce_scatter: %s\n", Algo::name, root,
              wrong == 0 ? "equal to the serial fold" : (std::to_string(wrong.load()) + " WRONG elements").c_str());
  return wrong == 0;
}

}  // namespace

int main() {
  bool ok = true;
  try {
    std::printf("Welford statistics {count, mean, M2} of %zu features, merged over %d ranks (%zu samples in all),\n"
                "against a two-pass computation over every sample (relative tolerance 1e-12: see the source):\n",
                kFeatures, kStatRanks, [] { std::size_t s = 0; for (int r = 0; r < kStatRanks; ++r) s += samples_on(r); return s; }());
    ok = run_welford(collx::algo::ring{}) && ok;
    ok = run_welford(collx::algo::tree{}) && ok;
    ok = run_welford(collx::algo::recursive_halving{}) && ok;

    // Order matters for this op: show it, so that the checks below mean something.
    std::size_t differ = 0;
    for (std::size_t i = 0; i < kMaps; ++i) {
      affine reversed = map_of(kMapRanks - 1, i);
      for (int r = kMapRanks - 2; r >= 0; --r) reversed = compose{}(reversed, map_of(r, i));
      differ += reversed == fold_in_rank_order(i) ? 0 : 1;
    }
    std::printf("\nComposition of affine maps x -> a*x + b mod 2^32, %zu per rank over %d ranks: not commutative\n"
                "(folding in reverse rank order gives a different map for %zu of %zu elements). Every result must\n"
                "equal the serial left-to-right fold in0 (+) in1 (+) ... (+) in%d, exactly:\n",
                kMaps, kMapRanks, differ, kMaps, kMapRanks - 1);
    ok = run_compose(collx::algo::tree{}) && ok;
    ok = run_compose(collx::algo::recursive_halving{}) && ok;
    ok = run_compose(collx::algo::automatic{}) && ok;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "user_functor: %s\n", e.what());
    return 1;
  }
  std::printf(ok ? "all results correct\n" : "WRONG RESULTS\n");
  return ok ? 0 : 1;
}
