#pragma once
// transport::shm — ranks are processes on one host, talking through POSIX shared memory.
//
// One segment per job, named /collx-<job> (mode 0600), laid out in shm/layout.hpp: a control
// block per rank, and per rank what it sends with — a channel to every other rank (a ring of
// cache lines, one per chunk) and its own pools of data slots and small buffers. A sender
// copies a message in, chunk by chunk, into buffers of its pools (shm/pool.hpp), or into the
// chunk's line when it fits; the receiver copies or reduces each chunk straight out of there
// into its destination (core/deliver.hpp), so a large message streams through a few
// hundred KiB that stay in cache, and the two copies cost little more memory traffic than one.
// Messages of collectives that only move data may instead be read by the receiver straight
// from the sender's memory (single copy, process_vm_readv: shm/config.hpp says when).
//
// Memory. Every page of the segment is reserved when it is created, so a segment that does not
// fit /dev/shm (a container's is 64 MiB by default) is an error at attach on every rank, which
// names the bytes needed and free and the settings that change them (shm/segment.hpp) — never
// a SIGBUS in the middle of a collective. The footprint is a pool per rank plus ~4 KiB per
// pair of ranks (docs/shm-footprint.md: by rank count, and the command that measures it).
//
// Progress. A step's sends and receives advance together: the exchange loop moves every chunk it
// can (a send needs a free line and buffer, a receive a filled line) and only when nothing can
// move does the rank wait, on its own doorbell: a futex word in shared memory that every peer
// bumps when it fills or frees a line of a channel to or from this rank. The futex is the
// process-shared kind (no FUTEX_PRIVATE_FLAG). Waiting spins briefly, then yields, then sleeps
// (core/wait.hpp).
//
// Liveness. Each rank's process holds a robust mutex for as long as it is attached, from a
// thread of its own (shm/liveness.hpp), so whichever thread made or uses the transport, a rank
// is alive exactly while its process is. When a process dies (SIGKILL included) the kernel
// releases its mutex and the next peer that tries it gets EOWNERDEAD: waiting ranks try their
// peers' mutexes between sleeps, so a dead peer is reported as errc::peer_lost within one sleep
// slice, not after the timeout.
//
// Names. The segment's name is unlinked as soon as every rank has attached; from then on it
// exists only as the ranks' mappings, which the kernel drops when the last one exits, however it
// exits. A job that crashed before all its ranks attached leaves the name; a rerun of that job
// recognises the segment as stale (its creator is dead) and replaces it: rank 0 unlinks it and
// creates a fresh one, and a rank that opened the stale one first lets go of it and waits for
// the fresh one. A segment whose creator lives belongs to another job of the same name: that
// is an error, not something to take over.
#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "../core/options.hpp"
#include "../core/concepts.hpp"
#include "../core/wait.hpp"
#include "../core/job_env.hpp"
#include "../core/error.hpp"
#include "../core/call_info.hpp"
#include "../core/split_plan.hpp"
#include "../core/deliver.hpp"
#include "shm/config.hpp"
#include "shm/layout.hpp"
#include "shm/liveness.hpp"
#include "shm/pool.hpp"
#include "shm/segment.hpp"

namespace collx::transport {

class shm {
 public:
  using transport_concept = transport_tag;
  using memory_space = host_memory;
  static constexpr const char* name = "shm";
  using config = shm_config;

  /// Bytes a line carries itself, and a small buffer (shm/layout.hpp).
  static constexpr std::size_t kInline = shm_layout::kInline;
  static constexpr std::size_t kSmallBytes = shm_layout::kSmallBytes;

  shm(std::string job, int rank, int size, config cfg = {}) : shm(std::move(job), rank, size, cfg, nullptr) {}

 private:
  /// Which member of a communicator being made from this one has died (its rank there), or -1:
  /// split() and shrink() give it to the new transport's attach, which then fails at once,
  /// naming the member, instead of waiting for it until the deadline.
  ///
  /// A split's also counts a member that failed on the parent (its state there): one whose own
  /// part of the split's agreement failed (a peer died during it) never comes, and the others
  /// would wait for it until the attach deadline, past their shrink's. A shrink's does not: its
  /// members have all revoked the parent, which marks them failed there.
  struct members_of {
    const shm* parent;
    const std::vector<int>* members;  // their ranks on the parent
    bool failed_counts = false;       // a split's
    /// The first member that died or failed, -1 when none. With `made` (the communicator being
    /// made, where member k is rank k) it skips the members that have attached to it, but for
    /// member 0, its creator: no one still joining can map a segment whose creator is gone. It
    /// reads the member's state there after its fate on the parent: a member found gone and
    /// unattached then never attached (a dead process cannot).
    int gone(const shm* made = nullptr) const {
      for (std::size_t k = 0; k < members->size(); ++k) {
        const int m = (*members)[k];
        if (m == parent->rank_) continue;
        const bool lost = shm_detail::probe(&parent->rc(m).alive) != shm_detail::holder::alive ||
                          (failed_counts && parent->rc(m).state.load(std::memory_order_seq_cst) == shm_layout::kFailed);
        if (!lost) continue;
        if (made != nullptr && k != 0 && made->rc(int(k)).state.load(std::memory_order_seq_cst) != 0) continue;
        return int(k);
      }
      return -1;
    }
    /// Why member k is gone: what it wrote when it failed on the parent, or that it died.
    std::string why(int k) const {
      shm_layout::rank_ctl& r = parent->rc((*members)[std::size_t(k)]);
      if (shm_detail::probe(&r.alive) == shm_detail::holder::alive && r.state.load() == shm_layout::kFailed)
        return "failed on it: " + std::string(r.why, strnlen(r.why, sizeof r.why));
      return "died";
    }
  };

