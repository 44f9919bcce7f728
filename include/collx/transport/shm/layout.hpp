#pragma once
// The shared-memory segment of a transport::shm job: what lies where, and how big it is.
//
//   header                       the job: size, configuration, who failed, attach counters
//   rank_ctl[n]                  per rank: doorbell, liveness, state, the signatures it sends under
//   area[n], one per rank r:     what rank r sends with
//     channel_ctl[n - 1]           a channel to every other rank (no channel to itself)
//     data slots[slots]            its pool of slot_bytes slots, for chunks larger than kSmallBytes
//     small buffers[kSmall]        its pool of kSmallBytes buffers, for chunks of kInline+1 .. kSmallBytes
//
// A channel is a ring of kLines cache lines: one per chunk, with the chunk's header, the
// number of the pool buffer that holds its data, or the data itself when it fits the line
// (kInline bytes). The sender owns its pools: it takes a free buffer for each chunk and gets it
// back once the receiver has consumed the chunk (the channel's `consumed` counter says so), so
// the slots of a rank serve whichever peers it is sending to and the segment grows by one pool
// per rank, not by one ring of slots per pair of ranks (docs/shm-footprint.md measures it).
//
//   footprint(n) = header + n * (rank_ctl + (n - 1) * channel_ctl + slots * slot_bytes + kSmall * kSmallBytes)
//
// every part rounded up to pages. The per-pair term, a channel's lines (kLines * 64 B plus its
// counters), is ~4 KiB.
#include <pthread.h>
#include <sched.h>

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "../../core/wait.hpp"
#include "../../core/call_info.hpp"
#include "config.hpp"

namespace collx::transport::shm_layout {

/// Lines per channel: how far a sender of chunks may run ahead of its receiver on one channel.
/// When ranks outnumber cores a receiver is often descheduled, and a deeper ring lets its sender
/// go on until it is: 4 processes on 2 cores, medians of 7 alternating runs, `collx-perf
/// --transport shm -np 4 --op broadcast -b 8 -e 2K -f 4 -n 1000`, 8 B broadcast 1.0 us per
/// call with 8 lines, 0.6 with 32 (Open MPI 0.4).
inline constexpr std::uint32_t kLines = 64;
static_assert((kLines & (kLines - 1)) == 0, "a power of two, so that p % kLines stays in step when the uint32 counters wrap");
/// Data slots one peer may hold of a sender's pool at once: as deep as a pipeline needs (a
/// chain's next chunk while this one is read) while the pool serves several peers.
inline constexpr std::uint32_t kPeerSlots = 8;
/// Bytes a line carries itself: a chunk this small costs one cache line transfer.
inline constexpr std::size_t kInline = 36;
/// Bytes a small buffer holds. Up to this size a sender may run ahead as far as its small
/// buffers and the channel's lines allow: 128 B broadcast 1.0 us per call in a data slot,
/// against the figure in docs/performance.md in a small buffer (4 processes on 2 cores).
inline constexpr std::size_t kSmallBytes = 1024;
/// Small buffers per rank.
inline constexpr std::uint32_t kSmall = 64;
/// Signatures a rank keeps of the calls it has sent under (for a receiver's mismatch report).
inline constexpr std::uint32_t kSigRing = 64;

/// slot_line::buf of a chunk carried in its line, of a single-copy announcement, and the first
/// small buffer (data slots are numbered from 0).
inline constexpr std::uint16_t kBufInline = 0xfffe, kBufRemote = 0xffff, kBufSmall = 0x8000;

inline constexpr std::uint64_t kMagic = 0x636f6c6c782d7334ull;  // "collx-s4"
inline constexpr std::uint32_t kLive = 1, kLeft = 2, kFailed = 3;
inline constexpr std::uint32_t kCreating = 0, kReady = 1, kReserveFailed = 2;

struct header {
  std::atomic<std::uint64_t> magic;  // set last by rank 0: the segment is ready to join
  std::uint64_t bytes;               // its size
  std::uint32_t n;
  std::uint32_t slots;
  std::uint64_t slot_bytes;
  std::atomic<std::uint32_t> status;    // kCreating, kReady, kReserveFailed (then `why` says why)
  std::atomic<std::uint32_t> attached;  // ranks attached (or that read the failure)
  std::atomic<std::uint32_t> unlinked_unused;  // (once: who unlinked the name; rank 0 does now)
  std::atomic<std::int32_t> first_failed;
  std::atomic<std::uint32_t> probed;      // ranks that have tried reading their peers' memory
  std::atomic<std::uint32_t> cma_failed;  // 1 if any rank could not
  // communicator shrink (shm.hpp: shrink): the epoch being decided and by whom
  // (epoch << 32 | rank + 1), and the last epoch decided (rank_ctl::shrink_in holds the verdict)
  std::atomic<std::uint64_t> shrink_lock;
  std::atomic<std::uint32_t> shrink_done;
  char why[1024];
};

struct alignas(64) rank_ctl {
  detail::waitable doorbell;
  alignas(64) pthread_mutex_t alive;  // held by the rank's liveness thread (liveness.hpp)
  std::atomic<std::uint32_t> state;
  std::int32_t pid;
  std::uint64_t base;  // where this rank mapped the segment: the single-copy probe reads it
  cpu_set_t cpus;      // the cores this rank may run on: the job's union decides whether to spin
  char why[512];
  std::uint32_t sig_count;  // signatures published so far (only the rank writes it)
  call_signature sigs[kSigRing];
  detail::position pos;  // where the rank is, for a peer's desync report (core/flight_record.hpp)
  std::atomic<std::uint32_t> shrink_joined;  // the last shrink epoch this rank joined
  std::atomic<std::uint32_t> shrink_in;      // the epoch of the last shrink that kept it (the decider writes it)
};

/// One cache line per chunk: the receiver polls `seq` and finds the header and, for chunks of
/// up to kInline bytes, the data in the same line. The sender fills the body in one burst of
/// stores from a copy it prepared, then `seq`, last: a receiver that polls the line while it is
/// being written takes it away from the writer, and every store after that brings it back, so
/// the fewer instructions between the first store and `seq`, the faster a small message
/// crosses (2 ranks, 8 B all_reduce: 0.35 us with a 112-byte copy between the header's stores
/// and `seq`, 0.29 with a few computed fields, the figure in docs/performance.md with one burst).
struct __attribute__((packed, aligned(4))) line_body {  // 60 bytes: seq takes the rest of the line
  std::uint32_t chunk;     // this chunk's bytes
  std::uint16_t sig_at;    // where the sender's signature is in its rank_ctl::sigs (mod kSigRing)
  std::uint16_t buf;       // the pool buffer holding the data, or kBufInline / kBufRemote
  std::uint64_t total;     // the message's bytes
  std::uint64_t sig_hash;  // hash of the sender's call_signature
  std::byte inline_data[kInline];
};
static_assert(sizeof(line_body) == 60);

struct alignas(64) slot_line {
  line_body body;
  std::atomic<std::uint32_t> seq;  // chunk number + 1 once the chunk is readable
};
static_assert(sizeof(slot_line) == 64);

struct alignas(64) channel_ctl {
  std::atomic<std::uint32_t> posted;   // chunks posted; only the sender touches it
  std::atomic<std::uint32_t> reading;  // 1 while the receiver reads the sender's buffer (single copy)
  alignas(64) std::atomic<std::uint32_t> consumed;  // chunks consumed; written by the receiver
  alignas(64) slot_line line[kLines];
};

constexpr std::size_t page_up(std::size_t x) { return (x + 4095) / 4096 * 4096; }

/// Where everything is in a segment of n ranks with configuration cfg (offsets computed once:
/// the exchange loop asks for them on every chunk).
struct layout {
  int n = 1;
  std::uint32_t slots = 1;
  std::size_t slot_bytes = 4096;

