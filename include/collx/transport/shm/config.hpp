#pragma once
// transport::shm's configuration: the segment's footprint (how many data slots each rank stages
// its sends in, and how large), the attach deadline, and when a message goes single copy.
#include <chrono>
#include <cstddef>
#include <cstdint>

#include "../../core/options.hpp"
#include "../../core/settings.hpp"

namespace collx::transport {

struct shm_config {
  /// Bytes per data slot (COLLX_SHM_SLOT_BYTES). Chunks of a message larger than a small buffer
  /// stream through slots of this size: large enough that the per-chunk handshake (~100 ns) is
  /// small against the copy (~5 us for 64 KiB), small enough that the slots in use stay in L2.
  std::size_t slot_bytes = std::size_t(detail::env_bytes("COLLX_SHM_SLOT_BYTES", kMinSlotBytes, kMaxSlotBytes, 64 << 10));
  /// Data slots per rank (COLLX_SHM_SLOTS): the sends a rank has in flight, to all its peers
  /// together, stage in its own pool of this many slots, and at most kPeerSlots of them go to
  /// one peer. The pool is what the segment grows by per rank (docs/shm-footprint.md), so a
  /// job's shared memory grows with its rank count, not with its square.
  std::uint32_t slots = std::uint32_t(detail::env_int("COLLX_SHM_SLOTS", 1, 4096, 16));
  /// How long to wait for every rank to attach.
  std::chrono::nanoseconds attach_timeout = detail::default_timeout();
  /// Single copy: a message of a collective that moves data without reducing it (all-gather,
  /// broadcast, all-to-all, gather, scatter) may be read by its receiver straight out of the
  /// sender's buffer with process_vm_readv (cross-memory attach) instead of through the
  /// channel: one copy instead of two, but done by the receiver's core alone, while the channel
  /// splits its two copies between the sender's core and the receiver's. So single copy pays
  /// when both cores are busy anyway (the sender receives in the same step: an exchange) or
  /// while source and destination stay in the reader's cache. Measured with 2 processes pinned
  /// one per core, `COLLX_SHM_SINGLE_COPY_BYTES=<1024|0> collx-perf --transport shm -np 2
  /// -b 8K -e 2M -f 2 --op <c> --algo automatic -n 1000 -c 0`, time single copy vs channel:
  /// - exchanges (all_gather, all_to_all; message = half the size): 8 KiB messages 1.9-2.2 vs
  ///   1.6-1.9 us, 16 KiB 3.0-3.2 vs 4.0-4.8, 64 KiB 6.3-7.0 vs 9.3-9.8, 128 KiB 10.6-11.0 vs
  ///   18.6-18.9, 1 MiB 98 vs 98: from 16 KiB on;
  /// - one way (broadcast, one message): 64 KiB 3.9-4.1 vs 4.1-4.2 us, 128 KiB 7.3-7.5 vs
  ///   8.1-10.6, 256 KiB 13.1-13.5 vs 16.0, 512 KiB 25.7 vs 32.3, 1 MiB 92 vs 66-72, 2 MiB
  ///   214-224 vs 152-156: from 128 KiB up to 512 KiB (the reader's 2 MiB L2 holds source and
  ///   destination; beyond, one core copying from DRAM loses to two cores pipelining).
  /// Reductions never go single copy: the receiver would copy and reduce alone where the
  /// channel overlaps the sender's copy with its reduction (all_reduce 16 MiB: 3.3 vs 5.6 GB/s).
  /// - ranks outnumber cores (4 processes on 2 cores, same command with -np 4; noisy, two runs
  ///   each): a sender waits for a receiver that may not be running. Exchanges win from 1 MiB
  ///   messages (all_gather 4 MiB 827-851 vs 1041-1133 us, all_to_all 828-902 vs 1160-1332)
  ///   and are even or lost in the noise below; one-way messages and the pipelined chain of a
  ///   large broadcast lose (4 MiB: 881-894 vs 702-704 us). So: exchanges above the pipeline
  ///   chunk (algo::tuning::pipeline_chunk_bytes), which keeps chains on the channel, and no
  ///   one-way single copy.
  std::size_t single_copy_bytes = std::size_t(16) << 10;
  std::size_t single_copy_crowded_bytes = std::size_t(512) << 10;
  /// - crowded, a step that sends to several peers at once (all_to_all in one step,
  ///   algo/pairwise.hpp): a receiver reads whichever sender's buffer it reaches first, so no
  ///   sender waits on one particular peer being scheduled. 4 processes on 2 cores, all_to_all
  ///   of 512 KiB (128 KiB blocks), medians of 9 alternating runs,
  ///   `COLLX_SHM_SINGLE_COPY_BYTES=<65536|unset> collx-perf --transport shm -np 4 --op all_to_all
  ///   -b 8K -e 8M -f 4 -n 100`: 79.7 vs 126.5 us (Open MPI in the same runs: 87.1); 2-8 MiB
  ///   even (DRAM-bound). With ranks pinned (launch_processes), 6 alternating runs, `-b 32K
  ///   -e 512K -f 2 -n 300` with COLLX_SHM_SINGLE_COPY_BYTES=16384 against the channel: 32 KiB
  ///   messages (128 KiB all_to_all) 22.6-23.7 vs 24.0-27.9 us (Open MPI 25.3-27.1); 16 KiB
  ///   messages 18.3-19.4 vs 13.7-16.7, a loss. From 32 KiB messages.
  std::size_t single_copy_crowded_fan_bytes = std::size_t(32) << 10;
  std::size_t single_copy_one_way_bytes = std::size_t(128) << 10;
  std::size_t single_copy_one_way_max_bytes = std::size_t(512) << 10;
  /// When set, every data-moving message of at least this many bytes goes single copy, and the
  /// rules above are ignored (tests; COLLX_SHM_SINGLE_COPY_BYTES=<b>). ~0: never single copy
  /// (COLLX_SHM_SINGLE_COPY_BYTES=0).
  std::size_t single_copy_forced_bytes = forced_from_env();

