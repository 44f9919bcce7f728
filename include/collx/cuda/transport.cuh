#pragma once
// collx::cuda::transport: ranks are threads of one process, each bound to a CUDA device (several
// ranks may share one: tests, one-GPU machines), buffers are device memory, and a call runs as
// ONE kernel on the rank's stream that walks the rank's schedule lowered to a device plan
// (device/plan.hpp, cuda/plan_kernel.cuh). The plan is lowered and copied to the device once per
// cached schedule and element size (schedule::lowered); the buffers are the launch's arguments,
// so a plan serves every call of its shape whatever the buffers.
//
//   collx::cuda::launch_threads(4, [](auto& comm) {       // 4 ranks on device 0
//     float* grads = ...;                                   // device memory
//     collx::all_reduce(comm, std::span{grads, n}, collx::ops::sum{});
//   });
//
// Blocking calls return when the result is in place (the stream is synchronised); the error a
// kernel reports (plan_status) becomes the collx::error a host transport would throw: timeout or
// peer_lost naming the peer, mismatch with both sizes.
//
// The group's state: per ordered pair an inbox (posted counter and mailbox: on the receiver's
// device) and an ack (taken counter: on the sender's device), each rank's grid barrier counter
// and pair bases (device memory), and the abort flag and statuses (mapped host memory, which
// kernels poll and the host writes). Devices of different ranks reach each other through peer
// access, enabled when the group is made.
#if !defined(__CUDACC__)
#error "collx/cuda/*.cuh headers compile only under nvcc"
#endif
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "../communicator.hpp"
#include "../concepts.hpp"
#include "../device/plan.hpp"
#include "../error.hpp"
#include "../signature.hpp"
#include "../split_plan.hpp"
#include "plan_kernel.cuh"
#include "reduce.cuh"

namespace collx::cuda {

/// The memory_space of device buffers.
struct device_memory {};

/// Throws transport_error for a failed CUDA call, naming it.
inline void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw error(errc::transport_error, std::string("collx::cuda: ") + what + ": " + cudaGetErrorString(e));
}

/// Bytes a block moves at a time on the device.
inline constexpr std::uint64_t kDeviceChunk = 256 * 1024;

class group {
 public:
  /// n ranks; rank r on device devices[r % devices.size()] (default: every rank on device 0).
  explicit group(int n, std::vector<int> devices = {0})
      : n_(n), dev_(std::size_t(n)), regions_(std::size_t(n)), why_(std::size_t(n)), running_(new std::atomic<int>[std::size_t(n)]) {
    for (int r = 0; r < n; ++r) running_[std::size_t(r)].store(0);
    try {
      make(std::move(devices));
    } catch (...) {
      release();
      throw;
    }
  }
  ~group() { release(); }
  group(const group&) = delete;
  group& operator=(const group&) = delete;