  layout() = default;
  layout(int ranks, const shm_config& cfg) : n(ranks), slots(cfg.slots), slot_bytes(cfg.slot_bytes) {
    areas_ = page_up(ranks_off() + sizeof(rank_ctl) * std::size_t(n));
    chans_ = page_up(sizeof(channel_ctl) * std::size_t(n - 1));
    data_ = page_up(std::size_t(slots) * slot_bytes);
    area_ = chans_ + data_ + small_bytes();
  }

  static constexpr std::size_t ranks_off() { return page_up(sizeof(header)); }
  std::size_t areas_off() const { return areas_; }
  std::size_t channels_bytes() const { return chans_; }
  std::size_t data_bytes() const { return data_; }
  static constexpr std::size_t small_bytes() { return page_up(std::size_t(kSmall) * kSmallBytes); }
  /// What each rank adds to the segment.
  std::size_t area_bytes() const { return area_; }
  std::size_t total_bytes() const { return areas_ + std::size_t(n) * area_; }

  std::size_t area_off(int r) const { return areas_ + std::size_t(r) * area_; }
  /// Index of peer `to` among the channels of rank `from` (there is none to itself).
  static std::size_t peer_index(int from, int to) { return std::size_t(to < from ? to : to - 1); }
  std::size_t channel_off(int from, int to) const { return area_off(from) + sizeof(channel_ctl) * peer_index(from, to); }
  std::size_t data_off(int r, std::uint32_t slot) const { return area_off(r) + chans_ + std::size_t(slot) * slot_bytes; }
  std::size_t small_off(int r, std::uint32_t i) const { return area_off(r) + chans_ + data_ + std::size_t(i) * kSmallBytes; }

 private:
  std::size_t areas_ = 0, chans_ = 0, data_ = 0, area_ = 0;
};

}  // namespace collx::transport::shm_layout