  shm(std::string job, int rank, int size, config cfg, const members_of* from) : rank_(rank), n_(size), cfg_(cfg) {
    if (size < 1 || rank < 0 || rank >= size)
      throw error(errc::invalid_argument, "shm: rank " + std::to_string(rank) + " is out of range for " +
                                              std::to_string(size) + " ranks");
    if (size > (1 << 16))
      throw error(errc::invalid_argument, "shm: " + std::to_string(size) + " ranks on one host (at most 65536)");
    if (cfg_.slot_bytes < config::kMinSlotBytes || cfg_.slot_bytes > config::kMaxSlotBytes || cfg_.slot_bytes % 64 != 0)
      throw error(errc::invalid_argument, "shm: slot_bytes " + std::to_string(cfg_.slot_bytes) + " must be a multiple of 64 in [" +
                                              std::to_string(config::kMinSlotBytes) + ", " +
                                              std::to_string(config::kMaxSlotBytes) + "]");
    if (cfg_.slots < 1 || cfg_.slots > 4096)
      throw error(errc::invalid_argument, "shm: slots " + std::to_string(cfg_.slots) + " must be in [1, 4096]");
    name_ = segment_name(job);
    L_ = shm_layout::layout(n_, cfg_);
    keeper_ = std::make_unique<shm_detail::liveness_keeper>();
    attach(from);
  }

 public:

  /// Rank, size and job from the launcher's environment (core/job_env.hpp).
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

  /// Splits (core/split_plan.hpp): the new communicator's segment, of its size, named after this
  /// one's and the split's id, made as a job's is (its rank 0 creates it, the others join).
  split_offer prepare_split() { return {}; }
  shm split(const split_plan& p, split_offer&&) const {
    const members_of from{this, &p.members, true};
    return shm(name_.substr(std::strlen("/collx-")) + "." + p.id, p.rank, p.size, cfg_, &from);
  }

  /// communicator::shrink (core/split_plan.hpp), through this segment, which a failure leaves
  /// mapped: each survivor marks itself joined (rank_ctl::shrink_joined) and waits until every
  /// rank has joined or its process is gone (its liveness mutex is free); the first to see that,
  /// or its deadline, takes the header's shrink_lock and writes every rank's verdict, and a
  /// decider that dies meanwhile is replaced. The survivors then meet in a new segment, named
  /// as a split's is.
  shm shrink(const shrink_request& q, std::vector<int>& members) {
    using namespace shm_layout;
    if (base_ == nullptr || left_) throw error(errc::invalid_argument, q.what + ": this rank's shared-memory transport has left the job");
    const std::uint32_t epoch = q.epoch;
    std::uint32_t was = me().shrink_joined.load(std::memory_order_seq_cst);
    while (was < epoch && !me().shrink_joined.compare_exchange_weak(was, epoch, std::memory_order_seq_cst)) {}
    for (int r = 0; r < n_; ++r) rc(r).doorbell.wake(true);
    std::vector<char> dead(std::size_t(n_), 0);  // once gone, gone: a free mutex is never held again
    auto alive = [&](int r) {
      if (r == rank_) return true;
      if (dead[std::size_t(r)] == 0 && !process_alive(r)) dead[std::size_t(r)] = 1;
      return dead[std::size_t(r)] == 0;
    };
    const auto deadline = std::chrono::steady_clock::now() + q.timeout;
    for (;;) {
      if (hdr().shrink_done.load(std::memory_order_acquire) >= epoch) {
        members.clear();
        int mine = -1;
        for (int r = 0; r < n_; ++r)
          if (rc(r).shrink_in.load(std::memory_order_acquire) == epoch) {
            if (r == rank_) mine = int(members.size());
            members.push_back(r);
          }
        if (mine < 0)
          throw error(errc::peer_lost, q.what + ": the survivors went on without this rank (it joined after their deadline)");
        const members_of from{this, &members};
        return shm(name_.substr(std::strlen("/collx-")) + "." + q.id, mine, int(members.size()), cfg_, &from);
      }
      const std::uint32_t bell = me().doorbell.word.load(std::memory_order_seq_cst);
      bool all = true;
      for (int r = 0; r < n_ && all; ++r) all = rc(r).shrink_joined.load(std::memory_order_seq_cst) >= epoch || !alive(r);
      const auto now = std::chrono::steady_clock::now();
      // A decider that took the lock and then stopped (SIGSTOP, a debugger) is taken over from
      // once a second deadline has passed: no wait here is without one.
      if (all || now >= deadline) decide_shrink(epoch, alive, now >= deadline + q.timeout);
      if (hdr().shrink_done.load(std::memory_order_acquire) < epoch)
        detail::futex_wait(me().doorbell.word, bell, std::chrono::milliseconds(20), true);
    }
  }