  /// Slots are at least a page and at most 64 MiB (a chunk's size travels in 32 bits).
  static constexpr std::size_t kMinSlotBytes = std::size_t(4) << 10;
  static constexpr std::size_t kMaxSlotBytes = std::size_t(64) << 20;

  static std::size_t forced_from_env() {
    const std::uint64_t v = detail::env_bytes("COLLX_SHM_SINGLE_COPY_BYTES", 0, std::uint64_t(1) << 62, 0);
    if (detail::env("COLLX_SHM_SINGLE_COPY_BYTES") == nullptr) return 0;
    return v == 0 ? ~std::size_t(0) : std::size_t(v);
  }
  /// Every data-moving message of at least `b` bytes goes single copy (tests use this).
  shm_config& single_copy_from(std::size_t b) noexcept {
    single_copy_forced_bytes = b;
    return *this;
  }
  bool single_copy_never() const noexcept { return single_copy_forced_bytes == ~std::size_t(0); }
  /// Whether a message of `bytes` goes single copy; `exchange`: the sender also receives in
  /// this step; `fan`: it sends to several peers in this step; `crowded`: the job's ranks
  /// outnumber its cores.
  bool single_copy_for(std::size_t bytes, bool exchange, bool fan, bool crowded) const noexcept {
    if (single_copy_forced_bytes != 0) return bytes >= single_copy_forced_bytes;
    if (exchange && crowded && fan) return bytes >= single_copy_crowded_fan_bytes;
    if (exchange) return bytes >= (crowded ? single_copy_crowded_bytes : single_copy_bytes);
    return !crowded && bytes >= single_copy_one_way_bytes && bytes <= single_copy_one_way_max_bytes;
  }
};

}  // namespace collx::transport
