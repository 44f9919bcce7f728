#pragma once
// Ranks as processes for the device plans: the memory of each rank that its peers map, and how
// it gets to them.
//
// A plan's walk (device/plan.hpp) reads a peer's region (its inboxes, acks: layout.hpp) and the
// buffers a peer posts its messages from. Threads of one process share an address space; processes
// do not, so each rank *exports* the memory its peers must reach and each peer *imports* it: maps
// it into its own space, at an address of its own. What exporting and importing mean is the
// memory backend's (`Backend` below): device memory through CUDA's VMM API, a file descriptor per
// allocation passed over a Unix socket, or cudaIpc handles (cuda/ipc.cuh); host memory through
// memfd in the tests (tests/ipc_host.hpp), which run this very code across real processes.
//
// peer_group<Backend> is made by every rank of a host communicator (shm or tcp: the
// bootstrap, which it keeps) and:
//   - draws a nonce and binds a Unix datagram socket per rank in the abstract namespace
//     (fd_channel), through which descriptors travel (SCM_RIGHTS);
//   - maps the job block (layout.hpp: the abort flag, failure reasons, statuses), a memfd rank 0
//     makes and passes to the others: nothing named is left behind when a process dies;
//   - allocates each rank's region, exports it, imports every peer's, and writes the rank's
//     tables of pointers into the peers' regions;
//   - opens a pidfd on each peer's process, so a waiting rank sees a peer die at once instead of
//     at its deadline.
// Then, at every call, exchange() sends every rank's signature and the buffers it posts from
// through one all_gather on the bootstrap: a mismatched call is caught there, before any data
// moves, naming both calls, and each rank maps the peers' buffers it has not mapped yet.
//
// What a peer has mapped of a rank's memory is kept by one rule that every rank can compute
// alone (lru_ids: the last kMappedPerPeer allocations a rank posted from, most recent kept):
// the exporter knows, without asking, when its peers import an allocation (it passes the
// descriptor then) and when they drop one (they unmap it: an allocation the user freed does not
// stay mapped for ever).
//
// A backend supplies (every call may throw collx::error):
//   owned allocate(std::size_t bytes)               memory of this rank its peers may map; zeroed
//   void release(owned&) noexcept
//   alloc_desc describe(const std::byte* p, std::size_t bytes, std::uint64_t& offset)
//                                                   the allocation holding [p, p + bytes), and p's
//                                                   offset in it; kind none: it cannot be exported
//   int export_fd(const alloc_desc&)                kind fd: a new descriptor of it (closed by the caller)
//   std::byte* import(const alloc_desc&, int fd)    maps a peer's allocation (fd -1 for kind opaque)
//   void unmap(std::byte* base, const alloc_desc&) noexcept
//   void quiesce() noexcept (optional)              waits for this rank's queued work, before an
//                                                   unmap (cuda: stream-ordered calls in flight)
//   void write(std::byte* dst, const void* src, std::size_t bytes)    host memory into owned memory
//   void* register_host(void* p, std::size_t bytes) the address kernels reach host memory p at
//   void unregister_host(void* p) noexcept
//   std::array<std::uint8_t, 16> device_id()         which device this rank's memory is on
//   const char* kind_name()
#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "../collectives/all_gather.hpp"
#include "../collectives/barrier.hpp"
#include "../comm/communicator.hpp"
#include "../core/wait.hpp"
#include "../core/error.hpp"
#include "../core/call_info.hpp"
#include "../transport/any.hpp"
#include "../device/job.hpp"
#include "../device/layout.hpp"

