#pragma once
// all_reduce composed from a policy's reduce_scatter and all_gather: literally the one, then the
// other, over the same blocks. The collective runs it (collectives/all_reduce.hpp) and the model
// analyses it (algo/model.hpp) from this one builder.
//
// A large buffer goes in segments (tuning::all_reduce_segment): each segment's reduce-scatter,
// then its all-gather, so the all-gather reads blocks that are still in cache.
#include <algorithm>
#include <cstddef>

#include "../core/partition.hpp"
#include "../core/schedule.hpp"
#include "problem.hpp"
#include "tuning.hpp"

namespace collx::algo {

/// Where a segment's parts sit on the common timeline, relative to the segment's start: the
/// all-gather at `ag`, the next segment at `next`.
struct segment_times {
  int ag = 0, next = 0;
};

/// Rank p.rank's composed all_reduce. `times(len, rs, ag)` places a segment of len elements,
/// whose parts on this rank are rs and ag, on the timeline: the model passes the longest
/// reduce-scatter and all-gather of all ranks; the executor, which ignores times, this rank's.
template <class A, class Times>
schedule composed_all_reduce(const A& a, const ar_problem& p, Times&& times) {
  const std::size_t seg = tuning::all_reduce_segment(p.count, p.elem_size);
  schedule s, rs, ag;
  segment_times at;
  std::size_t built = 0;  // the segment length rs, ag and at were built for (segments but the last are alike)
  int t = 0;
  std::size_t off = 0;
  do {  // at least once: count 0 is one empty segment
    const std::size_t len = std::min(seg, p.count - off);
    if (off == 0 || len != built) {
      const partition blocks(len, p.size);
      rs = a.reduce_scatter(rs_problem{p.rank, p.size, blocks, p.src, buf::out, p.elem_size, p.commutative, p.stepwise_exact});
      ag = a.all_gather(ag_problem{p.rank, p.size, blocks, true, 0, p.elem_size});
      at = times(len, rs, ag);
      built = len;
    }
    s.append(rs, t, off);
    s.append(ag, t + at.ag, off);
    t += at.next;
    off += len;
  } while (off < p.count);
  s.finalize({buf::out, 0, p.count});  // avg divides once, after the last segment
  return s;
}

/// One segment of `p.count` elements on its own (no avg division): what the collective runs
/// per segment, on that segment's part of the buffer.
template <class A>
schedule composed_segment(const A& a, const ar_problem& p) {
  const partition blocks(p.count, p.size);
  schedule s = a.reduce_scatter(rs_problem{p.rank, p.size, blocks, p.src, buf::out, p.elem_size, p.commutative, p.stepwise_exact});
  s.append(a.all_gather(ag_problem{p.rank, p.size, blocks, true, 0, p.elem_size}), s.span());
  return s;
}

/// The same, each segment placed by this rank's own spans.
template <class A>
schedule composed_all_reduce(const A& a, const ar_problem& p) {
  return composed_all_reduce(a, p, [](std::size_t, const schedule& rs, const schedule& ag) {
    return segment_times{rs.span(), rs.span() + ag.span()};
  });
}

}  // namespace collx::algo
