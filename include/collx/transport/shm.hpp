#pragma once
// transport::shm — ranks are processes on one host, talking through POSIX shared memory.
//
// One segment per job, named /collx-<job> (mode 0600), holds a control block per rank and a
// channel per ordered pair of ranks. A channel is a ring of kLines cache lines (a chunk's header,
// and its data when it fits in the line), each with a small buffer of kSmallBytes for a chunk
// that does not, and a ring of kSlots data slots of slot_bytes each for larger chunks: the
// sender copies a message in, chunk by chunk, the receiver copies or reduces each chunk straight
// out of the slot into its destination, so a large message streams through a few hundred KiB
// that stay in cache, and the two copies cost little more memory traffic than one.
//
// Progress. A step's sends and receives advance together: the exchange loop moves every chunk it
// can (a send needs a free slot, a receive a filled one) and only when nothing can move does the
// rank wait, on its own doorbell: a futex word in shared memory that every peer bumps when it
// fills or frees a slot of a channel to or from this rank. The futex is the process-shared kind
// (no FUTEX_PRIVATE_FLAG). Waiting spins briefly, then yields, then sleeps (detail/wait.hpp).
//
// Liveness. Each rank holds a robust, process-shared mutex for as long as it is attached. When a
// rank dies (SIGKILL included) the kernel releases it and the next peer that tries it gets
// EOWNERDEAD: waiting ranks try their peers' mutexes between sleeps, so a dead peer is reported
// as errc::peer_lost within one sleep slice, not after the timeout.
//
// Cleanup. The segment's name is unlinked as soon as every rank has attached; from then on it
// exists only as the ranks' mappings, which the kernel drops when the last one exits, however it
// exits. Nothing of a job is left in /dev/shm after it, a crash included.
#include <fcntl.h>
#include <sys/uio.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <chrono>
#include <cstring>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "../communicator.hpp"
#include "../concepts.hpp"
#include "../detail/wait.hpp"
#include "../environment.hpp"
#include "../error.hpp"
#include "../signature.hpp"

namespace collx::transport {

struct shm_config {
  /// Bytes per slot. 8 slots of 64 KiB keep a channel's 512 KiB in L2/L3 while chunks are
  /// large enough that the per-chunk handshake (~100 ns) is small against the copy (~5 us).
  std::size_t slot_bytes = std::size_t(64) << 10;
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