namespace collx::device::ipc {

/// How an allocation reaches a peer: not at all (none), as a file descriptor passed over the
/// ranks' Unix sockets (fd: VMM's POSIX handle, a memfd), or as bytes the peer opens (opaque:
/// a cudaIpcMemHandle_t).
enum class handle_kind : std::uint8_t { none = 0, fd = 1, opaque = 2 };

/// An allocation as its exporter describes it to its peers. Trivially copyable: it travels in
/// the bootstrap's all_gather.
struct alloc_desc {
  std::uint64_t id = 0;    // unique in the exporter's process for the allocation's life; 0: none
  std::uint64_t size = 0;  // bytes a peer maps
  handle_kind kind = handle_kind::none;
  std::uint8_t pad_[7] = {};
  std::array<std::uint8_t, 64> handle{};  // opaque: the handle; fd: the backend's own notes
};

/// The most allocations of one rank a peer keeps mapped besides the regions (lru_ids).
inline constexpr std::size_t kMappedPerPeer = 16;

/// The rule for what a peer keeps mapped of a rank's allocations: the last `cap` ones the rank
/// posted from. Every rank computes it alike from the descriptions the all_gather brings, so
/// the exporter knows when its peers import (it passes the descriptor then) and when they drop.
class lru_ids {
 public:
  explicit lru_ids(std::size_t cap = kMappedPerPeer) : cap_(cap) {}
  /// Uses id: true when it was not kept (it is now); `evicted` gets the id that made room, or 0.
  bool touch(std::uint64_t id, std::uint64_t& evicted) {
    evicted = 0;
    const auto it = std::find(v_.begin(), v_.end(), id);
    if (it != v_.end()) {
      v_.erase(it);
      v_.push_back(id);
      return false;
    }
    if (v_.size() == cap_) {
      evicted = v_.front();
      v_.erase(v_.begin());
    }
    v_.push_back(id);
    return true;
  }
  bool has(std::uint64_t id) const { return std::find(v_.begin(), v_.end(), id) != v_.end(); }
  std::size_t size() const noexcept { return v_.size(); }

 private:
  std::size_t cap_;
  std::vector<std::uint64_t> v_;  // least recently used first
};

/// One Unix datagram socket per rank, in the abstract namespace (nothing on disk, gone with the
/// process), named by the group's nonce and the rank: descriptors travel through it with
/// SCM_RIGHTS, each with the id of what it maps. Datagrams between local sockets are reliable
/// and ordered; one that arrives before it is asked for waits in the stash.
class fd_channel {
 public:
  fd_channel() = default;
  fd_channel(const fd_channel&) = delete;
  fd_channel& operator=(const fd_channel&) = delete;
  ~fd_channel() {
    for (const stashed& s : stash_) ::close(s.fd);
    if (sock_ >= 0) ::close(sock_);
  }

  void open(std::uint64_t nonce, int rank) {
    nonce_ = nonce;
    rank_ = rank;
    sock_ = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (sock_ < 0) throw error(errc::transport_error, std::string("collx ipc: socket: ") + std::strerror(errno));
    socklen_t len = 0;
    const sockaddr_un a = address(rank, len);
    if (::bind(sock_, reinterpret_cast<const sockaddr*>(&a), len) != 0)
      throw error(errc::transport_error, "collx ipc: rank " + std::to_string(rank) + " cannot bind its socket @" + (a.sun_path + 1) +
                                             ": " + std::strerror(errno));
  }

  /// Passes fd (kept open here: the caller closes it) to rank `to`, tagged with id.
  void send(int to, std::uint64_t id, int fd, std::chrono::steady_clock::time_point deadline) {
    header h{nonce_, rank_, 0, id};
    iovec io{&h, sizeof h};
    alignas(cmsghdr) char ctl[CMSG_SPACE(sizeof(int))] = {};
    msghdr m{};
    socklen_t len = 0;
    sockaddr_un a = address(to, len);
    m.msg_name = &a;
    m.msg_namelen = len;
    m.msg_iov = &io;
    m.msg_iovlen = 1;
    m.msg_control = ctl;
    m.msg_controllen = sizeof ctl;
    cmsghdr* c = CMSG_FIRSTHDR(&m);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &fd, sizeof fd);
    for (;;) {
      if (::sendmsg(sock_, &m, MSG_NOSIGNAL) == ssize_t(sizeof h)) return;
      const int e = errno;
      if (e == EINTR) continue;
      if (e != EAGAIN && e != EWOULDBLOCK)
        throw error(e == ECONNREFUSED || e == ENOENT ? errc::peer_lost : errc::transport_error,
                    "collx ipc: rank " + std::to_string(rank_) + " cannot pass a descriptor to rank " + std::to_string(to) + ": " +
                        std::strerror(e) + (e == ECONNREFUSED ? " (its socket is gone: its process ended)" : ""));
      if (std::chrono::steady_clock::now() >= deadline)
        throw error(errc::timeout, "collx ipc: rank " + std::to_string(rank_) + " timed out passing a descriptor to rank " +
                                       std::to_string(to) + " (its socket's queue stays full)");
      // Its queue is full (net.unix.max_dgram_qlen, 10 by default: a rank that every peer
      // passes two descriptors at once fills it). Meanwhile this rank's own queue is read into
      // the stash, or two ranks each waiting to pass the other one would wait for ever.
      drain();
      // (POLLOUT on an unconnected datagram socket says nothing of the peer's queue)
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }

  /// The descriptor rank `from` passed with id, waiting for it until the deadline; check() runs
  /// every few milliseconds meanwhile (it throws when the peer is gone).
  int receive(int from, std::uint64_t id, std::chrono::steady_clock::time_point deadline, const std::function<void()>& check) {
    for (;;) {
      for (std::size_t i = 0; i < stash_.size(); ++i)
        if (stash_[i].from == from && stash_[i].id == id) {
          const int fd = stash_[i].fd;
          stash_.erase(stash_.begin() + std::ptrdiff_t(i));
          return fd;
        }
      if (read_one()) continue;
      try {
        check();  // throws when `from` is gone
      } catch (...) {
        // (It may have sent the descriptor just before it went: looked for again, as
        // detail::gone_unready has it.)
        if (read_one()) continue;
        throw;
      }
      if (std::chrono::steady_clock::now() >= deadline)
        throw error(errc::timeout, "collx ipc: rank " + std::to_string(rank_) + " timed out waiting for rank " + std::to_string(from) +
                                       " to pass the descriptor of its allocation " + std::to_string(id));
      pollfd p{sock_, POLLIN, 0};
      ::poll(&p, 1, 10);
    }
  }

 private:
  /// Everything queued on this rank's socket, into the stash.
  void drain() {
    while (read_one()) {
    }
  }
  /// One datagram into the stash (one not of this group is dropped); false when none is queued.
  bool read_one() {
    for (;;) {
      header h{};
      iovec io{&h, sizeof h};
      alignas(cmsghdr) char ctl[CMSG_SPACE(sizeof(int))] = {};
      msghdr m{};
      m.msg_iov = &io;
      m.msg_iovlen = 1;
      m.msg_control = ctl;
      m.msg_controllen = sizeof ctl;
      const ssize_t k = ::recvmsg(sock_, &m, MSG_CMSG_CLOEXEC);
      if (k < 0) {
        const int e = errno;
        if (e == EINTR) continue;
        if (e != EAGAIN && e != EWOULDBLOCK)
          throw error(errc::transport_error, "collx ipc: rank " + std::to_string(rank_) + " cannot read its socket: " + std::strerror(e));
        return false;
      }
      int fd = -1;
      for (cmsghdr* c = CMSG_FIRSTHDR(&m); c != nullptr; c = CMSG_NXTHDR(&m, c))
        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS && c->cmsg_len >= CMSG_LEN(sizeof(int)))
          std::memcpy(&fd, CMSG_DATA(c), sizeof fd);
      if (k != ssize_t(sizeof h) || h.nonce != nonce_ || fd < 0 || (m.msg_flags & MSG_CTRUNC) != 0) {  // not ours: dropped
        if (fd >= 0) ::close(fd);
        return true;
      }
      stash_.push_back({h.from, h.id, fd});
      return true;
    }
  }

