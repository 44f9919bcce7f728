#pragma once
// Every tuning number of collx, each named, with the measurement that chose it.
#include <cstddef>

namespace collx::algo::tuning {

/// Pipeline chunk of the ring's chain broadcast/reduce and of the double binary tree: the
/// message size at which a hop's latency (~1-5 us between threads or processes here) is small
/// against its transfer time (~20 us for 256 KiB at ~12 GB/s on one core), while the pipeline
/// still fills quickly (a 64 MiB chain over 8 ranks has 256 chunks for 7 hops).
inline constexpr std::size_t pipeline_chunk_bytes = std::size_t(256) << 10;

/// algo::automatic, until the cost model (issue 5) replaces these: below this many bytes per
/// rank the log-step policies (recursive halving/doubling, binomial tree) win, above it the
/// bandwidth-optimal ring does. Measured on the thread transport, 8 ranks on 2 cores
/// (bench/collx-perf -b 8 -e 64M -f 4 -n 8 per policy): the ring passes recursive halving
/// between 64 KiB and 256 KiB.
inline constexpr std::size_t small_message_bytes = std::size_t(128) << 10;

}  // namespace collx::algo::tuning
