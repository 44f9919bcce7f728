#pragma once
// The problems a policy turns into schedules. Each names, for one rank, the sizes, the layout of
// the blocks (core/partition.hpp) and which buffer holds what; a policy reads nothing else.
#include <cstddef>

#include "../core/partition.hpp"
#include "../core/schedule.hpp"
#include "tuning.hpp"

namespace collx::algo {

constexpr int mod(int a, int n) noexcept { return ((a % n) + n) % n; }

/// Largest power of two <= n (n >= 1).
constexpr int floor_pow2(int n) noexcept {
  int p = 1;
  while (p * 2 <= n) p *= 2;
  return p;
}

/// ceil(log2 n) for n >= 1.
constexpr int ceil_log2(int n) noexcept {
  int l = 0;
  while ((1 << l) < n) ++l;
  return l;
}

/// Reduce-scatter: the n input blocks lie in `src` at the partition's offsets; rank r ends with
/// the reduction of block r at result(). `work` is a buffer with the full layout where partial
/// sums may be kept (the output itself for all-reduce), or buf::none when the output holds only
/// this rank's block (then a policy keeps partials in scratch).
struct rs_problem {
  int rank = 0, size = 1;
  partition blocks;
  buf src = buf::in;
  buf work = buf::none;
  std::size_t elem_size = 1;
  bool commutative = true;
  /// Reducing two contributions at a time in the element type gives the bits the deterministic
  /// mode's fold gives (ops::stepwise_exact_v: the op accumulates in the element type and does
  /// not finalize), so algo::deterministic may reduce as it receives (algo/deterministic.hpp).
  /// Set for algo::deterministic only: other policies' schedules would be cached twice.
  bool stepwise_exact = false;

  region block(buf b, int i) const { return {b, blocks.offset(i), blocks.count(i)}; }
  region result() const {
    return work == buf::none ? region{buf::out, 0, blocks.count(rank)} : block(work, rank);
  }
};

/// All-gather into `out` (full layout). Rank r's block comes from in[0, count(r)) or, when
/// in_place, is already at out[offset(r)]. `base` rotates ranks: problem rank v is actual rank
/// (v + base) % size and owns block v (broadcast uses this to gather around its root).
struct ag_problem {
  int rank = 0, size = 1;
  partition blocks;
  bool in_place = false;
  int base = 0;
  std::size_t elem_size = 1;

  int actual(int v) const noexcept { return mod(v + base, size); }
  region block(int i) const { return {buf::out, blocks.offset(i), blocks.count(i)}; }
  /// Where this rank's own block can be read from the start: the input (not the copy a step
  /// makes of it into out, so a first send need not wait for that copy, nor read lines the
  /// copy has just dirtied), or out itself when in place.
  region own() const { return in_place ? block(rank) : region{buf::in, 0, blocks.count(rank)}; }
};

/// Broadcast of out[0, count) from root.
struct bcast_problem {
  int rank = 0, size = 1, root = 0;
  std::size_t count = 0, elem_size = 1;
};

/// Reduce of in[0, count) from every rank into out[0, count) at root.
struct reduce_problem {
  int rank = 0, size = 1, root = 0;
  std::size_t count = 0, elem_size = 1;
  bool commutative = true;
  bool stepwise_exact = false;  // (rs_problem's)
};

/// All-reduce of src[0, count) into out[0, count) (src is buf::out when in place).
struct ar_problem {
  int rank = 0, size = 1;
  std::size_t count = 0, elem_size = 1;
  bool commutative = true;
  buf src = buf::in;
  bool stepwise_exact = false;  // (rs_problem's)
};

/// Splits `count` elements into pieces of at most chunk_bytes (at least one piece, so that even an
/// empty buffer sends its messages and mismatches are still detected), and at most
/// tuning::max_pipeline_chunks pieces: a small chunk_bytes on a large buffer makes larger pieces
/// instead of a schedule with billions of steps (or a negative count of them).
inline partition chunks(std::size_t count, std::size_t elem_size, std::size_t chunk_bytes) {
  const std::size_t per = std::max<std::size_t>(1, chunk_bytes / std::max<std::size_t>(1, elem_size));
  const std::size_t c = std::max<std::size_t>(1, count / per + (count % per != 0));
  return {count, int(std::min<std::size_t>(c, tuning::max_pipeline_chunks))};
}

}  // namespace collx::algo