  struct header {
    std::uint64_t nonce;
    std::int32_t from;
    std::int32_t pad;
    std::uint64_t id;
  };
  struct stashed {
    int from;
    std::uint64_t id;
    int fd;
  };
  sockaddr_un address(int rank, socklen_t& len) const {
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    const int k = std::snprintf(a.sun_path + 1, sizeof a.sun_path - 1, "collx-ipc-%016llx-%d", static_cast<unsigned long long>(nonce_), rank);
    len = socklen_t(offsetof(sockaddr_un, sun_path) + 1 + std::size_t(k));
    return a;
  }
  int sock_ = -1;
  std::uint64_t nonce_ = 0;
  int rank_ = 0;
  std::vector<stashed> stash_;
};

/// A buffer of this rank for one call: its allocation and where in it the buffer starts.
struct buffer_ref {
  alloc_desc a;
  std::uint64_t offset = 0;
};

/// A call's in and out as its plan must walk them between processes: what the plan posts from
/// must be memory the peers can map, and what cannot be exported (`exportable(p, bytes)`
/// false: host memory from malloc, device memory of a pool that cannot export) is staged in
/// memory of the transport's own (`stage(slot, bytes)`: slot 0 for in, 1 for out), copied there
/// before the walk (`before`) and back after it (`after`). An in and out that overlap (in place)
/// are staged as one. `bufs` (none, in, out, tmp) are rebased onto the staging memory; `extent`
/// and `posts_from` are the plan's (device/plan.hpp). Returns whether anything was staged.
template <class Exportable, class Stage>
bool stage_buffers(std::byte* (&bufs)[4], const std::uint64_t (&extent)[4], unsigned posts_from, Exportable&& exportable,
                   Stage&& stage, std::vector<local_copy_part>& before, std::vector<local_copy_part>& after) {
  before.clear();
  after.clear();
  std::byte *in = bufs[1], *out = bufs[2];
  const std::uint64_t lin = in ? extent[1] : 0, lout = out ? extent[2] : 0;
  const bool need_in = (posts_from & 2u) != 0 && lin != 0 && !exportable(in, lin);
  const bool need_out = (posts_from & 4u) != 0 && lout != 0 && !exportable(out, lout);
  if (!need_in && !need_out) return false;
  const bool overlap = lin != 0 && lout != 0 && in < out + lout && out < in + lin;
  if (overlap) {
    std::byte* lo = std::min(in, out);
    std::byte* hi = std::max(in + lin, out + lout);
    std::byte* s = stage(1, std::size_t(hi - lo));
    before.push_back({s, lo, std::size_t(hi - lo)});
    after.push_back({out, s + (out - lo), std::size_t(lout)});
    bufs[1] = s + (in - lo);
    bufs[2] = s + (out - lo);
    return true;
  }
  if (need_in) {
    std::byte* s = stage(0, std::size_t(lin));
    before.push_back({s, in, std::size_t(lin)});
    bufs[1] = s;
  }
  if (need_out) {  // (its content too: a plan may combine into what the caller left there)
    std::byte* s = stage(1, std::size_t(lout));
    before.push_back({s, out, std::size_t(lout)});
    after.push_back({out, s, std::size_t(lout)});
    bufs[2] = s;
  }
  return true;
}

/// Where each peer's buffers are in this process, per call: [rank][buf - 1] for buf in (in, out,
/// tmp); 0 where a rank posts nothing from that buffer.
using peer_table = std::vector<std::uint64_t>;

template <class Backend>
class peer_group {
 public:
  using owned = typename Backend::owned;