  /// The bytes of shared memory a job of n ranks reserves with cfg (shm/layout.hpp).
  static std::size_t footprint(int n, const config& cfg = {}) { return shm_layout::layout(n, cfg).total_bytes(); }

  shm(shm&& o) noexcept { *this = std::move(o); }
  shm& operator=(shm&& o) noexcept {
    if (this != &o) {
      release();
      rank_ = o.rank_; n_ = o.n_; cfg_ = o.cfg_; name_ = std::move(o.name_); L_ = o.L_;
      base_ = o.base_; bytes_ = o.bytes_; left_ = o.left_; aborted_ = o.aborted_; cma_ = o.cma_; spin_ = o.spin_;
      keeper_ = std::move(o.keeper_);
      pool_ = std::move(o.pool_);
      sig_ = o.sig_;
      o.base_ = nullptr; o.bytes_ = 0; o.left_ = true;
    }
    return *this;
  }
  shm(const shm&) = delete;
  shm& operator=(const shm&) = delete;
  ~shm() { release(); }

  int rank() const noexcept { return rank_; }
  /// Every rank's position, in its rank_ctl (the desync report at a deadline: core/call_info.hpp).
  detail::position_board positions() const noexcept {
    return base_ == nullptr ? detail::position_board{} : detail::position_board{&rc(0).pos, sizeof(shm_layout::rank_ctl), n_};
  }
  int size() const noexcept { return n_; }
  /// Buffers spread over pieces (core/concepts.hpp) are read and written through core/deliver.hpp.
  bool takes_pieces() const noexcept { return true; }
  const std::string& segment() const noexcept { return name_; }
  /// Bytes of the segment this job reserved.
  std::size_t segment_bytes() const noexcept { return bytes_; }
  /// Whether single-copy receives (process_vm_readv) work between every pair of ranks here.
  bool single_copy() const noexcept { return cma_; }

