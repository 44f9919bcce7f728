#pragma once
// The textbook formulas: each policy states, in its own file, how many steps its schedule takes
// and how many bytes it moves, as the literature writes them (ring all-reduce: 2(N-1) steps,
// 2(N-1)/N·D bytes sent per rank), as `static formula textbook(const textbook_case&)`.
// collx-explain prints them beside what it counts in the real schedules, and its tests check
// that the two agree; a policy without one is printed without a formula.
#include <algorithm>
#include <cstddef>
#include <string>

#include "collectives.hpp"
#include "problem.hpp"
#include "tuning.hpp"

namespace collx::algo {

/// A formula for the timeline length and for one byte count, and whose bytes it is.
struct formula {
  std::string steps_text;
  int steps = 0;
  std::string bytes_text;
  double bytes = 0;
  enum class who { each, one_rank, max, total } whom = who::each;
  int rank = 0;            // for one_rank
  bool received = false;   // the count is of bytes received, not sent
  bool pow2_only = false;  // the byte formula holds for N a power of two
  int segments = 1;        // the buffer's blocks are rounded once per segment
};

/// What a formula is of: a collective on n ranks of `bytes` (D: the largest buffer a rank
/// passes) in elements of `elem` bytes, and what the policies' formulas derive from it.
struct textbook_case {
  collective c;
  int n;
  std::size_t bytes;
  std::size_t elem;
  bool commutative = true;
  int root = 0;

  int lg() const { return ceil_log2(n); }
  int p() const { return floor_pow2(n); }
  int lgp() const { return ceil_log2(p()); }
  bool pow2() const { return n == p(); }
  /// D: the whole buffer of all_reduce, broadcast and reduce; the N blocks of k elements of the
  /// split collectives (reduce_scatter's input, all_gather's output, all_to_all's send buffer).
  double D() const {
    const bool split = c == collective::reduce_scatter || c == collective::all_gather || c == collective::all_to_all;
    return double(split ? bytes / elem / std::size_t(n) * std::size_t(n) * elem : bytes / elem * elem);
  }
  double share() const { return double(n - 1) / n * D(); }
  /// Recursive halving's steps per phase: log2 N, or log2 p + 2 with the folded ranks.
  std::string lgs() const { return pow2() ? "log2 N" : "log2 p + 2"; }
  int lgv() const { return pow2() ? lgp() : lgp() + 2; }
  /// The chain broadcast/reduce's pipeline chunks.
  int chain_chunks() const { return chunks(bytes / elem, elem, tuning::pipeline_chunk_bytes).parts; }
  /// A composed all_reduce (reduce-scatter then all-gather, algo/compose.hpp) of a large buffer
  /// runs in segments, one after another: the textbook's steps, once per segment.
  formula per_segment(formula f) const {
    const std::size_t seg = tuning::all_reduce_segment(bytes / elem, elem);
    const int segments = int((bytes / elem + seg - 1) / std::max<std::size_t>(seg, 1));
    if (c != collective::all_reduce || segments <= 1) return f;
    f.steps_text = std::to_string(segments) + " segments of " + std::to_string((seg * elem) >> 10) + " KiB x " +
                   (f.steps_text.find(' ') == std::string::npos && f.steps_text.front() != '(' ? f.steps_text : "(" + f.steps_text + ")");
    f.steps *= segments;
    f.segments = segments;
    return f;
  }
};

}  // namespace collx::algo