 private:
  void release() noexcept {
    for (region& g : regions_)
      if (g.mem) {
        cudaFree(g.mem);
        g.mem = nullptr;
      }
    if (host_) cudaFreeHost(host_);
    host_ = nullptr;
  }
  void make(std::vector<int> devices) {
    if (devices.empty()) devices = {0};
    for (int r = 0; r < n_; ++r) dev_[std::size_t(r)] = devices[std::size_t(r) % devices.size()];
    // Peer access between every pair of distinct devices used.
    for (int a : devices)
      for (int b : devices)
        if (a != b) {
          int can = 0;
          check(cudaDeviceCanAccessPeer(&can, a, b), "cudaDeviceCanAccessPeer");
          if (!can) throw error(errc::transport_error, "collx::cuda: device " + std::to_string(a) + " cannot access device " + std::to_string(b));
          // A receiver raises the sender's `taken` counter with an atomic over the peer
          // mapping: a link that does not carry atomics (PCIe without them) would lose acks.
          int atomics = 0;
          check(cudaDeviceGetP2PAttribute(&atomics, cudaDevP2PAttrNativeAtomicSupported, a, b), "cudaDeviceGetP2PAttribute");
          if (!atomics)
            throw error(errc::transport_error, "collx::cuda: the link from device " + std::to_string(a) + " to device " + std::to_string(b) +
                                                   " does not carry atomic operations, which the acks of collx's device plans need");
          check(cudaSetDevice(a), "cudaSetDevice");
          const cudaError_t e = cudaDeviceEnablePeerAccess(b, 0);
          if (e != cudaSuccess && e != cudaErrorPeerAccessAlreadyEnabled) check(e, "cudaDeviceEnablePeerAccess");
          (void)cudaGetLastError();
          // Peer access does not reach stream-ordered allocations (cudaMallocAsync: the plans,
          // the scratch, and what users are told to allocate so): device b's kernels may read
          // what device a's default pool holds.
          cudaMemPool_t pool;
          check(cudaDeviceGetDefaultMemPool(&pool, a), "cudaDeviceGetDefaultMemPool");
          cudaMemAccessDesc d{};
          d.location.type = cudaMemLocationTypeDevice;
          d.location.id = b;
          d.flags = cudaMemAccessFlagsProtReadWrite;
          check(cudaMemPoolSetAccess(pool, &d, 1), "cudaMemPoolSetAccess");
        }
    // Mapped host memory: the abort flag, then one status per rank.
    check(cudaHostAlloc(&host_, sizeof(int) * 32 + sizeof(plan_status) * std::size_t(n_), cudaHostAllocMapped | cudaHostAllocPortable),
          "cudaHostAlloc");
    std::memset(host_, 0, sizeof(int) * 32 + sizeof(plan_status) * std::size_t(n_));
    // Each rank's region on its device: inboxes from every peer, acks of its messages to every
    // peer, its barrier counter, its bases, then the four pointer tables of plan_args.
    for (int r = 0; r < n_; ++r) {
      region& g = regions_[std::size_t(r)];
      check(cudaSetDevice(dev_[std::size_t(r)]), "cudaSetDevice");
      check(cudaMalloc(&g.mem, region_bytes()), "cudaMalloc (the group's counters)");
      check(cudaMemset(g.mem, 0, region_bytes()), "cudaMemset");
      int sms = 0;
      check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev_[std::size_t(r)]), "cudaDeviceGetAttribute");
      g.sms = sms;
    }
    const int n = n_;
    std::vector<void*> table(4 * std::size_t(n));
    for (int r = 0; r < n_; ++r) {
      for (int q = 0; q < n_; ++q) {
        table[std::size_t(q)] = inbox_at(q, r);                  // in_from[q]: (q -> r), on r
        table[std::size_t(n + q)] = inbox_at(r, q);              // out_to[q]: (r -> q), on q
        table[std::size_t(2 * n + q)] = ack_at(r, q);            // acks_mine[q]: (r -> q)'s taken, on r
        table[std::size_t(3 * n + q)] = ack_at(q, r);            // acks_theirs[q]: (q -> r)'s taken, on q
      }
      check(cudaSetDevice(dev_[std::size_t(r)]), "cudaSetDevice");
      check(cudaMemcpy(tables(r), table.data(), table.size() * sizeof(void*), cudaMemcpyHostToDevice), "cudaMemcpy");
    }
    for (int r = 0; r < n_; ++r)
      for (int q = 0; q < n_; ++q) regions_[std::size_t(r)].sharing += dev_[std::size_t(q)] == dev_[std::size_t(r)];
  }

 public:
  int size() const noexcept { return n_; }
  int device_of(int r) const noexcept { return dev_[std::size_t(r)]; }
  int sms(int r) const noexcept { return regions_[std::size_t(r)].sms; }
  /// The most blocks rank r's kernel may have when `per_sm` of its blocks fit on one
  /// multiprocessor: every block of every rank on the device must be resident at once
  /// (plan_kernel.cuh's grid barrier and the peers' waits), so they share the device.
  /// Ranks sharing a device may run different kernels at once (one rank is already in its next
  /// call), whose blocks need different resources: a block of headroom per rank absorbs what
  /// the multiprocessors' fragmentation takes.
  int max_blocks(int r, int per_sm) const noexcept {
    const region& g = regions_[std::size_t(r)];
    return std::max(1, g.sms * std::max(1, per_sm) / std::max(1, g.sharing) - (g.sharing > 1 ? 1 : 0));
  }
  /// Ranks on rank r's device.
  int sharing(int r) const noexcept { return regions_[std::size_t(r)].sharing; }

  // Layout of a rank's region.
  std::size_t region_bytes() const noexcept {
    return std::size_t(n_) * sizeof(inbox) + std::size_t(n_) * sizeof(ack) + 128 + 3 * std::size_t(n_) * sizeof(std::uint64_t) +
           4 * std::size_t(n_) * sizeof(void*) + 128;
  }
  inbox* inbox_at(int from, int to) const noexcept { return reinterpret_cast<inbox*>(regions_[std::size_t(to)].mem) + from; }
  ack* ack_at(int from, int to) const noexcept {
    return reinterpret_cast<ack*>(regions_[std::size_t(from)].mem + std::size_t(n_) * sizeof(inbox)) + to;
  }
  std::uint64_t* barrier(int r) const noexcept {
    return reinterpret_cast<std::uint64_t*>(regions_[std::size_t(r)].mem + std::size_t(n_) * (sizeof(inbox) + sizeof(ack)));
  }
  /// The value rank r's barrier counter had when its current (or next) launch began: kept beside
  /// the counter, on the device (a second transport for the rank finds it where it is).
  std::uint64_t* barrier_base(int r) const noexcept { return barrier(r) + 8; }
  std::uint64_t* bases(int r) const noexcept { return barrier(r) + 16; }
  void** tables(int r) const noexcept { return reinterpret_cast<void**>(bases(r) + 3 * std::size_t(n_)); }

  /// The group of a communicator split from this one (split_plan.hpp): every member asks for
  /// it, the first makes it (its ranks on the devices their parent ranks are on), the last
  /// takes it out of the registry. It has its own counters, abort flag and statuses.
  static std::shared_ptr<group> join_split(const std::shared_ptr<group>& parent, const split_plan& p) {
    return detail::join_split_group<group>(parent.get(), p, [&] {
      std::vector<int> devices;
      for (int m : p.members) devices.push_back(parent->device_of(m));
      return std::make_shared<group>(p.size, std::move(devices));
    });
  }

  /// The abort flag as kernels read (and raise) it, and the status of rank r (host and device
  /// addresses).
  int* abort_dev() const {
    int* d = nullptr;
    check(cudaHostGetDevicePointer(reinterpret_cast<void**>(&d), host_, 0), "cudaHostGetDevicePointer");
    return d;
  }
  plan_status* status_host(int r) const noexcept {
    return reinterpret_cast<plan_status*>(static_cast<char*>(host_) + 32 * sizeof(int)) + r;
  }
  plan_status* status_dev(int r) const {
    char* d = nullptr;
    check(cudaHostGetDevicePointer(reinterpret_cast<void**>(&d), host_, 0), "cudaHostGetDevicePointer");
    return reinterpret_cast<plan_status*>(d + 32 * sizeof(int)) + r;
  }

  /// Marks rank r failed (the first failure is the cause) and stops every kernel's waits.
  void fail(int r, const std::string& why) noexcept {
    {
      std::lock_guard lk(mu_);
      if (!why_[std::size_t(r)].empty()) return;
      why_[std::size_t(r)] = why.empty() ? std::string("failed") : why;
      if (first_ < 0) first_ = r;
    }
    std::atomic_ref<int>(*static_cast<int*>(host_)).store(1, std::memory_order_seq_cst);
  }
  int first_failed() const {
    std::lock_guard lk(mu_);
    return first_;
  }
  std::string why(int r) const {
    std::lock_guard lk(mu_);
    return why_[std::size_t(r)];
  }
  bool aborted() const noexcept { return std::atomic_ref<int>(*static_cast<int*>(host_)).load() != 0; }

  /// Rank r's kernel may be running (set before its launch, cleared once its stream has
  /// finished it): while it is, it may read its peers' buffers.
  void set_running(int r, bool on) noexcept { running_[std::size_t(r)].store(on ? 1 : 0, std::memory_order_seq_cst); }
  bool running(int r) const noexcept { return running_[std::size_t(r)].load(std::memory_order_seq_cst) != 0; }
  /// After rank r failed (the abort flag is up, so every peer's kernel ends at its next wait):
  /// waits until no peer's kernel is left that may read rank r's memory, so r may unwind and
  /// free its buffers (transport::planned's and inproc's rule), for at most `limit`.
  bool wait_peers_idle(int r, std::chrono::nanoseconds limit) const noexcept {
    const auto until = std::chrono::steady_clock::now() + limit;
    for (;;) {
      bool busy = false;
      for (int q = 0; q < n_; ++q) busy = busy || (q != r && running(q));
      if (!busy) return true;
      if (std::chrono::steady_clock::now() >= until) return false;
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

 private:
  struct region {
    char* mem = nullptr;
    int sms = 1;
    int sharing = 1;
  };
  int n_;
  std::vector<int> dev_;
  std::vector<region> regions_;
  void* host_ = nullptr;
  mutable std::mutex mu_;
  std::vector<std::string> why_;
  int first_ = -1;
  std::unique_ptr<std::atomic<int>[]> running_;
};

/// A plan lowered for the device: the host plan, and its arrays and per-peer totals copied to
/// device memory (freed with it, that is with the cached schedule it belongs to).
struct device_plan {
  device::plan host;
  void* mem = nullptr;
  device::plan_view view{};
  const std::uint64_t* totals = nullptr;
  std::uint64_t barriers = 0;
  int dev = 0;
  /// Allocated and freed stream-ordered (cudaMallocAsync / cudaFreeAsync on the calling
  /// thread's default stream): cudaMalloc and cudaFree may wait for the whole device, where
  /// other ranks' kernels wait for this rank, which would then wait out their deadline.
  device_plan(device::plan p, int device) : host(std::move(p)), barriers(barriers_of(host)), dev(device) {
    const std::size_t n = host.msgs_to.size();
    const std::size_t ops = host.ops.size() * sizeof(device::plan_op), phases = host.phases.size() * sizeof(device::plan_phase);
    const std::size_t tot = 3 * n * sizeof(std::uint64_t);
    std::vector<std::byte> staged(ops + phases + tot + 64);
    std::memcpy(staged.data(), host.ops.data(), ops);
    std::memcpy(staged.data() + ops, host.phases.data(), phases);
    std::vector<std::uint64_t> t;
    t.insert(t.end(), host.msgs_to.begin(), host.msgs_to.end());
    t.insert(t.end(), host.chunks_to.begin(), host.chunks_to.end());
    t.insert(t.end(), host.msgs_from.begin(), host.msgs_from.end());
    const std::size_t tat = (ops + phases + 7) / 8 * 8;
    std::memcpy(staged.data() + tat, t.data(), tot);
    check(cudaMallocAsync(&mem, staged.size(), cudaStreamPerThread), "cudaMallocAsync (a device plan)");
    const cudaError_t e = cudaMemcpyAsync(mem, staged.data(), staged.size(), cudaMemcpyHostToDevice, cudaStreamPerThread);
    const cudaError_t f = e == cudaSuccess ? cudaStreamSynchronize(cudaStreamPerThread) : e;
    if (f != cudaSuccess) {
      cudaFreeAsync(mem, cudaStreamPerThread);
      check(f, "copying a device plan");
    }
    auto* b = static_cast<std::byte*>(mem);
    view = {reinterpret_cast<const device::plan_op*>(b), reinterpret_cast<const device::plan_phase*>(b + ops),
            std::uint32_t(host.phases.size()), host.chunk};
    totals = reinterpret_cast<const std::uint64_t*>(b + tat);
  }
  device_plan(const device_plan&) = delete;
  device_plan& operator=(const device_plan&) = delete;
  ~device_plan() {
    if (!mem) return;
    int was = 0;
    cudaGetDevice(&was);
    cudaSetDevice(dev);
    cudaFreeAsync(mem, cudaStreamPerThread);
    cudaSetDevice(was);
  }
};

class transport {
 public:
  using transport_concept = transport_tag;
  using memory_space = device_memory;
  static constexpr const char* name = "cuda";

  transport(std::shared_ptr<group> g, int rank) : g_(std::move(g)), rank_(rank), dev_(g_->device_of(rank)) {
    check(cudaSetDevice(dev_), "cudaSetDevice");
    check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    abort_ = g_->abort_dev();
    status_ = g_->status_dev(rank_);
  }
  transport(transport&& o) noexcept
      : g_(std::move(o.g_)), rank_(o.rank_), dev_(o.dev_), stream_(std::exchange(o.stream_, nullptr)),
        tmp_(std::exchange(o.tmp_, nullptr)), tmp_bytes_(o.tmp_bytes_), pack_(std::exchange(o.pack_, nullptr)),
        pack_bytes_(o.pack_bytes_), abort_(o.abort_),
        status_(o.status_) {}
  transport(const transport&) = delete;
  transport& operator=(const transport&) = delete;
  transport& operator=(transport&&) = delete;
  ~transport() {
    if (tmp_) cudaFreeAsync(tmp_, stream_);
    if (pack_) cudaFreeAsync(pack_, stream_);
    if (stream_) {
      cudaStreamSynchronize(stream_);
      cudaStreamDestroy(stream_);
    }
  }

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return g_->size(); }
  int device() const noexcept { return dev_; }
  cudaStream_t stream() const noexcept { return stream_; }
  const char* kind() const noexcept { return "cuda"; }

  /// Fails this rank (every peer's kernel ends at its next wait), then waits for the peers'
  /// kernels to end before the caller unwinds: one may be reading this rank's buffers, which
  /// the unwinding frees (for at most kAbortReadWait: a peer whose host thread is stuck
  /// elsewhere cannot hold this rank forever).
  void abort(const std::string& why) noexcept {
    g_->fail(rank_, why);
    g_->wait_peers_idle(rank_, kAbortReadWait);
  }

  /// Splits (communicator::split): the members of a part share a new group, made by the first
  /// of them to come (cuda::group::join_split); nothing is exchanged beforehand.
  split_offer prepare_split() { return {}; }
  transport split(const split_plan& p, split_offer&&) const { return transport(group::join_split(g_, p), p.rank); }
  static constexpr std::chrono::seconds kAbortReadWait{2};

  /// Device memory of at least `bytes`, kept from call to call (a fused batch packs its parts
  /// into it: fuse.hpp); stream-ordered, as the scratch.
  std::byte* pack_buffer(std::size_t bytes) {
    if (bytes > pack_bytes_) {
      check(cudaSetDevice(dev_), "cudaSetDevice");
      void* old = std::exchange(pack_, nullptr);
      pack_bytes_ = 0;
      if (old) check(cudaFreeAsync(old, stream_), "cudaFreeAsync (the pack buffer)");
      check(cudaMallocAsync(&pack_, bytes, stream_), "cudaMallocAsync (the pack buffer)");
      pack_bytes_ = bytes;
    }
    return static_cast<std::byte*>(pack_);
  }

  /// Every part enqueued on the rank's stream, then one wait (a fused batch's packing: fuse.hpp).
  /// (A copy that cannot be enqueued fails the call once those before it are done: the caller
  /// may free their memory as it unwinds.)
  void copy_local(std::span<const local_copy_part> parts) {
    check(cudaSetDevice(dev_), "cudaSetDevice");
    for (const local_copy_part& p : parts) {
      if (p.bytes == 0) continue;
      if (const cudaError_t e = cudaMemcpyAsync(p.dst, p.src, p.bytes, cudaMemcpyDeviceToDevice, stream_); e != cudaSuccess) {
        cudaStreamSynchronize(stream_);
        check(e, "cudaMemcpyAsync");
      }
    }
    check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  }
  template <class E, class Op>
  void finalize(E* p, std::size_t count, int ranks) {
    if constexpr (has_finalize_v<Op, E>) {
      using D = device_type_t<E>;
      check(cudaSetDevice(dev_), "cudaSetDevice");
      check(cuda::finalize<D, Op>(reinterpret_cast<D*>(p), count, ranks, stream_, g_->sms(rank_)), "the finalize kernel");
      check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
    }
  }

  template <class E, class Op>
  void run_schedule(const call_info& call, const schedule& s, const E* in, E* out, const Op& op) {
    using D = device_type_t<E>;
    // Up while this call's kernel may run, on every path out. Raised before the abort flag is
    // read: a failing peer raises the flag before it reads this (both sequentially consistent),
    // so either this call sees the failure and launches nothing, or the peer waits for it.
    struct running_mark {
      group& g;
      int r;
      ~running_mark() { g.set_running(r, false); }
    };
    g_->set_running(rank_, true);
    const running_mark mark{*g_, rank_};
    if (g_->aborted()) {
      const int f = g_->first_failed();
      call.fail(errc::peer_lost, f == rank_ ? "this rank already failed: " + g_->why(f)
                                            : "the job was aborted: " + call.peer(f) + " failed: " + g_->why(f));
    }
    check(cudaSetDevice(dev_), "cudaSetDevice");
    const device_plan& p = s.lowered<device_plan>(lowering_key(sizeof(E)), [&] {
      return std::make_shared<const device_plan>(device::lower(s, size(), sizeof(E), kDeviceChunk), dev_);
    });
    const std::size_t tmp = s.tmp_elems() * sizeof(E);
    if (tmp > tmp_bytes_) {  // stream-ordered, as device_plan's (no wait for the whole device)
      void* old = std::exchange(tmp_, nullptr);
      tmp_bytes_ = 0;
      if (old) check(cudaFreeAsync(old, stream_), "cudaFreeAsync (scratch)");
      check(cudaMallocAsync(&tmp_, tmp, stream_), "cudaMallocAsync (scratch)");
      tmp_bytes_ = tmp;
    }
    plan_args a{};
    a.plan = p.view;
    a.bases = g_->bases(rank_);
    a.totals = p.totals;
    a.bufs[0] = nullptr;
    a.bufs[1] = reinterpret_cast<std::byte*>(const_cast<E*>(in));
    a.bufs[2] = reinterpret_cast<std::byte*>(out);
    a.bufs[3] = static_cast<std::byte*>(tmp_);
    void** t = g_->tables(rank_);
    const std::size_t n = std::size_t(size());
    a.in_from = reinterpret_cast<inbox* const*>(t);
    a.out_to = reinterpret_cast<inbox* const*>(t + n);
    a.acks_mine = reinterpret_cast<ack* const*>(t + 2 * n);
    a.acks_theirs = reinterpret_cast<ack* const*>(t + 3 * n);
    a.barrier = g_->barrier(rank_);
    a.barrier_base = g_->barrier_base(rank_);
    a.status = status_;
    a.abort = abort_;
    a.sig = call.sig.hash();
    a.timeout_ns = std::uint64_t(std::clamp<std::int64_t>(call.timeout.count(), 0, std::int64_t(1) << 62));
    a.rank = rank_;
    a.size = size();
    // Blocks: one per chunk of the largest operation, as many as fit beside the other ranks.
    std::uint64_t most = 0;
    for (const auto& o : p.host.ops) most = std::max(most, o.bytes);
    static const int per_sm = [] {  // of this very kernel: heavier ops fit fewer blocks
      int b = 0;
      check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, plan_kernel<D, Op>, kThreads, 0),
            "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
      return b;
    }();
    if (per_sm < 1 || g_->sharing(rank_) > g_->sms(rank_) * per_sm)
      call.fail(errc::invalid_argument, std::to_string(g_->sharing(rank_)) + " ranks share device " + std::to_string(dev_) +
                                            ", more than its kernels can run at once (" + std::to_string(g_->sms(rank_) * per_sm) + ")");
    const int blocks = int(std::min<std::uint64_t>(std::uint64_t(g_->max_blocks(rank_, per_sm)),
                                                   std::max<std::uint64_t>(1, device::chunks_of(most, p.host.chunk))));
    plan_status* st = g_->status_host(rank_);
    std::memset(st, 0, sizeof *st);
    check(launch_plan<D, Op>(a, op, blocks, stream_), "launching the collective's kernel");
    check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
    const plan_status seen = *st;
    switch (seen.code) {
      case st_ok: return;
      case st_timeout:
        if (seen.peer < 0) call.fail(errc::timeout, "timed out in a barrier of this rank's own blocks");
        call.timed_out(seen.peer, "its message, or its taking of this rank's");
      case st_mismatch_bytes:
        call.fail(errc::mismatch, "expected a message of another size from " + call.peer(seen.peer) + ": it sent " +
                                      std::to_string(seen.aux) + " B (counts differ between ranks)");
      case st_mismatch_call:
        call.fail(errc::mismatch, "and " + call.peer(seen.peer) + " made different calls: this rank called " + call.sig.describe() +
                                      ", " + call.peer(seen.peer) + " another (its message's signature differs)");
      default: {
        // A peer's kernel raised the abort flag as it failed: its host names the cause as soon
        // as that kernel has ended (a few microseconds; 200 ms at most here).
        int f = g_->first_failed();
        for (int i = 0; f < 0 && i < 200; ++i) {
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
          f = g_->first_failed();
        }
        call.fail(errc::peer_lost, "the job was aborted while waiting for " +
                                       (seen.peer >= 0 ? call.peer(seen.peer) : std::string("this rank's other blocks")) + ": " +
                                       (f >= 0 ? call.peer(f) + " failed: " + g_->why(f) : std::string("a rank failed")));
      }
    }
  }

 private:
  static std::uint64_t lowering_key(std::size_t elem) noexcept { return 0xc0da0000ull ^ (std::uint64_t(elem) << 32) ^ kDeviceChunk; }

  std::shared_ptr<group> g_;
  int rank_;
  int dev_;
  cudaStream_t stream_ = nullptr;
  void* tmp_ = nullptr;
  std::size_t tmp_bytes_ = 0;
  void* pack_ = nullptr;
  std::size_t pack_bytes_ = 0;
  int* abort_ = nullptr;
  plan_status* status_ = nullptr;
};