  void exchange(std::span<const send_desc> sends, std::span<const recv_desc> recvs, const exchange_context& ctx) {
    using namespace shm_layout;
    const call_info& call = *ctx.call;
    check_live(call);
    const std::size_t elem = std::max<std::size_t>(1, ctx.comb.elem_size);
    const std::size_t chunk = cfg_.slot_bytes / elem * elem;
    if (chunk == 0)
      call.fail(errc::invalid_argument, "an element of " + std::to_string(elem) + " B does not fit a " +
                                            std::to_string(cfg_.slot_bytes) + " B shared-memory slot");
    ss_.assign(sends.size(), {});
    rs_.assign(recvs.size(), {});
    std::size_t pending = sends.size() + recvs.size();
    const std::uint64_t my_hash = call.sig.hash();
    const std::uint32_t sig_at = publish(call.sig, my_hash);
    // Single copy only for collectives that move data without reducing it: a receiver that
    // reduces would do the kernel's copy and the reduction alone, while through the channel the
    // sender's copy and the receiver's reduction overlap (see shm_config::single_copy_bytes).
    const bool single_copy = cma_ && ctx.comb.fn == nullptr;
    const bool crowded = spin_ < detail::kSpinIterations;
    // Set by the wait's slow path when it moved a chunk in a smaller buffer (see check below).
    bool trickled = false;

    auto first_to = [](auto ops, const auto& st, std::size_t i) { return may_progress(ops, st, i); };
    auto consumed_of = [&](int peer) { return ctl(rank_, peer).consumed.load(std::memory_order_acquire); };
    // Room for one more line in the channel to `peer` (its buffers are reclaimed on the way).
    auto line_room = [&](int peer, std::uint32_t posted) {
      if (posted - pool_.reclaimed(peer) < kLines) return true;
      pool_.reclaim(peer, consumed_of(peer));
      return posted - pool_.reclaimed(peer) < kLines;
    };
    auto kind_of = [](std::size_t nb) {
      return nb <= kInline ? shm_detail::send_pool::kind::inline_line
             : nb <= kSmallBytes ? shm_detail::send_pool::kind::small
                                 : shm_detail::send_pool::kind::data;
    };
    // Posts chunk `nb` bytes of send i from its current offset into buffer b.
    auto post = [&](std::size_t i, std::size_t nb, std::uint16_t b) {
      const send_desc& d = sends[i];
      op_state& st = ss_[i];
      channel_ctl& c = ctl(rank_, d.peer);
      const std::uint32_t posted = c.posted.load(std::memory_order_relaxed);
      slot_line& l = c.line[posted % kLines];
      line_body body;
      body.chunk = std::uint32_t(nb);
      body.sig_at = std::uint16_t(sig_at);
      body.buf = b;
      body.total = d.bytes;
      body.sig_hash = my_hash;
      if (b == kBufInline) {
        detail::gather(body.inline_data, d, st.off, nb);  // a zero-length message has no data pointer
      }
      else detail::gather(pool_buffer(rank_, b), d, st.off, nb);
      std::memcpy(&l.body, &body, sizeof body);  // one burst, then seq (see line_body)
      l.seq.store(posted + 1, std::memory_order_release);
      c.posted.store(posted + 1, std::memory_order_relaxed);
      pool_.posted(d.peer, posted, b);
      ring(d.peer);
      st.off += nb;
      st.started = true;
      if (st.off == d.bytes) {
        if (ctx.synchronous) {  // done once the receiver has consumed the last chunk
          st.awaiting_ack = true;
          st.ack_at = posted + 1;
        } else {
          st.done = true;
          --pending;
        }
      }
    };
    // A send blocked only for want of a pool buffer (its line is free).
    auto starved = [&](std::size_t i) {
      const send_desc& d = sends[i];
      const op_state& st = ss_[i];
      if (st.done || st.awaiting_ack || !first_to(sends, ss_, i)) return false;
      return line_room(d.peer, ctl(rank_, d.peer).posted.load(std::memory_order_relaxed)) &&
             kind_of(std::min(chunk, d.bytes - st.off)) != shm_detail::send_pool::kind::inline_line;
    };

    auto advance = [&]() -> bool {
      bool moved = false;
      for (std::size_t i = 0; i < sends.size(); ++i) {
        op_state& st = ss_[i];
        const send_desc& d = sends[i];
        if (st.done) continue;
        channel_ctl& c = ctl(rank_, d.peer);
        if (st.awaiting_ack) {  // single copy, or a synchronous send: done when the receiver has it
          if (std::int32_t(c.consumed.load(std::memory_order_acquire) - st.ack_at) >= 0) {
            st.done = true;
            --pending;
            moved = true;
          }
          continue;
        }
        if (!st.started && single_copy && d.spread.of == nullptr && cfg_.single_copy_for(d.bytes, !recvs.empty(), sends.size() > 1, crowded) &&
            first_to(sends, ss_, i)) {
          const std::uint32_t posted = c.posted.load(std::memory_order_relaxed);
          if (!line_room(d.peer, posted)) continue;
          slot_line& l = c.line[posted % kLines];
          line_body body;
          body.chunk = 0;
          body.sig_at = std::uint16_t(sig_at);
          body.buf = kBufRemote;
          body.total = d.bytes;
          body.sig_hash = my_hash;
          const std::uint64_t addr = reinterpret_cast<std::uintptr_t>(d.data);
          std::memcpy(body.inline_data, &addr, sizeof addr);
          std::memcpy(&l.body, &body, sizeof body);
          l.seq.store(posted + 1, std::memory_order_release);
          c.posted.store(posted + 1, std::memory_order_relaxed);
          pool_.posted(d.peer, posted, kBufRemote);
          ring(d.peer);
          st.ack_at = posted + 1;
          st.awaiting_ack = true;
          st.started = moved = true;
          continue;
        }
        while (!st.done && !st.awaiting_ack && first_to(sends, ss_, i)) {
          const std::uint32_t posted = c.posted.load(std::memory_order_relaxed);
          if (!line_room(d.peer, posted)) break;
          const std::size_t nb = std::min(chunk, d.bytes - st.off);
          const std::uint16_t b = pool_.take(kind_of(nb), d.peer, consumed_of);
          if (b == shm_detail::send_pool::kNone) break;
          post(i, nb, b);
          moved = true;
        }
      }
      for (std::size_t i = 0; i < recvs.size(); ++i) {
        op_state& st = rs_[i];
        const recv_desc& d = recvs[i];
        channel_ctl& c = ctl(d.peer, rank_);
        while (!st.done && first_to(recvs, rs_, i)) {
          const std::uint32_t consumed = c.consumed.load(std::memory_order_relaxed);
          const slot_line& sl = c.line[consumed % kLines];
          if (sl.seq.load(std::memory_order_acquire) != consumed + 1) break;
          const line_body& l = sl.body;
          if (!st.started && (l.sig_hash != my_hash || l.total != d.bytes)) check_match(d.peer, l, d.bytes, call);
          // A peer this rank waited on: when did it enter the call? (its published signature)
          if (call.rec != nullptr && call.rec->wants_entry(d.peer))
            call.heard(d.peer, rc(d.peer).sigs[l.sig_at % shm_layout::kSigRing]);
          if (l.buf == kBufRemote) {  // single copy: read the whole message from the sender
            std::uint64_t addr = 0;
            std::memcpy(&addr, l.inline_data, sizeof addr);
            read_remote(c, d, addr, call, ctx.comb, elem);
            c.consumed.store(consumed + 1, std::memory_order_release);
            ring(d.peer);
            st.off = d.bytes;
            st.started = moved = st.done = true;
            --pending;
            break;
          }
          const std::size_t nb = std::size_t(l.chunk);
          if (nb > d.bytes - st.off || nb % elem != 0 || (nb == 0 && d.bytes != 0))
            call.fail(errc::mismatch, "got a chunk of " + std::to_string(nb) + " B from " + call.peer(d.peer) +
                                          " where " + std::to_string(d.bytes - st.off) + " B remained");
          detail::deliver(d, st.off, buffer(d.peer, l, call), nb, ctx.comb);
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
      if (trickled) return true;
      for (std::size_t i = 0; i < sends.size(); ++i) {
        if (ss_[i].done) continue;
        const int peer = sends[i].peer;
        if (ss_[i].awaiting_ack) {
          if (std::int32_t(consumed_of(peer) - ss_[i].ack_at) >= 0) return true;
          continue;
        }
        if (!first_to(sends, ss_, i)) continue;
        const std::uint32_t posted = ctl(rank_, peer).posted.load(std::memory_order_relaxed);
        if (!line_room(peer, posted)) continue;
        // a buffer is free, or one held by a consumed chunk can be reclaimed
        if (pool_.can_take(kind_of(std::min(chunk, sends[i].bytes - ss_[i].off)), peer, consumed_of)) return true;
      }
      for (std::size_t i = 0; i < recvs.size(); ++i) {
        if (rs_[i].done || !first_to(recvs, rs_, i)) continue;
        const channel_ctl& c = ctl(recvs[i].peer, rank_);
        const std::uint32_t consumed = c.consumed.load(std::memory_order_relaxed);
        if (c.line[consumed % kLines].seq.load(std::memory_order_acquire) == consumed + 1) return true;
      }
      return false;
    };
    auto first_pending = [&](const char*& what) {
      for (std::size_t i = 0; i < recvs.size(); ++i)
        if (!rs_[i].done) {
          what = "its data";
          return recvs[i].peer;
        }
      for (std::size_t i = 0; i < sends.size(); ++i)
        if (!ss_[i].done) {
          what = ctx.synchronous ? "it to receive this rank's message" : ss_[i].awaiting_ack ? "it to read this rank's data" : "room in its channel";
          return sends[i].peer;
        }
      return -1;
    };
    auto check = [&] {
      // Nothing has moved for a while. A send that waits only for a pool buffer goes on in a
      // smaller one (a small buffer, else its line): slow, but no channel ever waits on buffers
      // that other channels hold (shm/pool.hpp).
      for (std::size_t i = 0; i < sends.size() && !trickled; ++i) {
        if (!starved(i)) continue;
        const send_desc& d = sends[i];
        const std::size_t left = d.bytes - ss_[i].off;
        for (auto k : {shm_detail::send_pool::kind::small, shm_detail::send_pool::kind::inline_line}) {
          const std::size_t cap = (k == shm_detail::send_pool::kind::small ? kSmallBytes : kInline) / elem * elem;
          if (cap == 0) continue;
          const std::uint16_t b = pool_.take(k, d.peer, consumed_of);
          if (b == shm_detail::send_pool::kNone) continue;
          post(i, std::min(cap, left), b);
          trickled = true;
          break;
        }
      }
      if (trickled) return;
      // A peer that failed, died or left ends the wait, unless what it did before leaves us
      // something to do (its last chunks are still in the channel).
      auto gone = [&](int p) { return peer_gone(p); };
      bool any_gone = failed_elsewhere();
      for (std::size_t i = 0; i < sends.size() && !any_gone; ++i) any_gone = !ss_[i].done && gone(sends[i].peer);
      for (std::size_t i = 0; i < recvs.size() && !any_gone; ++i) any_gone = !rs_[i].done && gone(recvs[i].peer);
      if (!any_gone || ready()) return;
      for (std::size_t i = 0; i < recvs.size(); ++i)
        if (!rs_[i].done && gone(recvs[i].peer)) report_gone(recvs[i].peer, call);
      for (std::size_t i = 0; i < sends.size(); ++i)
        if (!ss_[i].done && gone(sends[i].peer)) report_gone(sends[i].peer, call);
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
        if (ss_[i].awaiting_ack && !ss_[i].done) {
          any = true;
          reading = reading || ctl(rank_, sends[i].peer).reading.load(std::memory_order_relaxed) != 0;
        }
      return any;
    };
    std::chrono::steady_clock::time_point busy_since{};
    while (pending != 0) {
      trickled = false;
      if (advance()) continue;
      bool reading = false;
      if (!crowded && awaiting_read(reading)) {
        const auto now = std::chrono::steady_clock::now();
        if (busy_since == std::chrono::steady_clock::time_point{}) busy_since = now;
        if (now - busy_since < (reading ? kBusyReadSpin : kAckSpin)) {
          for (int k = 0; k < 64 && !ready(); ++k) detail::cpu_relax();
          continue;
        }
      }
      const char* what = "";
      const int p = first_pending(what);
      detail::timed_wait tw(call, p);
      if (detail::wait_on(me().doorbell, ready, check, call.timeout, true, spin_, tw.hook()) == detail::wait_result::timed_out)
        call.timed_out(p, what);
    }
  }

  /// Receive from any source (collectives/p2p.hpp, recv_any): waits until the channel from one
  /// of `peers` holds a point-to-point message of this communicator at its head (its first
  /// chunk's line is posted), and returns that peer (the first in `peers` when several do).
  /// Nothing is taken.
  int probe(std::span<const int> peers, const call_info& call) {
    using namespace shm_layout;
    check_live(call);
    int found = -1;
    auto ready = [&] {
      for (int p : peers) {
        const channel_ctl& c = ctl(p, rank_);
        const std::uint32_t consumed = c.consumed.load(std::memory_order_relaxed);
        const slot_line& sl = c.line[consumed % kLines];
        if (sl.seq.load(std::memory_order_acquire) != consumed + 1) continue;
        // The signature is published before the line (a stale one, overwritten by a sender
        // many calls ahead, no longer has the line's hash: its receive reports that).
        const call_signature theirs = rc(p).sigs[sl.body.sig_at % kSigRing];
        if (call.takes_any_source(theirs) && theirs.hash() == sl.body.sig_hash) {
          found = p;
          return true;
        }
      }
      return false;
    };
    // A failure anywhere ends the wait, as in a step; peers that left only when all of them have.
    auto check = [&] {
      bool all_gone = true;
      for (int p : peers) all_gone = peer_gone(p) && all_gone;
      if ((!all_gone && !failed_elsewhere()) || ready()) return;
      report_failed_elsewhere(call);
      call.fail(errc::peer_lost, "every rank it could receive from has left the job (" + call.peers(peers) + ")");
    };
    detail::timed_wait tw(call, -1);
    if (detail::wait_on(me().doorbell, ready, check, call.timeout, true, spin_, tw.hook()) == detail::wait_result::timed_out)
      call.timed_out_any(peers);
    return found;
  }

  /// Marks this rank failed (peers then fail fast with errc::peer_lost) and wakes everyone. It
  /// does not wait for a peer that is reading this rank's memory (single copy): the caller may
  /// unwind and reuse that memory at once, because a read that ends after this finds the rank
  /// failed and discards what it read (read_remote). Waiting would not help a peer that is
  /// stopped mid-read, and it held the error back (up to 2 s), long enough for this rank to
  /// miss its survivors' shrink.
  void abort(const std::string& why) noexcept {
    using namespace shm_layout;
    if (base_ == nullptr || left_ || aborted_) return;  // the first reason is the cause
    rank_ctl& m = me();
    aborted_ = true;
    std::snprintf(m.why, sizeof m.why, "%s", detail::head_and_tail(why, sizeof m.why - 1).c_str());
    m.state.store(kFailed, std::memory_order_seq_cst);
    std::int32_t none = -1;
    hdr().first_failed.compare_exchange_strong(none, rank_);
    for (int q = 0; q < n_; ++q) rc(q).doorbell.wake(true);
  }

  /// Leaves the job normally: peers still waiting for this rank are told it left.
  void leave() noexcept {
    using namespace shm_layout;
    if (base_ == nullptr || left_) return;
    rank_ctl& m = me();
    std::uint32_t live = kLive;
    m.state.compare_exchange_strong(live, kLeft);
    if (keeper_) keeper_->release();
    left_ = true;
    for (int q = 0; q < n_; ++q) rc(q).doorbell.wake(true);
  }

 private:
  struct op_state {
    std::size_t off = 0;
    bool started = false, done = false;
    bool awaiting_ack = false;  // single copy or synchronous: posted, waiting for the receiver to take it
    std::uint32_t ack_at = 0;   // the `consumed` count that acknowledges it (any value: counters wrap)
  };
  using header = shm_layout::header;
  using rank_ctl = shm_layout::rank_ctl;
  using channel_ctl = shm_layout::channel_ctl;
  using slot_line = shm_layout::slot_line;
  using line_body = shm_layout::line_body;

  header& hdr() const { return *reinterpret_cast<header*>(base_); }
  rank_ctl& rc(int r) const { return reinterpret_cast<rank_ctl*>(base_ + L_.ranks_off())[r]; }
  rank_ctl& me() const { return rc(rank_); }
  channel_ctl& ctl(int from, int to) const { return *reinterpret_cast<channel_ctl*>(base_ + L_.channel_off(from, to)); }
  /// Pool buffer b of rank `from` (a data slot, or a small buffer from kBufSmall on).
  std::byte* pool_buffer(int from, std::uint16_t b) const {
    using namespace shm_layout;
    if (b >= kBufSmall) return base_ + L_.small_off(from, b - kBufSmall);
    return base_ + L_.data_off(from, b);
  }
  /// Where the data of a received chunk lies, checked: a buffer number out of range is a broken peer.
  const std::byte* buffer(int from, const line_body& l, const call_info& call) const {
    using namespace shm_layout;
    if (l.buf == kBufInline) {
      if (l.chunk > kInline) call.fail(errc::transport_error, call.peer(from) + " posted an inline chunk of " + std::to_string(l.chunk) + " B");
      return l.inline_data;
    }
    const bool small = l.buf >= kBufSmall;
    const std::uint32_t i = small ? std::uint32_t(l.buf - kBufSmall) : l.buf;
    if ((small && (i >= kSmall || l.chunk > kSmallBytes)) || (!small && (i >= L_.slots || l.chunk > L_.slot_bytes)))
      call.fail(errc::transport_error, call.peer(from) + " posted a chunk in buffer " + std::to_string(l.buf) +
                                           ", which its pools do not have");
    return base_ + (small ? L_.small_off(from, i) : L_.data_off(from, i));
  }

  /// This call's signature where receivers can find it (rank_ctl::sigs), once per call.
  std::uint32_t publish(const call_signature& sig, std::uint64_t hash) {
    if (sig_.valid && sig_.hash == hash && sig_.seq == sig.seq) return sig_.at;
    rank_ctl& m = me();
    const std::uint32_t at = m.sig_count++;
    m.sigs[at % shm_layout::kSigRing] = sig;
    sig_ = {true, hash, sig.seq, at};
    return at;
  }

  /// A message's signature or size differs from this call's: report both sides.
  void check_match(int peer, const line_body& l, std::size_t my_bytes, const call_info& call) const {
    const call_signature theirs = rc(peer).sigs[l.sig_at % shm_layout::kSigRing];
    if (theirs.hash() != l.sig_hash)
      call.fail(errc::mismatch, "and " + call.peer(peer) + " made different calls: this rank called " + call.sig.describe() +
                                    ", " + call.peer(peer) + " sent a message of another call (" +
                                    std::to_string(l.total) + " B), which it has since moved past");
    call.check_match(peer, theirs, std::size_t(l.total), my_bytes);
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
  std::string who() const { return "shm " + name_ + ": rank " + std::to_string(rank_); }

  // ---- attach (defined in shm/attach.hpp) ---------------------------------------------------

  void attach(const members_of* from);

  /// Whether the segment mapped at `base` (at least its first rank_ctl) belongs to a job whose
  /// rank 0 is still attached. Several ranks of a rerun may ask at once: the one that finds the
  /// mutex free (its holder died) holds it for a moment, during which the others find it
  /// taken, so it marks rank 0 failed before it lets go, and a taken mutex counts as alive only
  /// when it is still taken, with rank 0 still live, a moment later.
  static bool creator_alive(std::byte* base);
  static constexpr std::size_t prefix_bytes() { return shm_layout::layout::ranks_off() + sizeof(rank_ctl); }

  /// Rank 0: replaces what a crashed run left, creates the segment and reserves every page of it.
  void create(std::chrono::steady_clock::time_point deadline);

  /// Ranks but 0: waits for rank 0's segment and maps it, letting go of a stale one.
  void join(std::chrono::steady_clock::time_point deadline, const members_of* from);
  /// A member of the communicator being made died, or failed on the one it is made from,
  /// before it attached (members_of::gone found member k): this rank gives up.
  [[noreturn]] void fail_gone(const members_of& from, int k, const char* doing) {
    give_up(errc::peer_lost, who() + ": its rank " + std::to_string(k) + " (rank " + std::to_string((*from.members)[std::size_t(k)]) +
                                 " of the communicator it is made from) " + from.why(k) + ", " + doing);
  }
  /// Ends an attach that cannot complete. A rank that has attached marks itself failed, with
  /// the reason, before it lets go: the others may yet complete (the last member attaches
  /// after this rank saw one die) and their first call must learn why this rank is missing,
  /// not that it left having made fewer calls (the chaos run found that).
  [[noreturn]] void give_up(errc code, const std::string& why) {
    if (base_ != nullptr) {
      abort(why);
      release();
    }
    throw error(code, why);
  }

  /// Single copy needs process_vm_readv on every peer (same user; no seccomp or Yama rule
  /// against it). Every rank tries to read each peer's segment header through it; all ranks
  /// then agree: single copy is used only if every probe worked.
  void probe_single_copy(std::chrono::steady_clock::time_point deadline);

  /// Receives a single-copy message: reads it from the sender's memory, straight into the
  /// destination when it is a copy, through a cache-sized bounce buffer when it reduces.
  /// `reading` tells the sender to keep spinning for the acknowledgement while the read goes
  /// on. A sender that has failed is not read, and what was read from one that failed during
  /// the read is discarded (it may have stopped waiting and reused its memory).
  void read_remote(channel_ctl& c, const recv_desc& d, std::uint64_t addr, const call_info& call, const combiner& comb,
                   std::size_t elem);  // shm/single_copy.hpp
  /// How long a sender spins for the acknowledgement of a single-copy message before it
  /// sleeps: while its receiver reads it, and before the receiver has begun.
  static constexpr std::chrono::milliseconds kBusyReadSpin{20};
  static constexpr std::chrono::microseconds kAckSpin{200};
  /// Bounce buffer of single-copy receives that reduce: small enough to stay in L2.
  static constexpr std::size_t kBounceBytes = std::size_t(256) << 10;

  void release() noexcept;

  /// A rank whose transport failed or left takes part in no more calls.
  void check_live(const call_info& call) const {
    if (base_ == nullptr || left_ || aborted_)
      call.fail(errc::peer_lost, aborted_ ? "this rank's shared-memory transport already failed: " + std::string(me().why, strnlen(me().why, sizeof me().why))
                                          : std::string("this rank's shared-memory transport has already left the job"));
  }
  /// True when peer p can no longer take part: it failed, died, or left.
  bool peer_gone(int p) {
    using namespace shm_layout;
    rank_ctl& r = rc(p);
    const std::uint32_t s = r.state.load(std::memory_order_seq_cst);
    if (s == kFailed || s == kLeft) return true;
    const shm_detail::holder h = shm_detail::probe(&r.alive);
    if (h == shm_detail::holder::alive) return false;
    if (h == shm_detail::holder::died || s == kLive) {  // its process is gone (a live rank's mutex is always held)
      std::uint32_t live = kLive;
      if (r.state.compare_exchange_strong(live, kFailed)) {
        std::snprintf(r.why, sizeof r.why, "process %d died (killed or crashed) without leaving the job", int(r.pid));
        std::int32_t none = -1;
        hdr().first_failed.compare_exchange_strong(none, p);
      }
      return true;
    }
    return r.state.load(std::memory_order_seq_cst) != kLive;  // not attached yet (state 0): not gone
  }

  /// Whether rank p's process lives: its liveness mutex is held, and still held a moment later
  /// (a peer that finds it free holds it for a moment itself).
  bool process_alive(int p) {
    for (int tries = 0;; ++tries) {
      if (shm_detail::probe(&rc(p).alive) != shm_detail::holder::alive) return false;
      if (tries >= 2) return true;
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }

  /// shrink(): takes the header's shrink_lock for `epoch` (from a decider that died, too) and
  /// writes every rank's verdict: kept when it joined and its process lives.
  template <class Alive>
  void decide_shrink(std::uint32_t epoch, Alive& alive, bool take_over_live) {
    using namespace shm_layout;
    std::uint64_t cur = hdr().shrink_lock.load(std::memory_order_seq_cst);
    for (;;) {
      if ((cur >> 32) >= epoch) {
        const int owner = int(cur & 0xffffffffu) - 1;
        if (owner == rank_ || (owner >= 0 && owner < n_ && alive(owner) && !take_over_live)) return;  // it decides
      }
      if (hdr().shrink_lock.compare_exchange_strong(cur, (std::uint64_t(epoch) << 32) | std::uint32_t(rank_ + 1))) break;
    }
    // A decision published meanwhile (by the owner taken over from, just before it died) stands:
    // some rank may have read it.
    if (hdr().shrink_done.load(std::memory_order_seq_cst) >= epoch) return;
    for (int r = 0; r < n_; ++r)
      rc(r).shrink_in.store(rc(r).shrink_joined.load(std::memory_order_seq_cst) >= epoch && alive(r) ? epoch : 0,
                            std::memory_order_seq_cst);
    hdr().shrink_done.store(epoch, std::memory_order_release);
    for (int r = 0; r < n_; ++r) rc(r).doorbell.wake(true);
  }

  [[noreturn]] void report_gone(int p, const call_info& call) const {
    const rank_ctl& r = rc(p);
    const std::uint32_t s = r.state.load(std::memory_order_seq_cst);
    if (s == shm_layout::kLeft)
      call.fail(errc::peer_lost, "lost " + call.peer(p) +
                                     ": it has left the job (it made fewer calls than this rank)");
    call.fail(errc::peer_lost, "lost " + call.peer(p) + ": " + std::string(r.why, strnlen(r.why, sizeof r.why)));
  }

  bool failed_elsewhere() const {
    const std::int32_t f = hdr().first_failed.load(std::memory_order_seq_cst);
    return f >= 0 && f != rank_;
  }
  void report_failed_elsewhere(const call_info& call) const {
    const std::int32_t f = hdr().first_failed.load(std::memory_order_seq_cst);
    if (f >= 0 && f != rank_) {
      const rank_ctl& r = rc(f);
      call.fail(errc::peer_lost, "the job was aborted: " + call.peer(f) + " failed: " +
                                     std::string(r.why, strnlen(r.why, sizeof r.why)));
    }
  }

  int rank_ = 0, n_ = 1;
  config cfg_;
  std::string name_;
  shm_layout::layout L_;
  std::byte* base_ = nullptr;
  std::size_t bytes_ = 0;
  bool left_ = true;
  bool aborted_ = false;
  std::unique_ptr<shm_detail::liveness_keeper> keeper_;
  shm_detail::send_pool pool_;
  struct published {
    bool valid = false;
    std::uint64_t hash = 0, seq = 0;
    std::uint32_t at = 0;
  } sig_;
  // exchange()'s progress per operation, reused across calls
  std::vector<op_state> ss_, rs_;
  bool cma_ = false;                    // every rank can read every peer's memory
  int spin_ = detail::kSpinIterations;  // detail::spin_for(ranks)
  std::vector<std::byte> bounce_;       // single-copy receives that reduce: read here, then combine
};

}  // namespace collx::transport

// Defined apart, by responsibility: joining and leaving the segment, and single-copy reads.
#include "shm/attach.hpp"
#include "shm/single_copy.hpp"