  /// Every rank of `boot` makes it at once (a collective call on boot). Throws collx::error.
  peer_group(communicator<transport::any> boot, Backend be, std::chrono::nanoseconds timeout)
      : boot_(std::move(boot)), be_(std::move(be)), timeout_(timeout), rank_(boot_.rank()), n_(boot_.size()),
        lay_{boot_.size()}, peers_(std::size_t(n_)) {
    try {
      make();
    } catch (...) {
      release();
      throw;
    }
  }
  peer_group(const peer_group&) = delete;
  peer_group& operator=(const peer_group&) = delete;
  ~peer_group() { release(); }

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return n_; }
  Backend& backend() noexcept { return be_; }
  communicator<transport::any>& boot() noexcept { return boot_; }
  const region_layout& layout() const noexcept { return lay_; }
  /// This rank's region (the backend's address: device memory for cuda).
  std::byte* region() const noexcept { return mine_.p; }
  /// Rank q's region as this process maps it (this rank's own for q == rank()).
  std::byte* region_of(int q) const noexcept { return q == rank_ ? mine_.p : peers_[std::size_t(q)].region; }
  /// The job block: as the host reads it, and as kernels do.
  void* job() const noexcept { return job_; }
  void* job_device() const noexcept { return job_dev_; }
  job_rank& job_of(int r) const noexcept { return jv_.rank(r); }
  /// Ranks of the group whose memory is on this rank's device (they share its multiprocessors).
  int sharing() const noexcept { return sharing_; }
  /// The process of rank r.
  int pid_of(int r) const noexcept { return peers_[std::size_t(r)].pid; }

  // ---- failure (job.hpp) ------------------------------------------------------------------

  const job_view& jobs() const noexcept { return jv_; }
  void fail(int r, const std::string& why) noexcept { jv_.fail(r, why); }
  bool aborted() const noexcept { return jv_.aborted(); }
  int first_failed() const noexcept { return jv_.first_failed(); }
  bool failed(int r) const noexcept { return jv_.failed(r); }
  bool left(int r) const noexcept { return jv_.left(r); }
  std::string why(int r) const { return jv_.why(r); }
  detail::waitable& doorbell(int r) const noexcept { return jv_.doorbell(r); }

  /// A peer whose process has ended without leaving the group in order (its pidfd is
  /// readable: killed, or crashed), or -1. One found so is marked failed here, with that as its
  /// reason, so every rank names the same cause. (A rank that left in order and ended is no
  /// failure: a rank that waits for it learns that it left.)
  int peer_gone() noexcept {
    for (int q = 0; q < n_; ++q) {
      if (q == rank_ || !gone(q) || left(q)) continue;
      if (!failed(q)) fail(q, "its process (pid " + std::to_string(pid_of(q)) + ") ended");
      return q;
    }
    return -1;
  }

  /// After this rank failed (the abort flag is up, so every peer's kernel ends at its next
  /// wait): waits until no peer's kernel is left that may read this rank's memory, for at most
  /// `limit` (a peer whose process is gone reads nothing).
  bool wait_peers_idle(std::chrono::nanoseconds limit) noexcept {
    return jv_.wait_idle_but(rank_, limit, [&](int q) { return gone(q); });
  }

  // ---- calls ----------------------------------------------------------------------------

  /// What each rank tells the others at a call: its signature and the buffers it posts from.
  struct call_record {
    call_signature sig;
    buffer_ref bufs[3];  // in, out, tmp: kind none where it posts nothing from it
  };

  /// The call's exchange: every rank's record through one all_gather on the bootstrap; a rank
  /// whose call differs fails it here (mismatch, naming both calls); then each rank passes the
  /// descriptors its peers have not mapped yet, maps the peers' buffers it has not mapped yet,
  /// and fills `table` ([n][3]) with where each rank's buffers are in this process.
  void exchange(const call_info& call, const buffer_ref (&mine)[3], peer_table& table) {
    call_record me{call.sig, {mine[0], mine[1], mine[2]}};
    std::vector<call_record> all(static_cast<std::size_t>(n_));
    try {
      all_gather(boot_, std::span<const std::byte>(reinterpret_cast<const std::byte*>(&me), sizeof me),
                 std::span<std::byte>(reinterpret_cast<std::byte*>(all.data()), all.size() * sizeof(call_record)), algo::automatic{});
    } catch (const error& e) {
      call.fail(e.code() == make_error_code(errc::timeout) ? errc::timeout : errc::peer_lost,
                std::string("could not learn where its peers' buffers are (the bootstrap's all_gather failed): ") + e.what());
    }
    for (int q = 0; q < n_; ++q)
      if (q != rank_) call.check_match(q, all[std::size_t(q)].sig, 0, 0);
    const auto deadline = std::chrono::steady_clock::now() + call.timeout;
    // Ours first: the descriptors of what the peers will map now, to every peer (datagrams:
    // this never waits for a peer to read), then theirs.
    // An opaque handle names an allocation without holding it (a path, as a cudaIpcMemHandle_t
    // does): its owner, its call done, may free it before a slower peer has opened it. So when
    // an opaque allocation is mapped fresh in this call (every rank knows which: the rule
    // above), the ranks meet once more after mapping, before any may return.
    bool fresh_opaque = false;
    for (const buffer_ref& b : mine) {
      if (b.a.id == 0) continue;
      std::uint64_t evicted = 0;
      const bool fresh = exported_.touch(b.a.id, evicted);
      fresh_opaque = fresh_opaque || (fresh && b.a.kind == handle_kind::opaque && n_ > 1);
      if (!fresh || b.a.kind != handle_kind::fd) continue;
      const int fd = be_.export_fd(b.a);
      try {
        for (int q = 0; q < n_; ++q)
          if (q != rank_) chan_.send(q, b.a.id, fd, deadline);
      } catch (...) {
        ::close(fd);
        throw;
      }
      ::close(fd);
    }
    table.assign(std::size_t(n_) * 3, 0);
    for (int q = 0; q < n_; ++q) {
      const call_record& r = all[std::size_t(q)];
      for (int b = 0; b < 3; ++b) {
        const buffer_ref& x = r.bufs[b];
        if (x.a.id == 0) continue;
        std::byte* base = q == rank_ ? nullptr : mapped(call, q, x.a, deadline, fresh_opaque);
        table[std::size_t(q) * 3 + std::size_t(b)] = q == rank_ ? 0 : reinterpret_cast<std::uint64_t>(base) + x.offset;
      }
    }
    if (fresh_opaque) {
      try {
        barrier(boot_);
      } catch (const error& e) {
        call.fail(e.code() == make_error_code(errc::timeout) ? errc::timeout : errc::peer_lost,
                  std::string("could not agree that every peer has mapped the buffers (the bootstrap's barrier failed): ") + e.what());
      }
    }
  }

 private:
  struct mapping {
    alloc_desc a;
    std::byte* base = nullptr;
  };
  struct peer {
    alloc_desc region_desc;
    std::byte* region = nullptr;
    int pid = 0;
    int pidfd = -1;
    lru_ids kept;
    std::map<std::uint64_t, mapping> maps;  // by id: what `kept` holds
  };
  struct hello {
    std::uint64_t nonce;
    std::int32_t pid;
    std::int32_t pad;
    std::uint64_t pid_ns;  // the pid namespace's inode: a pidfd means something only within one
    std::array<std::uint8_t, 16> device;
  };
  static constexpr std::uint64_t kJobId = ~std::uint64_t(0);

  bool gone(int q) const noexcept {
    const int fd = peers_[std::size_t(q)].pidfd;
    if (fd < 0) return false;
    pollfd p{fd, POLLIN, 0};
    return ::poll(&p, 1, 0) == 1 && (p.revents & POLLIN) != 0;
  }

  template <class T>
  void gather(const T& mine, std::vector<T>& all) {
    all.resize(std::size_t(n_));
    all_gather(boot_, std::span<const std::byte>(reinterpret_cast<const std::byte*>(&mine), sizeof(T)),
               std::span<std::byte>(reinterpret_cast<std::byte*>(all.data()), all.size() * sizeof(T)), algo::automatic{});
  }

  /// q's allocation `a` as this process maps it: mapped now if not yet (the descriptor comes
  /// over the socket for kind fd), the least recently used one of q's dropped when past the cap.
  /// `fresh_opaque` is set when an opaque allocation is new to this rank (see exchange).
  std::byte* mapped(const call_info& call, int q, const alloc_desc& a, std::chrono::steady_clock::time_point deadline,
                    bool& fresh_opaque) {
    peer& p = peers_[std::size_t(q)];
    std::uint64_t evicted = 0;
    const bool fresh = p.kept.touch(a.id, evicted);
    fresh_opaque = fresh_opaque || (fresh && a.kind == handle_kind::opaque);
    if (evicted != 0) {
      if (auto it = p.maps.find(evicted); it != p.maps.end()) {
        // (a kernel still queued from an earlier call may read it: every rank has queued its
        // kernels of the calls before this one, so this wait ends)
        if constexpr (requires { be_.quiesce(); }) be_.quiesce();
        be_.unmap(it->second.base, it->second.a);
        p.maps.erase(it);
      }
    }
    if (!fresh) {
      if (auto it = p.maps.find(a.id); it != p.maps.end()) return it->second.base;
    }
    if (a.kind == handle_kind::none)
      call.fail(errc::invalid_argument, call.peer(q) + " posts from memory it cannot export (backend " + be_.kind_name() + ")");
    int fd = -1;
    if (a.kind == handle_kind::fd) fd = chan_.receive(q, a.id, deadline, [&] { check_peer(call, q); });
    std::byte* base = nullptr;
    try {
      base = be_.import(a, fd);
    } catch (...) {
      if (fd >= 0) ::close(fd);
      throw;
    }
    if (fd >= 0) ::close(fd);
    p.maps[a.id] = {a, base};
    return base;
  }

  void check_peer(const call_info& call, int q) {
    if (gone(q)) call.fail(errc::peer_lost, call.peer(q) + " is gone: its process (pid " + std::to_string(pid_of(q)) + ") ended");
    if (left(q)) call.fail(errc::peer_lost, call.peer(q) + " has left the communicator while this rank waited for it");
    if (aborted() && first_failed() >= 0 && first_failed() != rank_)
      call.fail(errc::peer_lost, "the job was aborted: " + call.peer(first_failed()) + " failed: " + why(first_failed()));
  }

  void make() {
    // 1. who is where, and the nonce (rank 0's)
    hello h{};
    std::random_device rd;
    h.nonce = (std::uint64_t(rd()) << 32) ^ rd() ^ std::uint64_t(::getpid());
    h.pid = ::getpid();
    struct stat st{};
    h.pid_ns = ::stat("/proc/self/ns/pid", &st) == 0 ? std::uint64_t(st.st_ino) : 0;
    h.device = be_.device_id();
    std::vector<hello> all;
    gather(h, all);
    const std::uint64_t nonce = all[0].nonce;
    for (int q = 0; q < n_; ++q) {
      peer& p = peers_[std::size_t(q)];
      p.pid = all[std::size_t(q)].pid;
      sharing_ += all[std::size_t(q)].device == h.device;
      if (q != rank_ && h.pid_ns != 0 && all[std::size_t(q)].pid_ns == h.pid_ns) p.pidfd = int(::syscall(SYS_pidfd_open, p.pid, 0));
    }
    chan_.open(nonce, rank_);
    barrier(boot_);  // every socket is bound
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    auto check_boot = [] {};
    // 2. the job block: a memfd of rank 0's, passed to the others
    const std::size_t jb = (job_layout{n_}.bytes() + 4095) / 4096 * 4096;
    struct closer {
      int fd = -1;
      ~closer() {
        if (fd >= 0) ::close(fd);
      }
    } jfd;
    if (rank_ == 0) {
      jfd.fd = int(::syscall(SYS_memfd_create, "collx-job", MFD_CLOEXEC));
      if (jfd.fd < 0 || ::ftruncate(jfd.fd, off_t(jb)) != 0)
        throw error(errc::transport_error, std::string("collx ipc: cannot make the job block (memfd): ") + std::strerror(errno));
    } else {
      jfd.fd = chan_.receive(0, kJobId, deadline, check_boot);
    }
    void* j = ::mmap(nullptr, jb, PROT_READ | PROT_WRITE, MAP_SHARED, jfd.fd, 0);
    if (j == MAP_FAILED) throw error(errc::transport_error, std::string("collx ipc: cannot map the job block: ") + std::strerror(errno));
    job_ = j;
    job_bytes_ = jb;
    jv_ = job_view(job_, n_);
    if (rank_ == 0) {
      // Initialized before anyone has it: a peer that fails early (its fail() is the first
      // failure) must not have its mark wiped by this init, nor read rank 0 as the first failed.
      jv_.init();
      for (int q = 1; q < n_; ++q) chan_.send(q, kJobId, jfd.fd, deadline);
    }
    job_of(rank_).pid = ::getpid();
    job_dev_ = be_.register_host(job_, job_bytes_);
    registered_ = true;
    // 3. the regions: each rank's, exported to every peer
    mine_ = be_.allocate(lay_.bytes());
    std::uint64_t off = 0;
    const alloc_desc d = be_.describe(mine_.p, lay_.bytes(), off);
    if (d.kind == handle_kind::none || off != 0) throw error(errc::transport_error, "collx ipc: the backend cannot export its own memory");
    std::vector<alloc_desc> descs;
    gather(d, descs);
    if (d.kind == handle_kind::fd) {
      const int fd = be_.export_fd(d);
      try {
        for (int q = 0; q < n_; ++q)
          if (q != rank_) chan_.send(q, d.id, fd, deadline);
      } catch (...) {
        ::close(fd);
        throw;
      }
      ::close(fd);
    }
    for (int q = 0; q < n_; ++q) {
      if (q == rank_) continue;
      peer& p = peers_[std::size_t(q)];
      p.region_desc = descs[std::size_t(q)];
      const int fd = p.region_desc.kind == handle_kind::fd ? chan_.receive(q, p.region_desc.id, deadline, check_boot) : -1;
      try {
        p.region = be_.import(p.region_desc, fd);
      } catch (...) {
        if (fd >= 0) ::close(fd);
        throw;
      }
      if (fd >= 0) ::close(fd);
    }
    // 4. this rank's tables: in_from[q], out_to[q], acks_mine[q], acks_theirs[q]
    std::vector<std::uint64_t> t(4 * std::size_t(n_));
    for (int q = 0; q < n_; ++q) {
      const auto Q = std::size_t(q), N = std::size_t(n_);
      t[Q] = reinterpret_cast<std::uint64_t>(region_of(rank_) + lay_.inboxes() + Q * sizeof(inbox));                       // (q -> me), mine
      t[N + Q] = reinterpret_cast<std::uint64_t>(region_of(q) + lay_.inboxes() + std::size_t(rank_) * sizeof(inbox));       // (me -> q), q's
      t[2 * N + Q] = reinterpret_cast<std::uint64_t>(region_of(rank_) + lay_.acks() + Q * sizeof(ack));                     // (me -> q)'s taken, mine
      t[3 * N + Q] = reinterpret_cast<std::uint64_t>(region_of(q) + lay_.acks() + std::size_t(rank_) * sizeof(ack));        // (q -> me)'s taken, q's
    }
    be_.write(mine_.p + lay_.tables(), t.data(), t.size() * sizeof(std::uint64_t));
    barrier(boot_);  // every region is mapped by every peer, and the job block is set up
  }

  void release() noexcept {
    if (job_) jv_.leave(rank_);  // left in order, unless it failed
    for (int q = 0; q < n_; ++q) {
      peer& p = peers_[std::size_t(q)];
      for (auto& [id, m] : p.maps) be_.unmap(m.base, m.a);
      p.maps.clear();
      if (p.region) be_.unmap(p.region, p.region_desc);
      p.region = nullptr;
      if (p.pidfd >= 0) ::close(p.pidfd);
      p.pidfd = -1;
    }
    if (mine_.p) be_.release(mine_);
    if (registered_) be_.unregister_host(job_);
    registered_ = false;
    if (job_) ::munmap(job_, job_bytes_);
    job_ = nullptr;
  }

  communicator<transport::any> boot_;
  Backend be_;
  std::chrono::nanoseconds timeout_;
  int rank_, n_;
  region_layout lay_;
  std::vector<peer> peers_;
  fd_channel chan_;
  lru_ids exported_;
  owned mine_{};
  void* job_ = nullptr;
  job_view jv_;
  void* job_dev_ = nullptr;
  std::size_t job_bytes_ = 0;
  bool registered_ = false;
  int sharing_ = 0;
};

}  // namespace collx::device::ipc
