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
// Names. "/collx-<uid>-<job>", and "-<the secret's fingerprint>" when the job has a secret
// (COLLX_JOB_TOKEN): another user can guess the rest, not that (docs/security.md). Rank 0, which
// created the segment, unlinks its name as soon as every rank has attached; from then on it
// exists only as the ranks' mappings, which the kernel drops when the last one exits, however it
// exits. A job that crashed before all its ranks attached leaves the name; a rerun of that job
// recognises the segment as stale (its creator is dead) and replaces it: rank 0 unlinks it and
// creates a fresh one, and a rank that opened the stale one first lets go of it and waits for
// the fresh one. A segment whose creator lives belongs to another job of the same name: that
// is an error, not something to take over.
//
// Owners. A segment is this user's, mode 0600: one that belongs to another user (made first
// under this job's name), or that grants group or others anything, is never joined nor
// replaced; every rank fails at once with the segment, its owner and the fix named.
#include <fcntl.h>
#include <pthread.h>
#include <pwd.h>
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
#include "../core/settings.hpp"
#include "../core/deliver.hpp"
#include "shm/config.hpp"
#include "shm/layout.hpp"
#include "shm/liveness.hpp"
#include "shm/pool.hpp"
#include "tcp/auth.hpp"
#include "shm/segment.hpp"
#include "engine.hpp"

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
    job_ = job;
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

  /// "/collx-<uid>-<job>" with anything but [A-Za-z0-9._-] replaced, and "-<fingerprint>" of
  /// COLLX_JOB_TOKEN when set (a name another user cannot know in advance).
  static std::string segment_name(const std::string& job) {
    std::string s = "/collx-" + std::to_string(::geteuid()) + "-";
    for (char c : job.substr(0, 180)) s += (std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_') ? c : '_';
    if (const std::string t = detail::env_string("COLLX_JOB_TOKEN"); !t.empty()) s += "-" + tcp_auth::fingerprint(t);
    return s;
  }

  /// Splits (core/split_plan.hpp): the new communicator's segment, of its size, named after this
  /// one's and the split's id, made as a job's is (its rank 0 creates it, the others join).
  split_offer prepare_split() { return {}; }
  shm split(const split_plan& p, split_offer&&) const {
    const members_of from{this, &p.members, true};
    return shm(job_ + "." + p.id, p.rank, p.size, cfg_, &from);
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
        return shm(job_ + "." + q.id, mine, int(members.size()), cfg_, &from);
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
      rank_ = o.rank_; n_ = o.n_; cfg_ = o.cfg_; job_ = std::move(o.job_); name_ = std::move(o.name_); L_ = o.L_;
      ino_ = o.ino_; dev_ = o.dev_;
      base_ = o.base_; bytes_ = o.bytes_; left_ = o.left_; aborted_ = o.aborted_; cma_ = o.cma_; spin_ = o.spin_;
      keeper_ = std::move(o.keeper_);
      pool_ = std::move(o.pool_);
      st_ = std::move(o.st_);
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

  /// The engine's view of this transport: f(channel, step state), after the checks a step makes
  /// first (engine.hpp: exchange, and exchange_pair for a step shared with another transport).
  template <class F>
  void engage(const call_info& call, F&& f) {
    check_live(call);
    f(*this, st_);
  }
  void exchange(std::span<const send_desc> sends, std::span<const recv_desc> recvs, const exchange_context& ctx) {
    engage(*ctx.call, [&](auto& c, auto& s) { engine::exchange(c, s, sends, recvs, ctx); });
  }

  /// Receive from any source (collectives/p2p.hpp, recv_any): waits until the channel from one
  /// of `peers` holds a point-to-point message of this communicator at its head (its first
  /// chunk's line is posted), and returns that peer (the first in `peers` when several do).
  /// Nothing is taken.
  int probe(std::span<const int> peers, const call_info& call) {
    check_live(call);
    return engine::wait_any(*this, peers, call);
  }

  // ---- the channel (transport/engine.hpp; defined in shm/channel.hpp) --------------------------
  struct send_state {
    std::size_t off = 0;
    bool started = false;
    bool awaiting_ack = false;  // single copy or synchronous: posted, waiting for the receiver to take it
    std::uint32_t ack_at = 0;   // the `consumed` count that acknowledges it (any value: counters wrap)
  };
  struct recv_state {
    std::size_t off = 0;
    bool started = false;
  };
  using step = engine::step<send_state, recv_state>;
  using token = std::uint32_t;
  void open(step& s);
  engine::moved try_send(step& s, std::size_t i);
  engine::moved try_recv(step& s, std::size_t i);
  bool ready(const step& s);
  bool stalled(step& s);
  bool hold(step& s);
  token arm() const noexcept { return me().doorbell.word.load(std::memory_order_seq_cst); }
  void sleep(const step& s, token t, std::chrono::nanoseconds d) {
    engine::futex_sleep(me().doorbell, t, true, d, [&] { return ready(s); });
  }
  void sleep_any(std::span<const int>, token t, std::chrono::nanoseconds d) {
    engine::futex_sleep(me().doorbell, t, true, d, [] { return false; });
  }
  engine::waiting spinning() const noexcept { return {spin_, std::chrono::nanoseconds(0), detail::kYieldIterations}; }
  engine::fate fate_of(int p);
  std::string why(int p) const;
  int failed_rank() const noexcept;
  std::string failure(int f) const;
  const char* waiting_for(const step& s, bool send, std::size_t i) const;
  int probe_head(std::span<const int> peers, const call_info& call, bool slow);

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

  bool crowded() const noexcept { return spin_ < detail::kSpinIterations; }
  std::uint32_t consumed_of(int peer) const { return ctl(rank_, peer).consumed.load(std::memory_order_acquire); }
  /// Room for one more line in the channel to `peer` (its buffers are reclaimed on the way).
  bool line_room(int peer, std::uint32_t posted);
  static shm_detail::send_pool::kind kind_of(std::size_t nb) {
    return nb <= kInline ? shm_detail::send_pool::kind::inline_line
           : nb <= kSmallBytes ? shm_detail::send_pool::kind::small
                               : shm_detail::send_pool::kind::data;
  }
  /// Posts the next `nb` bytes of send i in buffer b.
  void post(step& s, std::size_t i, std::size_t nb, std::uint16_t b);

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
  void check_owner(const struct stat& st) const;
  void check_name_owner() const;
  void unlink_own() noexcept;

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

  /// Rank p is gone (single_copy.hpp): the engine's words for it.
  [[noreturn]] void report_gone(int p, const call_info& call) const {
    call.fail(errc::peer_lost, "lost " + call.peer(p) + ": " + why(p));
  }

  int rank_ = 0, n_ = 1;
  config cfg_;
  std::string job_;   // as given (a split's or shrink's segment is named after it)
  std::string name_;
  ino_t ino_ = 0;     // the segment this rank mapped: a name is unlinked only while it is still this one's
  dev_t dev_ = 0;
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
  // the step being run (transport/engine.hpp), and what open() works out for it
  step st_;
  std::size_t elem_ = 1, chunk_ = 0;
  std::uint64_t hash_ = 0;
  std::uint32_t sig_at_ = 0;
  bool single_copy_now_ = false;
  std::chrono::steady_clock::time_point busy_since_{};  // hold()
  bool cma_ = false;                    // every rank can read every peer's memory
  int spin_ = detail::kSpinIterations;  // detail::spin_for(ranks)
  std::vector<std::byte> bounce_;       // single-copy receives that reduce: read here, then combine
};

}  // namespace collx::transport

// Defined apart, by responsibility: joining and leaving the segment, the channel the progress
// engine drives, and single-copy reads.
#include "shm/attach.hpp"
#include "shm/channel.hpp"
#include "shm/single_copy.hpp"