/// Runs f(comm) on n thread-ranks over cuda::transport (rank r on devices[r % size]) and
/// rethrows the first failure once every thread has ended, as collx::launch_threads does.
template <class F>
void launch_threads(int n, F&& f, options opts = {}, std::vector<int> devices = {0}) {
  if (n < 1) throw error(errc::invalid_argument, "cuda::launch_threads: the rank count must be at least 1, got " + std::to_string(n));
  auto g = std::make_shared<group>(n, std::move(devices));
  std::mutex mu;
  std::vector<std::exception_ptr> failed(static_cast<std::size_t>(n));
  auto record = [&](int r, const char* why) {
    g->fail(r, why);
    std::lock_guard lk(mu);
    failed.at(static_cast<std::size_t>(r)) = std::current_exception();
  };
  auto body = [&](int r) {
    try {
      communicator<transport> comm{transport{g, r}, opts};
      f(comm);
    } catch (const std::exception& e) {
      record(r, e.what());
    } catch (...) {
      record(r, "unknown exception");
    }
  };
  std::vector<std::thread> threads;
  for (int r = 1; r < n; ++r) threads.emplace_back(body, r);
  body(0);
  for (auto& t : threads) t.join();
  const int cause = g->first_failed();
  if (cause >= 0 && failed[std::size_t(cause)]) std::rethrow_exception(failed[std::size_t(cause)]);
  for (auto& e : failed)
    if (e) std::rethrow_exception(e);
}

}  // namespace collx::cuda