  static std::size_t forced_from_env() {
    if (const char* e = std::getenv("COLLX_SHM_SINGLE_COPY_BYTES"); e != nullptr && *e != 0) {
      const unsigned long long v = std::strtoull(e, nullptr, 10);
      return v == 0 ? ~std::size_t(0) : std::size_t(v);
    }
    return 0;
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

class shm {
 public:
  using transport_concept = transport_tag;
  using memory_space = host_memory;
  static constexpr const char* name = "shm";

  /// Data slots per channel: how far a sender of chunks larger than a line may run ahead of its
  /// receiver.
  static constexpr std::uint32_t kSlots = 8;
  /// Lines per channel: how far a sender of chunks of up to kSmallBytes (or a single-copy
  /// announcement) may run ahead. When ranks outnumber cores a receiver is often
  /// descheduled, and a deeper ring lets its sender go on until it is: 4 processes on 2 cores,
  /// medians of 7 alternating runs, `collx-perf --transport shm -np 4 --op broadcast -b 8
  /// -e 2K -f 4 -n 1000`, 8 B broadcast 1.0 us per call with 8 lines, 0.6 with 32 (Open MPI 0.4).
  static constexpr std::uint32_t kLines = 64;
  static_assert(kLines % kSlots == 0, "a chunk's data slot is its line number mod kSlots");
  static_assert((kLines & (kLines - 1)) == 0 && (kSlots & (kSlots - 1)) == 0,
                "powers of two, so that p % kLines and p % kSlots stay in step when the uint32 counters wrap");
  /// Bytes a line's own buffer holds. Up to this size a sender may run kLines ahead (above):
  /// the same command, 128 B broadcast 1.0 us per call in a data slot, against the figure in
  /// docs/performance.md in the line's buffer.
  static constexpr std::size_t kSmallBytes = 1024;

  using config = shm_config;

  shm(std::string job, int rank, int size, config cfg = {}) : rank_(rank), n_(size), cfg_(cfg) {
    if (size < 1 || rank < 0 || rank >= size)
      throw error(errc::invalid_argument, "shm: rank " + std::to_string(rank) + " is out of range for " +
                                              std::to_string(size) + " ranks");
    if (cfg_.slot_bytes < 64 || cfg_.slot_bytes % 64 != 0)
      throw error(errc::invalid_argument, "shm: slot_bytes must be a positive multiple of 64");
    name_ = segment_name(job);
    attach();
  }

  /// Rank, size and job from the launcher's environment (environment.hpp).
  static shm from_env(config cfg = {}) {
    const launch_info li = launch_info_from_env();
    return shm(li.job, li.rank, li.size, cfg);
  }

  /// "/collx-<job>" with anything but [A-Za-z0-9._-] replaced.
  static std::string segment_name(const std::string& job) {
    std::string s = "/collx-";
    for (char c : job.substr(0, 200)) s += (std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_') ? c : '_';
    return s;
  }

  shm(shm&& o) noexcept { *this = std::move(o); }
  shm& operator=(shm&& o) noexcept {
    if (this != &o) {
      release();
      rank_ = o.rank_; n_ = o.n_; cfg_ = o.cfg_; name_ = std::move(o.name_);
      base_ = o.base_; bytes_ = o.bytes_; left_ = o.left_; cma_ = o.cma_; spin_ = o.spin_;
      o.base_ = nullptr; o.bytes_ = 0; o.left_ = true;
    }
    return *this;
  }
  shm(const shm&) = delete;
  shm& operator=(const shm&) = delete;
  ~shm() { release(); }

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return n_; }
  const std::string& segment() const noexcept { return name_; }
  /// Whether single-copy receives (process_vm_readv) work between every pair of ranks here.
  bool single_copy() const noexcept { return cma_; }

  void exchange(std::span<const send_desc> sends, std::span<const recv_desc> recvs, const exchange_context& ctx) {
    const call_info& call = *ctx.call;
    const std::size_t elem = std::max<std::size_t>(1, ctx.comb.elem_size);
    const std::size_t chunk = cfg_.slot_bytes / elem * elem;
    if (chunk == 0)
      call.fail(errc::invalid_argument, "an element of " + std::to_string(elem) + " B does not fit a " +
                                            std::to_string(cfg_.slot_bytes) + " B shared-memory slot");
    std::vector<op_state>& ss = send_state_;
    std::vector<op_state>& rs = recv_state_;
    ss.assign(sends.size(), {});
    rs.assign(recvs.size(), {});
    std::size_t pending = sends.size() + recvs.size();
    const std::uint64_t my_hash = signature_hash(call.sig);
    // Single copy only for collectives that move data without reducing it: a receiver that
    // reduces would do the kernel's copy and the reduction alone, while through the channel the
    // sender's copy and the receiver's reduction overlap (see single_copy_bytes).
    const bool single_copy = cma_ && ctx.comb.fn == nullptr;

    // Messages to or from one peer go in order (may_progress, concepts.hpp).
    auto first_to = [](auto ops, const auto& st, std::size_t i) { return may_progress(ops, st, i); };
    auto advance = [&]() -> bool {
      bool moved = false;
      for (std::size_t i = 0; i < sends.size(); ++i) {
        op_state& st = ss[i];
        const send_desc& d = sends[i];
        channel_ctl& c = ctl(rank_, d.peer);
        if (st.done) continue;
        if (st.awaiting_ack) {  // single copy: done when the receiver has read it
          if (std::int32_t(c.consumed.load(std::memory_order_acquire) - st.ack_at) >= 0) {
            st.done = true;
            --pending;
            moved = true;
          }
          continue;
        }
        if (!st.done && single_copy && cfg_.single_copy_for(d.bytes, !recvs.empty(), sends.size() > 1, spin_ < detail::kSpinIterations) && first_to(sends, ss, i)) {
          const std::uint32_t posted = c.posted.load(std::memory_order_relaxed);
          if (!has_room(c, posted, false)) continue;
          const std::uint32_t k = posted % kLines;
          slot_line& l = c.line[k];
          l.total = d.bytes;
          l.chunk = kRemote;
          l.sig_hash = my_hash;
          c.sig[k] = call.sig;
          const std::uint64_t addr = reinterpret_cast<std::uintptr_t>(d.data);
          std::memcpy(l.inline_data, &addr, sizeof addr);
          l.seq.store(posted + 1, std::memory_order_release);
          c.posted.store(posted + 1, std::memory_order_relaxed);
          ring(d.peer);
          st.ack_at = posted + 1;
          st.awaiting_ack = true;
          st.started = moved = true;
          continue;
        }
        while (!st.done && first_to(sends, ss, i)) {
          const std::uint32_t posted = c.posted.load(std::memory_order_relaxed);
          const std::size_t nb = std::min(chunk, d.bytes - st.off);
          if (!has_room(c, posted, needs_slot(nb))) break;
          const std::uint32_t k = posted % kLines;
          slot_line& l = c.line[k];
          l.total = d.bytes;
          l.chunk = std::uint32_t(nb);
          l.sig_hash = my_hash;
          c.sig[k] = call.sig;  // read by the receiver only to report a mismatch
          if (nb != 0) std::memcpy(chunk_data(rank_, d.peer, posted, nb), d.data + st.off, nb);
          l.seq.store(posted + 1, std::memory_order_release);
          c.posted.store(posted + 1, std::memory_order_relaxed);
          ring(d.peer);
          st.off += nb;
          st.started = moved = true;
          if (st.off == d.bytes) { st.done = true; --pending; }
        }
      }
      for (std::size_t i = 0; i < recvs.size(); ++i) {
        op_state& st = rs[i];
        const recv_desc& d = recvs[i];
        channel_ctl& c = ctl(d.peer, rank_);
        while (!st.done && first_to(recvs, rs, i)) {
          const std::uint32_t consumed = c.consumed.load(std::memory_order_relaxed);
          const std::uint32_t k = consumed % kLines;
          const slot_line& l = c.line[k];
          if (l.seq.load(std::memory_order_acquire) != consumed + 1) break;
          if (!st.started && (l.sig_hash != my_hash || l.total != d.bytes))
            call.check_match(d.peer, c.sig[k], std::size_t(l.total), d.bytes);
          if (l.chunk == kRemote) {  // single copy: read the whole message from the sender
            std::uint64_t addr = 0;
            std::memcpy(&addr, l.inline_data, sizeof addr);
            // `reading` tells a sender that fails now to wait before it unwinds (and perhaps
            // frees the buffer); a sender that has already failed is not read at all.
            c.reading.store(1, std::memory_order_seq_cst);
            if (rc(d.peer).state.load(std::memory_order_seq_cst) == kFailed) {
              c.reading.store(0, std::memory_order_seq_cst);
              report_gone(d.peer, call);
            }
            try {
              read_remote(d, addr, call, ctx.comb, elem);
            } catch (...) {
              c.reading.store(0, std::memory_order_seq_cst);
              throw;
            }
            c.reading.store(0, std::memory_order_seq_cst);
            c.consumed.store(consumed + 1, std::memory_order_release);
            ring(d.peer);
            st.off = d.bytes;
            st.started = moved = st.done = true;
            --pending;
            break;
          }
          const std::size_t nb = std::size_t(l.chunk);
          if (nb > d.bytes - st.off || nb % elem != 0 || (nb == 0 && d.bytes != 0))
            call.fail(errc::mismatch, "got a chunk of " + std::to_string(nb) + " B from rank " + std::to_string(d.peer) +
                                          " where " + std::to_string(d.bytes - st.off) + " B remained");
          const std::byte* src = chunk_data(d.peer, rank_, consumed, nb);
          if (nb != 0) {
            if (d.how == combine::copy) std::memcpy(d.dst + st.off, src, nb);
            else if (d.how == combine::received_left) ctx.comb(d.dst + st.off, src, d.with + st.off, nb / elem);
            else ctx.comb(d.dst + st.off, d.with + st.off, src, nb / elem);
          }
          c.consumed.store(consumed + 1, std::memory_order_release);
          ring(d.peer);
          st.off += nb;
          st.started = moved = true;
          if (st.off == d.bytes) { st.done = true; --pending; }
        }
      }
      return moved;
    };
    // Can anything move now? (cheap: no copying)
    auto ready = [&] {
      for (std::size_t i = 0; i < sends.size(); ++i) {
        if (ss[i].done || !first_to(sends, ss, i)) continue;
        channel_ctl& c = ctl(rank_, sends[i].peer);
        if (ss[i].awaiting_ack) {
          if (std::int32_t(c.consumed.load(std::memory_order_acquire) - ss[i].ack_at) >= 0) return true;
          continue;
        }
        // (a single-copy send needs only a line: asking for a slot is conservative)
        if (has_room(c, c.posted.load(std::memory_order_relaxed), needs_slot(std::min(chunk, sends[i].bytes - ss[i].off))))
          return true;
      }
      for (std::size_t i = 0; i < recvs.size(); ++i) {
        if (rs[i].done || !first_to(recvs, rs, i)) continue;
        const channel_ctl& c = ctl(recvs[i].peer, rank_);
        const std::uint32_t consumed = c.consumed.load(std::memory_order_relaxed);
        if (c.line[consumed % kLines].seq.load(std::memory_order_acquire) == consumed + 1) return true;
      }
      return false;
    };
    auto first_pending_peer = [&] {
      for (std::size_t i = 0; i < recvs.size(); ++i)
        if (!rs[i].done) return recvs[i].peer;
      for (std::size_t i = 0; i < sends.size(); ++i)
        if (!ss[i].done) return sends[i].peer;
      return -1;
    };
    auto check = [&] {
      // A peer that failed, died or left ends the wait, unless what it did before leaves us
      // something to do (its last chunks are still in the channel).
      auto gone = [&](int p) { return peer_gone(p, call); };
      bool any_gone = failed_elsewhere(call);
      for (std::size_t i = 0; i < sends.size() && !any_gone; ++i) any_gone = !ss[i].done && gone(sends[i].peer);
      for (std::size_t i = 0; i < recvs.size() && !any_gone; ++i) any_gone = !rs[i].done && gone(recvs[i].peer);
      if (!any_gone || ready()) return;
      for (std::size_t i = 0; i < recvs.size(); ++i)
        if (!rs[i].done && gone(recvs[i].peer)) report_gone(recvs[i].peer, call);
      for (std::size_t i = 0; i < sends.size(); ++i)
        if (!ss[i].done && gone(sends[i].peer)) report_gone(sends[i].peer, call);
      report_failed_elsewhere(call);
    };
    // A single-copy send is acknowledged when its receiver has read it, which takes as long as
    // the copy (~25 us for 512 KiB): longer than a waiter spins, and a futex sleep would add a
    // wake-up (~28 us here) to every such message. So while such an acknowledgement is due, a
    // sender whose ranks fit the cores keeps spinning: for kAckSpin, and on for as long as
    // the receiver is reading (its `reading` flag), up to kBusyReadSpin; then it sleeps.
    auto awaiting_read = [&](bool& reading) {
      bool any = false;
      for (std::size_t i = 0; i < sends.size(); ++i)
        if (ss[i].awaiting_ack && !ss[i].done) {
          any = true;
          reading = reading || ctl(rank_, sends[i].peer).reading.load(std::memory_order_relaxed) != 0;
        }
      return any;
    };
    std::chrono::steady_clock::time_point busy_since{};
    while (pending != 0) {
      if (advance()) continue;
      bool reading = false;
      if (spin_ >= detail::kSpinIterations && awaiting_read(reading)) {
        const auto now = std::chrono::steady_clock::now();
        if (busy_since == std::chrono::steady_clock::time_point{}) busy_since = now;
        if (now - busy_since < (reading ? kBusyReadSpin : kAckSpin)) {
          for (int k = 0; k < 64 && !ready(); ++k) detail::cpu_relax();
          continue;
        }
      }
      if (detail::wait_on(me().doorbell, ready, check, call.timeout, true, spin_) == detail::wait_result::timed_out)
        call.timed_out(first_pending_peer(), "its data, or room in its channel");
    }
  }

  /// Marks this rank failed (peers then fail fast with errc::peer_lost) and wakes everyone.
  void abort(const std::string& why) noexcept {
    if (base_ == nullptr || left_) return;
    rank_ctl& m = me();
    std::snprintf(m.why, sizeof m.why, "%s", why.c_str());
    m.state.store(kFailed, std::memory_order_seq_cst);
    std::int32_t none = -1;
    hdr().first_failed.compare_exchange_strong(none, rank_);
    for (int q = 0; q < n_; ++q) rc(q).doorbell.wake(true);
    // A peer in the middle of reading this rank's buffer finishes before the buffer can go.
    for (int q = 0; q < n_; ++q)
      while (ctl(rank_, q).reading.load(std::memory_order_seq_cst) != 0) detail::cpu_relax();
  }

  /// Leaves the job normally: peers still waiting for this rank are told it left.
  void leave() noexcept {
    if (base_ == nullptr || left_) return;
    rank_ctl& m = me();
    std::uint32_t live = kLive;
    m.state.compare_exchange_strong(live, kLeft);
    pthread_mutex_unlock(&m.alive);
    left_ = true;
    for (int q = 0; q < n_; ++q) rc(q).doorbell.wake(true);
  }

 private:
  struct op_state {
    std::size_t off = 0;
    bool started = false, done = false;
    bool awaiting_ack = false;  // single copy: announced, waiting for the receiver to read it
    std::uint32_t ack_at = 0;   // the `consumed` count that acknowledges it (any value: counters wrap)
  };
  static constexpr std::uint64_t kMagic = 0x636f6c6c782d7368ull;  // "collx-sh"
  static constexpr std::uint32_t kLive = 1, kLeft = 2, kFailed = 3;

  struct header {
    std::atomic<std::uint64_t> magic;
    std::uint32_t n;
    std::uint32_t slots;
    std::uint64_t slot_bytes;
    std::atomic<std::uint32_t> attached;
    std::atomic<std::uint32_t> unlinked;
    std::atomic<std::int32_t> first_failed;
    std::atomic<std::uint32_t> probed;       // ranks that have tried reading their peers' memory
    std::atomic<std::uint32_t> cma_failed;   // 1 if any rank could not
  };
  struct alignas(64) rank_ctl {
    detail::waitable doorbell;
    alignas(64) pthread_mutex_t alive;
    std::atomic<std::uint32_t> state;
    std::int32_t pid;
    std::uint64_t base;  // where this rank mapped the segment: the single-copy probe reads it
    cpu_set_t cpus;      // the cores this rank may run on: the job's union decides whether to spin
    char why[512];
  };
  /// One cache line per slot: the receiver polls `seq` and finds the header and, for messages
  /// of up to 40 bytes, the data in the same line, so a small message costs one line transfer.
  struct alignas(64) slot_line {
    std::atomic<std::uint32_t> seq;  // chunk number + 1 once the chunk is readable
    std::uint32_t chunk;             // this chunk's bytes
    std::uint64_t total;             // the message's bytes
    std::uint64_t sig_hash;          // hash of the sender's call_signature
    std::byte inline_data[40];
  };
  struct alignas(64) channel_ctl {
    std::atomic<std::uint32_t> posted;  // chunks posted; only the sender touches it
    std::uint32_t consumed_seen;        // the sender's last view of `consumed`
    std::atomic<std::uint32_t> reading; // 1 while the receiver reads the sender's buffer (single copy)
    alignas(64) std::atomic<std::uint32_t> consumed;  // chunks consumed; written by the receiver
    alignas(64) slot_line line[kLines];
    call_signature sig[kLines];  // the sender's full signature, for mismatch messages
    alignas(64) std::byte small[kLines][kSmallBytes];  // chunks of 41 .. kSmallBytes bytes
  };

  /// Room for one more chunk? One that needs a data slot (more than a line holds) may be at most
  /// kSlots ahead of the receiver, one that fits in its line kLines: chunk p uses line p % kLines
  /// and data slot p % kSlots, and with kSlots dividing kLines both were freed once `consumed`
  /// passed p - kSlots (resp. p - kLines). The sender re-reads the receiver's `consumed` (a line
  /// the receiver owns) only when its cached view says the ring is full.
  static bool has_room(channel_ctl& c, std::uint32_t posted, bool needs_slot) {
    const std::uint32_t depth = needs_slot ? kSlots : kLines;
    if (posted - c.consumed_seen < depth) return true;
    c.consumed_seen = c.consumed.load(std::memory_order_acquire);
    return posted - c.consumed_seen < depth;
  }
  static bool needs_slot(std::size_t chunk_bytes) { return chunk_bytes > kSmallBytes; }
  /// Where chunk number `p` of `nb` bytes lies in channel from -> to.
  std::byte* chunk_data(int from, int to, std::uint32_t p, std::size_t nb) const {
    channel_ctl& c = ctl(from, to);
    slot_line& l = c.line[p % kLines];
    if (nb <= sizeof l.inline_data) return l.inline_data;
    if (nb <= kSmallBytes) return c.small[p % kLines];
    return slot(from, to, p % kSlots);
  }

  static std::uint64_t signature_hash(const call_signature& g) {
    std::uint64_t h = detail::fnv1a(std::string_view(g.collective, strnlen(g.collective, sizeof g.collective)));
    h = (h ^ detail::fnv1a(std::string_view(g.policy, strnlen(g.policy, sizeof g.policy)))) * 1099511628211ull;
    for (std::uint64_t x : {g.seq, g.empty_calls, g.count, g.op_hash, std::uint64_t(g.elem_size), std::uint64_t(std::uint32_t(g.root))})
      h = (h ^ x) * 1099511628211ull;
    return h;
  }

  static constexpr std::size_t align_up(std::size_t x) { return (x + 4095) / 4096 * 4096; }
  std::size_t ranks_off() const { return align_up(sizeof(header)); }
  std::size_t chans_off() const { return align_up(ranks_off() + sizeof(rank_ctl) * std::size_t(n_)); }
  std::size_t data_off() const { return align_up(chans_off() + sizeof(channel_ctl) * std::size_t(n_) * std::size_t(n_)); }
  std::size_t total_bytes() const {
    return data_off() + std::size_t(n_) * std::size_t(n_) * kSlots * cfg_.slot_bytes;
  }

  header& hdr() const { return *reinterpret_cast<header*>(base_); }
  rank_ctl& rc(int r) const { return reinterpret_cast<rank_ctl*>(base_ + ranks_off())[r]; }
  rank_ctl& me() const { return rc(rank_); }
  channel_ctl& ctl(int from, int to) const {
    return reinterpret_cast<channel_ctl*>(base_ + chans_off())[std::size_t(from) * std::size_t(n_) + std::size_t(to)];
  }
  std::byte* slot(int from, int to, std::uint32_t k) const {
    return base_ + data_off() + ((std::size_t(from) * std::size_t(n_) + std::size_t(to)) * kSlots + k) * cfg_.slot_bytes;
  }

  void ring(int peer) noexcept {
    detail::waitable& d = rc(peer).doorbell;
    d.word.fetch_add(1, std::memory_order_seq_cst);
    if (d.sleepers.load(std::memory_order_seq_cst) != 0) detail::futex_wake_all(d.word, true);
  }

  [[noreturn]] void sys_fail(const std::string& what) const {
    throw error(errc::transport_error, "shm " + name_ + ": rank " + std::to_string(rank_) + ": " + what + ": " +
                                           std::strerror(errno));
  }

  void attach() {
    const auto deadline = std::chrono::steady_clock::now() + cfg_.attach_timeout;
    const std::size_t bytes = total_bytes();
    int fd = -1;
    if (rank_ == 0) {
      shm_unlink(name_.c_str());  // a stale segment of a crashed job with the same name
      fd = shm_open(name_.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
      if (fd < 0) sys_fail("cannot create the segment");
      if (ftruncate(fd, off_t(bytes)) != 0) {
        close(fd);
        shm_unlink(name_.c_str());
        sys_fail("cannot size the segment");
      }
    } else {
      for (;;) {  // wait for rank 0 to create it
        fd = shm_open(name_.c_str(), O_RDWR, 0600);
        if (fd >= 0) {
          struct stat st {};
          if (fstat(fd, &st) == 0 && std::size_t(st.st_size) == bytes) break;
          close(fd);
          fd = -1;
        }
        if (std::chrono::steady_clock::now() > deadline)
          throw error(errc::timeout, "shm " + name_ + ": rank " + std::to_string(rank_) +
                                         " timed out waiting for rank 0 to create the job's segment");
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    }
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) sys_fail("cannot map the segment");
    base_ = static_cast<std::byte*>(p);
    bytes_ = bytes;
    if (rank_ == 0) {
      header& h = hdr();
      h.n = std::uint32_t(n_);
      h.slots = kSlots;
      h.slot_bytes = cfg_.slot_bytes;
      h.first_failed.store(-1);
      for (int r = 0; r < n_; ++r) {
        pthread_mutexattr_t a;
        pthread_mutexattr_init(&a);
        pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
        pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
        pthread_mutex_init(&rc(r).alive, &a);
        pthread_mutexattr_destroy(&a);
      }
      h.magic.store(kMagic, std::memory_order_release);
    } else {
      while (hdr().magic.load(std::memory_order_acquire) != kMagic) {
        if (std::chrono::steady_clock::now() > deadline) {
          release();
          throw error(errc::timeout, "shm " + name_ + ": rank " + std::to_string(rank_) +
                                         " timed out waiting for rank 0 to initialise the segment");
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      if (hdr().n != std::uint32_t(n_) || hdr().slot_bytes != cfg_.slot_bytes) {
        const auto hn = hdr().n;
        release();
        throw error(errc::mismatch, "shm " + name_ + ": rank " + std::to_string(rank_) + " was started for " +
                                        std::to_string(n_) + " ranks but the job's segment is for " + std::to_string(hn));
      }
    }
    rank_ctl& m = me();
    const int lr = pthread_mutex_lock(&m.alive);
    if (lr == EOWNERDEAD) pthread_mutex_consistent(&m.alive);
    m.pid = std::int32_t(getpid());
    m.base = reinterpret_cast<std::uintptr_t>(base_);
    if (sched_getaffinity(0, sizeof m.cpus, &m.cpus) != 0) CPU_ZERO(&m.cpus);
    m.state.store(kLive);
    left_ = false;
    hdr().attached.fetch_add(1, std::memory_order_seq_cst);
    for (int q = 0; q < n_; ++q) rc(q).doorbell.wake(true);
    // Everyone attached: the name is no longer needed, so nothing can leak into /dev/shm.
    while (hdr().attached.load(std::memory_order_seq_cst) < std::uint32_t(n_)) {
      if (std::chrono::steady_clock::now() > deadline) {
        std::string missing;
        for (int q = 0; q < n_; ++q)
          if (rc(q).state.load() == 0) missing += (missing.empty() ? "" : ", ") + std::to_string(q);
        shm_unlink(name_.c_str());
        release();
        throw error(errc::timeout, "shm " + name_ + ": rank " + std::to_string(rank_) + " timed out waiting for rank(s) " +
                                       missing + " to attach");
      }
      const std::uint32_t v = me().doorbell.word.load();
      if (hdr().attached.load() < std::uint32_t(n_)) detail::futex_wait(me().doorbell.word, v, std::chrono::milliseconds(10), true);
    }
    std::uint32_t zero = 0;
    if (hdr().unlinked.compare_exchange_strong(zero, 1)) shm_unlink(name_.c_str());
    cpu_set_t job;
    CPU_ZERO(&job);
    for (int q = 0; q < n_; ++q) CPU_OR(&job, &job, &rc(q).cpus);
    spin_ = detail::spin_for(n_, std::max(1, CPU_COUNT(&job)));
    probe_single_copy(deadline);
  }

  /// Single copy needs process_vm_readv on every peer (same user; no seccomp or Yama rule
  /// against it). Every rank tries to read each peer's segment header through it; all ranks
  /// then agree: single copy is used only if every probe worked.
  void probe_single_copy(std::chrono::steady_clock::time_point deadline) {
    bool ok = !cfg_.single_copy_never();
    for (int q = 0; q < n_ && ok; ++q) {
      if (q == rank_) continue;
      std::uint64_t magic = 0;
      iovec local{&magic, sizeof magic}, remote{reinterpret_cast<void*>(rc(q).base), sizeof magic};
      ok = process_vm_readv(rc(q).pid, &local, 1, &remote, 1, 0) == ssize_t(sizeof magic) && magic == kMagic;
    }
    if (!ok) hdr().cma_failed.store(1, std::memory_order_seq_cst);
    hdr().probed.fetch_add(1, std::memory_order_seq_cst);
    while (hdr().probed.load(std::memory_order_seq_cst) < std::uint32_t(n_) && std::chrono::steady_clock::now() < deadline)
      std::this_thread::yield();
    cma_ = hdr().probed.load() == std::uint32_t(n_) && hdr().cma_failed.load() == 0;
  }

  /// Receives a single-copy message: reads it from the sender's memory, straight into the
  /// destination when it is a copy, through a cache-sized bounce buffer when it reduces.
  void read_remote(const recv_desc& d, std::uint64_t addr, const call_info& call, const combiner& comb, std::size_t elem) {
    const pid_t pid = rc(d.peer).pid;
    auto read = [&](std::byte* to, std::uint64_t from, std::size_t n) {
      std::size_t got = 0;
      while (got < n) {
        iovec local{to + got, n - got}, remote{reinterpret_cast<void*>(from + got), n - got};
        const ssize_t k = process_vm_readv(pid, &local, 1, &remote, 1, 0);
        if (k <= 0) {
          if (k < 0 && errno == EINTR) continue;
          if (peer_gone(d.peer, call)) report_gone(d.peer, call);
          call.fail(errc::transport_error, "could not read rank " + std::to_string(d.peer) +
                                               "'s buffer (process_vm_readv): " + std::strerror(errno));
        }
        got += std::size_t(k);
      }
    };
    if (d.how == combine::copy) {
      read(d.dst, addr, d.bytes);
      return;
    }
    const std::size_t piece = std::max(elem, kBounceBytes / elem * elem);
    if (bounce_.size() < piece) bounce_.resize(piece);
    for (std::size_t off = 0; off < d.bytes; off += piece) {
      const std::size_t nb = std::min(piece, d.bytes - off);
      read(bounce_.data(), addr + off, nb);
      if (d.how == combine::received_left) comb(d.dst + off, bounce_.data(), d.with + off, nb / elem);
      else comb(d.dst + off, d.with + off, bounce_.data(), nb / elem);
    }
  }
  /// How long a sender spins for the acknowledgement of a single-copy message before it
  /// sleeps: while its receiver reads it, and before the receiver has begun.
  static constexpr std::chrono::milliseconds kBusyReadSpin{20};
  static constexpr std::chrono::microseconds kAckSpin{200};
  /// Bounce buffer of single-copy receives that reduce: small enough to stay in L2.
  static constexpr std::size_t kBounceBytes = std::size_t(256) << 10;

  void release() noexcept {
    if (base_ == nullptr) return;
    leave();
    munmap(base_, bytes_);
    base_ = nullptr;
  }

  /// True when peer p can no longer take part: it failed, died, or left.
  bool peer_gone(int p, const call_info&) {
    rank_ctl& r = rc(p);
    const std::uint32_t s = r.state.load(std::memory_order_seq_cst);
    if (s == kFailed || s == kLeft) return true;
    const int lr = pthread_mutex_trylock(&r.alive);
    if (lr == EBUSY) return false;  // held: alive
    if (lr == EOWNERDEAD) {
      pthread_mutex_consistent(&r.alive);
      pthread_mutex_unlock(&r.alive);
      std::uint32_t live = kLive;
      if (r.state.compare_exchange_strong(live, kFailed)) {
        std::snprintf(r.why, sizeof r.why, "process %d died (killed or crashed) without leaving the job", int(r.pid));
        std::int32_t none = -1;
        hdr().first_failed.compare_exchange_strong(none, p);
      }
      return true;
    }
    if (lr == 0) pthread_mutex_unlock(&r.alive);  // free: it has left (or not yet attached)
    return r.state.load(std::memory_order_seq_cst) != kLive;
  }

  [[noreturn]] void report_gone(int p, const call_info& call) const {
    const rank_ctl& r = rc(p);
    const std::uint32_t s = r.state.load(std::memory_order_seq_cst);
    if (s == kLeft)
      call.fail(errc::peer_lost, "lost rank " + std::to_string(p) +
                                     ": it has left the job (it made fewer calls than this rank)");
    call.fail(errc::peer_lost, "lost rank " + std::to_string(p) + ": " + std::string(r.why, strnlen(r.why, sizeof r.why)));
  }

  bool failed_elsewhere(const call_info&) const {
    const std::int32_t f = hdr().first_failed.load(std::memory_order_seq_cst);
    return f >= 0 && f != rank_;
  }
  void report_failed_elsewhere(const call_info& call) const {
    const std::int32_t f = hdr().first_failed.load(std::memory_order_seq_cst);
    if (f >= 0 && f != rank_) {
      const rank_ctl& r = rc(f);
      call.fail(errc::peer_lost, "the job was aborted: rank " + std::to_string(f) + " failed: " +
                                     std::string(r.why, strnlen(r.why, sizeof r.why)));
    }
  }

  int rank_ = 0, n_ = 1;
  config cfg_;
  std::string name_;
  std::byte* base_ = nullptr;
  std::size_t bytes_ = 0;
  bool left_ = true;
  // exchange()'s progress per operation, reused across calls
  std::vector<op_state> send_state_, recv_state_;
  bool cma_ = false;                 // every rank can read every peer's memory
  int spin_ = detail::kSpinIterations;  // detail::spin_for(ranks)
  std::vector<std::byte> bounce_;    // single-copy receives that reduce: read here, then combine
  static constexpr std::uint32_t kRemote = 0xffffffffu;  // slot_line::chunk of a single-copy message
};

}  // namespace collx::transport
