#pragma once
// Every tuning number of collx, each named, with the measurement that chose it.
#include <cstddef>

namespace collx::algo::tuning {

/// Pipeline chunk of the ring's chain broadcast/reduce and of the double binary tree: the
/// message size at which a hop's latency (~1-5 us between threads or processes here) is small
/// against its transfer time (~20 us for 256 KiB at ~12 GB/s on one core), while the pipeline
/// still fills quickly (a 64 MiB chain over 8 ranks has 256 chunks for 7 hops).
inline constexpr std::size_t pipeline_chunk_bytes = std::size_t(256) << 10;

/// all_to_all with blocks of at most this many bytes runs every exchange in one step (see
/// algo/pairwise.hpp): a rank then serves whichever peer is ready instead of waiting for the
/// step's one partner to be scheduled. Medians of 5-9 alternating runs, time per call, one step
/// vs N-1 steps (`collx-perf --op all_to_all --algo automatic -b 8K -e 8M -f 4`, old vs new
/// binary): shm 4 processes on 2 cores 32 KiB total 9.5 vs 15.1 us, 512 KiB 88.7 vs 140.8,
/// 8 MiB 1685 vs 1682; threads -np 8: 32 KiB 18.6 vs 56.1, 2 MiB 635 vs 839, 8 MiB even;
/// tcp -np 4: 0.72-0.87x the time up to 512 KiB, even at 2-8 MiB. Beyond 1 MiB blocks the
/// copies are DRAM-bound either way, and N-1 steps bound the memory a step pins.
inline constexpr std::size_t a2a_one_step_bytes = std::size_t(1) << 20;

}  // namespace collx::algo::tuning
