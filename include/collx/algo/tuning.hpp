#pragma once
// Every tuning number of collx, each named, with the measurement that chose it.
#include <cstddef>

namespace collx::algo::tuning {

/// Pipeline chunk of the ring's chain broadcast/reduce and of the double binary tree: the
/// message size at which a hop's latency (~1-5 us between threads or processes here) is small
/// against its transfer time (~20 us for 256 KiB at ~12 GB/s on one core), while the pipeline
/// still fills quickly (a 64 MiB chain over 8 ranks has 256 chunks for 7 hops).
inline constexpr std::size_t pipeline_chunk_bytes = std::size_t(256) << 10;

/// The most chunks a pipelined schedule (chain, double binary tree) cuts a buffer into: a
/// chunk_bytes too small for the buffer gets larger chunks instead. 65536 chunks of the default
/// 256 KiB are 16 GiB; a schedule of that many steps is ~10 MB, built in ~10 ms.
inline constexpr std::size_t max_pipeline_chunks = std::size_t(1) << 16;

/// all_to_all (and pairwise all_gather) with blocks of at most this many bytes runs every
/// exchange in one step (see algo/pairwise.hpp): a rank then serves whichever peer is ready
/// instead of waiting for the step's one partner to be scheduled. Medians of 5-9 alternating
/// runs, time per call, one step vs N-1 steps (`collx-perf --op all_to_all --algo automatic -b 8K
/// -e 8M -f 4`, old vs new binary): shm 4 processes on 2 cores 32 KiB total 9.5 vs 15.1 us,
/// 512 KiB 88.7 vs 140.8; threads -np 8: 32 KiB 18.6 vs 56.1, 2 MiB 635 vs 839; tcp -np 4:
/// 0.72-0.87x the time up to 512 KiB. Larger blocks (4 alternating runs, ranks pinned, `-b 2M
/// -e 128M -f 4`, Open MPI in the same runs): shm -np 4 all_to_all 8 MiB 1517-1598 vs
/// 1660-1743 us (Open MPI 1551-1641), 32 MiB 11.9-13.3 vs 12.5-13.7 ms, 128 MiB even;
/// all_gather 32 MiB 9.0-10.0 vs 11.2-12.0 ms (Open MPI 10.0-11.6); threads -np 8 and tcp
/// -np 4 at 8-128 MiB even within the noise. So one step up to 32 MiB blocks, the largest
/// measured.
inline constexpr std::size_t a2a_one_step_bytes = std::size_t(32) << 20;

/// algo::deterministic's all_reduce gathers every rank's whole input and folds it on every rank
/// (ceil(log2 N) steps, recursive doubling's messages) while the N inputs together are at most
/// this many bytes; above, its reduce-scatter by direct exchange and an all-gather. Both fold
/// the same contributions in rank order, so the bits do not change where it switches. 8 B of
/// float, COLLX_DETERMINISTIC=1 against the default (automatic: recursive doubling), medians of
/// 5 alternating runs (docs/precision.md): the reduce-scatter + all-gather took 1.4-3.5x the
/// default's time (shm -np 8, tcp -np 8).
inline constexpr std::size_t deterministic_gather_bytes = std::size_t(64) << 10;

/// all_reduce composed as reduce-scatter + all-gather runs the pair per segment of this many
/// bytes once the buffer reaches all_reduce_segment_from_bytes: the all-gather then reads blocks
/// the reduce-scatter has just written, still in cache, instead of a whole reduced buffer that
/// has gone back to DRAM. shm, float sum, busbw, unsegmented vs 1 MiB segments, 3 alternating
/// runs (`collx-perf --transport shm -np N --op all_reduce --algo ring -b 32M -e 128M -f 4`):
/// -np 2 32 MiB 2.9-3.3 vs 3.8-4.0 GB/s, 128 MiB 3.1-3.2 vs 3.6-3.9; -np 4 32 MiB 1.3-1.4 vs
/// 1.6, 128 MiB 1.3 vs 1.6 (the double binary tree, pipelined in 256 KiB chunks: 1.6). At 2 and
/// 8 MiB the buffer still fits the cache and segments change nothing beyond the noise (-np 2
/// 8 MiB 1.37-1.54 vs 1.41-1.64 ms): hence segments only from 16 MiB.
inline constexpr std::size_t all_reduce_segment_bytes = std::size_t(1) << 20;
inline constexpr std::size_t all_reduce_segment_from_bytes = std::size_t(16) << 20;

/// The segment, in elements, of a composed all_reduce of `count` elements of `elem` bytes
/// (count itself: one segment).
constexpr std::size_t all_reduce_segment(std::size_t count, std::size_t elem) {
  if (elem == 0 || count * elem < all_reduce_segment_from_bytes) return count;
  return all_reduce_segment_bytes / elem > 0 ? all_reduce_segment_bytes / elem : 1;
}

}  // namespace collx::algo::tuning
