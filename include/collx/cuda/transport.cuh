#pragma once
// collx::cuda::transport: buffers in device memory, and a call runs as ONE kernel on the rank's
// stream that walks the rank's schedule lowered to a device plan (device/plan.hpp,
// cuda/plan_kernel.cuh). The plan is lowered and copied to the device once per cached schedule
// and element size (schedule::lowered); the buffers are the launch's arguments, so a plan serves
// every call of its shape whatever the buffers.
//
// Ranks are threads of one process, each bound to a device (several may share one: tests,
// one-GPU machines), or processes, one device each, whose memory reaches each other through
// features/device_ipc.hpp's peer_group over cuda/ipc.cuh's backend (VMM descriptors or cudaIpc
// handles), bootstrapped over a host communicator (shm or tcp):
//
//   collx::cuda::launch_threads(4, [](auto& comm) {       // 4 ranks on device 0
//     collx::all_reduce(comm, std::span{grads, n}, collx::ops::sum{});   // grads: device memory
//   });
//   auto comm = collx::cuda::from_env();                  // a process of mpirun/srun/torchrun
//   collx::cuda::launch_processes(2, [](auto& comm) { ... });   // forked, one device each
//
// Blocking calls return when the result is in place; the error a kernel reports (plan_status)
// becomes the collx::error a host transport would throw: timeout or peer_lost naming the peer,
// mismatch with both sizes. Nonblocking ones (collx::async) return once enqueued on the
// stream, and their work completes when the stream has passed them, as NCCL's calls are
// stream-ordered (enqueue() below).
//
// The group's state (device/layout.hpp): each rank's region in device memory (its inboxes, its
// acks, its grid barrier, the pair bases, the tables of pointers into the peers' regions) and the
// job block in mapped host memory (the abort flag, who failed and why, a status slot per call in
// flight, the launch counters), which kernels poll and hosts write.
#if !defined(__CUDACC__)
#error "collx/cuda/*.cuh headers compile only under nvcc"
#endif
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "../comm/communicator.hpp"
#include "../core/concepts.hpp"
#include "../features/device_ipc.hpp"
#include "../device/job.hpp"
#include "../device/plan.hpp"
#include "../core/error.hpp"
#include "../launch/processes.hpp"
#include "../core/call_info.hpp"
#include "../core/split_plan.hpp"
#include "../transport/any.hpp"
#include "../core/work.hpp"
#include "ipc.cuh"
#include "plan_kernel.cuh"
#include "reduce.cuh"

namespace collx::cuda {

/// The memory_space of device buffers.
struct device_memory {};

/// Bytes a block moves at a time on the device.
inline constexpr std::uint64_t kDeviceChunk = 256 * 1024;

/// Device memory a transport holds (its scratch, its staging, its pack buffer).
struct dev_buffer {
  std::byte* p = nullptr;
  std::size_t bytes = 0;
  CUmemGenericAllocationHandle h = 0;  // (a process group's VMM allocation)
};

/// What one rank's launches need of its group.
struct rank_view {
  int rank = 0, size = 1, device = 0, sms = 1, sharing = 1;
  std::byte* region = nullptr;          // the rank's region (device address: layout.hpp)
  device::job_rank* job = nullptr;      // its entry of the job block, as the host reads it
  device::job_rank* job_dev = nullptr;  // and as kernels do
  int* abort_dev = nullptr;             // the group's abort flag, as kernels read it
};

/// A group of ranks: threads of one process (thread_group) or processes (process_group).
class group_base {
 public:
  virtual ~group_base() = default;
  virtual int size() const noexcept = 0;
  virtual rank_view view(int r) const = 0;
  virtual const device::job_view& jobs() const noexcept = 0;
  /// Waits until no peer of r has a launch that may read r's memory (r failed), at most `limit`.
  virtual bool wait_peers_idle(int r, std::chrono::nanoseconds limit) noexcept = 0;
  /// Processes: a peer whose process ended without leaving (now marked failed), else -1.
  virtual int peer_gone() noexcept { return -1; }
  /// Processes: peers do not read the addresses posted; see exchange().
  virtual bool between_processes() const noexcept { return false; }
  /// Whether the peers can map [p, p + bytes) (else it is staged). Threads share an address space.
  virtual bool exportable(const std::byte*, std::size_t) { return true; }
  /// Processes: the call's exchange (features/device_ipc.hpp): every rank's signature and the buffers it
  /// posts from; fills peer_base ([rank][3]).
  virtual void exchange(const call_info&, std::byte* const (&)[4], const device::plan&, std::uint64_t*) {}
  /// Device memory of rank r's own, that its peers may read (processes: exportable; threads:
  /// stream-ordered, no wait for the whole device, where other ranks' kernels wait for this one).
  virtual dev_buffer allocate(int r, std::size_t bytes, cudaStream_t s) = 0;
  virtual void release(int r, dev_buffer& b, cudaStream_t s) noexcept = 0;
  virtual split_offer prepare_split() { return {}; }
  virtual std::shared_ptr<group_base> split(const std::shared_ptr<group_base>& self, const split_plan& p, split_offer&& o) = 0;
  virtual void leave(int r) noexcept { jobs().leave(r); }
  /// How many ranks' kernels may be on rank r's device at once, this group's and any other's of
  /// the process (processes: this group's; other processes' kernels are time-sliced with ours).
  virtual int residents(int r) const noexcept { return std::max(1, view(r).sharing); }
  /// Processes: rank r failed; peers waiting in the bootstrap (a call's exchange) learn it too.
  virtual void abort_boot(const std::string&) noexcept {}
};

// ---- threads -------------------------------------------------------------------------------

/// Process-wide, for thread groups: how many thread-ranks of live groups each device holds, and
/// the memory of groups gone while others live.
/// - A grid is sized so that every rank's kernel on the device is resident at once. The ranks of
///   a split's parts, and of the parent beside them, are other groups on the same device: each
///   group counting only its own would ask for more than the device holds (two pairs of a split
///   of 4 ranks would ask for twice the device), and a grid whose blocks cannot all be resident
///   waits at its barrier until its deadline.
/// - cudaFree and cudaFreeHost wait for the whole device, where another group's kernels may wait
///   for the very thread that frees (a split communicator dropped while the parent's next call
///   is under way on the other ranks). A group's memory is freed when the last group goes.
class device_residents {
 public:
  static device_residents& get() {
    static device_residents r;  // (never destroyed before the groups: function-local, first use)
    return r;
  }
  void join(const std::vector<int>& devices) {
    std::lock_guard g(mu_);
    for (int d : devices) ++count_[d];
    ++groups_;
  }
  int on(int device) const {
    std::lock_guard g(mu_);
    const auto it = count_.find(device);
    return it == count_.end() ? 0 : it->second;
  }
  /// A group leaves: its ranks' devices, its regions (device, pointer) and its job block.
  void leave(const std::vector<int>& devices, std::vector<std::pair<int, void*>> regions, void* job, bool joined) noexcept {
    std::lock_guard g(mu_);
    if (joined) {
      for (int d : devices) --count_[d];
      --groups_;
    }
    for (auto& r : regions) regions_.push_back(r);
    if (job) jobs_.push_back(job);
    if (groups_ > 0) return;
    for (auto [d, p] : regions_) {
      cudaSetDevice(d);
      cudaFree(p);
    }
    for (void* j : jobs_) cudaFreeHost(j);
    regions_.clear();
    jobs_.clear();
  }

 private:
  mutable std::mutex mu_;
  std::map<int, int> count_;
  int groups_ = 0;
  std::vector<std::pair<int, void*>> regions_;
  std::vector<void*> jobs_;
};

/// Ranks as threads of one process: every region in device memory of the process, the job block
/// in mapped host memory (cudaHostAlloc), peers reached through peer access.
class thread_group final : public group_base {
 public:
  /// n ranks; rank r on device devices[r % devices.size()] (default: every rank on device 0).
  explicit thread_group(int n, std::vector<int> devices = {0}) : n_(n), lay_{n}, ranks_(std::size_t(n)) {
    try {
      make(std::move(devices));
    } catch (...) {
      release_all();
      throw;
    }
  }
  ~thread_group() override { release_all(); }
  thread_group(const thread_group&) = delete;
  thread_group& operator=(const thread_group&) = delete;

  int size() const noexcept override { return n_; }
  int device_of(int r) const noexcept { return ranks_[std::size_t(r)].device; }
  const device::job_view& jobs() const noexcept override { return jv_; }
  rank_view view(int r) const override {
    const per_rank& x = ranks_[std::size_t(r)];
    rank_view v;
    v.rank = r;
    v.size = n_;
    v.device = x.device;
    v.sms = x.sms;
    v.sharing = x.sharing;
    v.region = x.region;
    v.job = &jv_.rank(r);
    v.job_dev = device::job_layout::rank(job_dev_, r);
    v.abort_dev = &device::job_layout::header(job_dev_)->abort;
    return v;
  }
  bool wait_peers_idle(int r, std::chrono::nanoseconds limit) noexcept override {
    return jv_.wait_idle_but(r, limit, [](int) { return false; });
  }
  int residents(int r) const noexcept override {
    return std::max({1, ranks_[std::size_t(r)].sharing, device_residents::get().on(device_of(r))});
  }
  dev_buffer allocate(int r, std::size_t bytes, cudaStream_t s) override {
    dev_buffer b;
    check(cudaSetDevice(device_of(r)), "cudaSetDevice");
    check(cudaMallocAsync(reinterpret_cast<void**>(&b.p), std::max<std::size_t>(bytes, 1), s), "cudaMallocAsync");
    b.bytes = bytes;
    return b;
  }
  void release(int r, dev_buffer& b, cudaStream_t s) noexcept override {
    if (!b.p) return;
    cudaSetDevice(device_of(r));
    cudaFreeAsync(b.p, s);
    b = dev_buffer{};
  }
  /// The group of a communicator split from this one (core/split_plan.hpp): every member asks for
  /// it, the first makes it (its ranks on the devices their parent ranks are on), the last
  /// takes it out of the registry. It has its own regions and job block.
  std::shared_ptr<group_base> split(const std::shared_ptr<group_base>& self, const split_plan& p, split_offer&&) override {
    auto* parent = static_cast<thread_group*>(self.get());
    return collx::detail::join_split_group<thread_group>(parent, p, [&] {
      std::vector<int> devices;
      for (int m : p.members) devices.push_back(parent->device_of(m));
      return std::make_shared<thread_group>(p.size, std::move(devices));
    });
  }

 private:
  struct per_rank {
    int device = 0, sms = 1, sharing = 0;
    std::byte* region = nullptr;
  };
  void make(std::vector<int> devices) {
    if (devices.empty()) devices = {0};
    for (int r = 0; r < n_; ++r) ranks_[std::size_t(r)].device = devices[std::size_t(r) % devices.size()];
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
    const std::size_t jb = device::job_layout{n_}.bytes();
    check(cudaHostAlloc(&job_, jb, cudaHostAllocMapped | cudaHostAllocPortable), "cudaHostAlloc (the job block)");
    std::memset(job_, 0, jb);
    jv_ = device::job_view(job_, n_);
    jv_.init();
    check(cudaHostGetDevicePointer(&job_dev_, job_, 0), "cudaHostGetDevicePointer");
    for (int r = 0; r < n_; ++r) {
      per_rank& x = ranks_[std::size_t(r)];
      check(cudaSetDevice(x.device), "cudaSetDevice");
      check(cudaMalloc(reinterpret_cast<void**>(&x.region), lay_.bytes()), "cudaMalloc (the group's counters)");
      check(cudaMemset(x.region, 0, lay_.bytes()), "cudaMemset");
      check(cudaDeviceGetAttribute(&x.sms, cudaDevAttrMultiProcessorCount, x.device), "cudaDeviceGetAttribute");
      for (int q = 0; q < n_; ++q) x.sharing += ranks_[std::size_t(q)].device == x.device;
    }
    const auto N = std::size_t(n_);
    std::vector<std::uint64_t> t(4 * N);
    for (int r = 0; r < n_; ++r) {
      for (int q = 0; q < n_; ++q) {
        const auto Q = std::size_t(q), R = std::size_t(r);
        std::byte* mine = ranks_[R].region;
        std::byte* theirs = ranks_[Q].region;
        t[Q] = reinterpret_cast<std::uint64_t>(mine + lay_.inboxes() + Q * sizeof(device::inbox));            // in_from[q]: (q -> r), on r
        t[N + Q] = reinterpret_cast<std::uint64_t>(theirs + lay_.inboxes() + R * sizeof(device::inbox));      // out_to[q]: (r -> q), on q
        t[2 * N + Q] = reinterpret_cast<std::uint64_t>(mine + lay_.acks() + Q * sizeof(device::ack));          // acks_mine[q]: (r -> q)'s taken, on r
        t[3 * N + Q] = reinterpret_cast<std::uint64_t>(theirs + lay_.acks() + R * sizeof(device::ack));        // acks_theirs[q]: (q -> r)'s taken, on q
      }
      check(cudaSetDevice(ranks_[std::size_t(r)].device), "cudaSetDevice");
      check(cudaMemcpy(ranks_[std::size_t(r)].region + lay_.tables(), t.data(), t.size() * sizeof(std::uint64_t), cudaMemcpyHostToDevice),
            "cudaMemcpy");
      // The memset and the copy (from pageable memory: it returns once the bytes are staged) are
      // on the default stream; the ranks' kernels run on streams that do not wait for it.
      check(cudaStreamSynchronize(nullptr), "cudaStreamSynchronize (the group's counters and tables)");
    }
    std::vector<int> devs;
    for (const per_rank& x : ranks_) devs.push_back(x.device);
    device_residents::get().join(devs);
    joined_ = true;
  }
  void release_all() noexcept {
    std::vector<int> devs;
    std::vector<std::pair<int, void*>> regions;
    for (per_rank& x : ranks_) {
      devs.push_back(x.device);
      if (x.region) regions.emplace_back(x.device, x.region);
      x.region = nullptr;
    }
    device_residents::get().leave(devs, std::move(regions), job_, joined_);
    job_ = nullptr;
    joined_ = false;
  }
  bool joined_ = false;
  int n_;
  device::region_layout lay_;
  std::vector<per_rank> ranks_;
  void* job_ = nullptr;
  void* job_dev_ = nullptr;
  device::job_view jv_;
};

// ---- processes -----------------------------------------------------------------------------

/// Ranks as processes, one device each: features/device_ipc.hpp's peer_group over device memory.
class process_group final : public group_base {
 public:
  /// Every rank of `boot` makes it at once (a collective call on boot), on `device`.
  process_group(communicator<collx::transport::any> boot, int device, std::chrono::nanoseconds timeout)
      : dev_(device), timeout_(timeout) {
    check(cudaSetDevice(dev_), "cudaSetDevice");
    check(cudaFree(nullptr), "initialising the device");
    if (boot.size() > kMaxProcessRanks)
      throw error(errc::invalid_argument, "collx::cuda: " + std::to_string(boot.size()) + " process-ranks in one group, more than the " +
                                              std::to_string(kMaxProcessRanks) + " a launch carries the peers' buffers of");
    g_ = std::make_unique<group>(std::move(boot), ipc_backend(dev_), timeout);
    check(cudaDeviceGetAttribute(&sms_, cudaDevAttrMultiProcessorCount, dev_), "cudaDeviceGetAttribute");
  }

  int size() const noexcept override { return g_->size(); }
  int device() const noexcept { return dev_; }
  const device::job_view& jobs() const noexcept override { return g_->jobs(); }
  rank_view view(int r) const override {
    rank_view v;
    v.rank = r;
    v.size = g_->size();
    v.device = dev_;
    v.sms = sms_;
    v.sharing = std::max(1, g_->sharing());
    v.region = g_->region();
    v.job = &g_->job_of(r);
    v.job_dev = device::job_layout::rank(g_->job_device(), r);
    v.abort_dev = &device::job_layout::header(g_->job_device())->abort;
    return v;
  }
  bool wait_peers_idle(int, std::chrono::nanoseconds limit) noexcept override { return g_->wait_peers_idle(limit); }
  int peer_gone() noexcept override { return g_->peer_gone(); }
  bool between_processes() const noexcept override { return true; }
  bool exportable(const std::byte* p, std::size_t bytes) override {
    std::uint64_t off = 0;
    return g_->backend().describe(p, bytes, off).kind != device::ipc::handle_kind::none;
  }
  void exchange(const call_info& call, std::byte* const (&bufs)[4], const device::plan& p, std::uint64_t* peer_base) override {
    device::ipc::buffer_ref refs[3];
    for (int b = 1; b <= 3; ++b)
      if ((p.posts_from & (1u << b)) != 0 && p.extent[b] != 0 && bufs[b] != nullptr)
        refs[b - 1].a = g_->backend().describe(bufs[b], p.extent[b], refs[b - 1].offset);
    g_->exchange(call, refs, table_);
    std::copy(table_.begin(), table_.end(), peer_base);
  }
  dev_buffer allocate(int, std::size_t bytes, cudaStream_t s) override {
    check(cudaStreamSynchronize(s), "cudaStreamSynchronize");  // (what it replaces may still be in use)
    ipc_backend::owned o = g_->backend().allocate(bytes);
    return {o.p, o.bytes, o.h};
  }
  void release(int, dev_buffer& b, cudaStream_t s) noexcept override {
    if (!b.p) return;
    cudaStreamSynchronize(s);
    ipc_backend::owned o{b.p, b.bytes, b.h};
    g_->backend().release(o);
    b = dev_buffer{};
  }
  void abort_boot(const std::string& why) noexcept override { g_->boot().transport().abort(why); }
  /// The members of each part make a new group over a split of the bootstrap (every member of
  /// the part, a collective call there), on the same device.
  split_offer prepare_split() override { return g_->boot().transport().prepare_split(); }
  std::shared_ptr<group_base> split(const std::shared_ptr<group_base>&, const split_plan& p, split_offer&& o) override {
    communicator<collx::transport::any> child =
        g_->boot().adopt(g_->boot().transport().split(p, std::move(o)), "cuda-boot." + p.id, p.members, "cuda-boot." + p.id);
    return std::make_shared<process_group>(std::move(child), dev_, timeout_);
  }

 private:
  using group = device::ipc::peer_group<ipc_backend>;
  int dev_;
  std::chrono::nanoseconds timeout_;
  int sms_ = 1;
  std::unique_ptr<group> g_;
  device::ipc::peer_table table_;
};

// ---- plans ---------------------------------------------------------------------------------

/// A plan lowered for the device: the host plan, and its arrays and per-peer totals copied to
/// device memory (freed with it, that is with the cached schedule it belongs to).
struct device_plan {
  device::plan host;
  void* mem = nullptr;
  device::plan_view view{};
  const std::uint64_t* totals = nullptr;
  int dev = 0;
  std::uint64_t most = 0;  // bytes of its largest operation
  /// Allocated and freed stream-ordered (cudaMallocAsync / cudaFreeAsync on the calling
  /// thread's default stream): cudaMalloc and cudaFree may wait for the whole device, where
  /// other ranks' kernels wait for this rank, which would then wait out their deadline.
  device_plan(device::plan p, int device) : host(std::move(p)), dev(device) {
    for (const auto& o : host.ops) most = std::max(most, o.bytes);
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
  std::size_t memory_bytes() const { return host.memory_bytes(); }
  ~device_plan() {
    if (!mem) return;
    int was = 0;
    cudaGetDevice(&was);
    cudaSetDevice(dev);
    cudaFreeAsync(mem, cudaStreamPerThread);
    cudaSetDevice(was);
  }
};

// ---- stream-ordered calls ------------------------------------------------------------------

namespace detail {

/// A call whose kernel is on a stream and whose outcome is not known yet: an event after it,
/// and the status slot its kernel reports in.
struct stream_call {
  cudaEvent_t ev = nullptr;
  int slot = -1;
  call_signature sig;
  int rank = 0;
  comm_identity id;
  bool job_comm = true;
  std::chrono::nanoseconds timeout{};
  std::shared_ptr<const void> plan;  // what its kernel reads, kept until it has run
  std::mutex mu;                     // held by the one settling it
  std::atomic<bool> done{false};     // (read without the lock: settled())
  std::exception_ptr err;            // written before `done`
  bool settled() const noexcept { return done.load(std::memory_order_acquire); }
};

/// Where a transport parks the calls it enqueues instead of waiting for them, while one
/// collx::async call on it runs (transport::enqueue).
struct deferral {
  const void* transport = nullptr;
  std::vector<std::shared_ptr<stream_call>> calls;
};
inline thread_local deferral* tl_deferral = nullptr;

}  // namespace detail

class transport {
 public:
  using transport_concept = transport_tag;
  using memory_space = device_memory;
  static constexpr const char* name = "cuda";

  transport(std::shared_ptr<group_base> g, int rank) : g_(std::move(g)), v_(g_->view(rank)) {
    check(cudaSetDevice(v_.device), "cudaSetDevice");
    check(cudaStreamCreateWithFlags(&own_stream_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    stream_ = own_stream_;
    jobs_ = g_->jobs();
  }
  /// A process-rank on `device`, its group made over the host communicator `boot` (every rank of
  /// it calls this at once). `timeout`: how long the making may wait for a peer.
  static transport over(communicator<collx::transport::any> boot, int device, std::chrono::nanoseconds timeout = collx::detail::default_timeout()) {
    const int r = boot.rank();
    return transport(std::make_shared<process_group>(std::move(boot), device, timeout), r);
  }
  transport(transport&& o) noexcept
      : g_(std::move(o.g_)), v_(o.v_), jobs_(o.jobs_), own_stream_(std::exchange(o.own_stream_, nullptr)), stream_(o.stream_),
        tmp_(std::exchange(o.tmp_, {})), pack_(std::exchange(o.pack_, {})), host_(std::exchange(o.host_, {})),
        bounce_{std::exchange(o.bounce_[0], {}), std::exchange(o.bounce_[1], {})}, slots_(std::move(o.slots_)),
        next_slot_(o.next_slot_), events_mu_(std::move(o.events_mu_)), events_(std::move(o.events_)),
        free_events_(std::move(o.free_events_)), live_(std::move(o.live_)) {}
  transport(const transport&) = delete;
  transport& operator=(const transport&) = delete;
  transport& operator=(transport&&) = delete;
  ~transport() {
    if (!g_) return;
    cudaSetDevice(v_.device);
    if (stream_) cudaStreamSynchronize(stream_);
    for (auto& w : live_)
      if (auto c = w.lock()) settle(*c);
    for (dev_buffer* b : {&tmp_, &pack_, &host_, &bounce_[0], &bounce_[1]}) g_->release(v_.rank, *b, stream_);
    for (cudaEvent_t e : events_) cudaEventDestroy(e);
    if (own_stream_) {
      cudaStreamSynchronize(own_stream_);
      cudaStreamDestroy(own_stream_);
    }
  }

  int rank() const noexcept { return v_.rank; }
  int size() const noexcept { return v_.size; }
  int device() const noexcept { return v_.device; }
  /// The stream this rank's calls are ordered on.
  cudaStream_t stream() const noexcept { return stream_; }
  /// Orders this rank's calls on `s`, the caller's stream (as NCCL takes one), instead of the
  /// transport's own: a call then starts after the work enqueued on s before it (the kernels
  /// that made its input), with no synchronisation by the caller. nullptr: back to its own.
  void use_stream(cudaStream_t s) {
    check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
    stream_ = s != nullptr ? s : own_stream_;
  }
  const char* kind() const noexcept { return g_->between_processes() ? "cuda-ipc" : "cuda"; }

  /// Fails this rank (every peer's kernel ends at its next wait), then waits for the peers'
  /// kernels to end before the caller unwinds: one may be reading this rank's buffers, which
  /// the unwinding frees (for at most kAbortReadWait: a peer whose host thread is stuck
  /// elsewhere cannot hold this rank forever).
  void abort(const std::string& why) noexcept {
    jobs_.fail(v_.rank, why);
    g_->abort_boot(why);
    g_->wait_peers_idle(v_.rank, kAbortReadWait);
    // This rank's own queued kernels end too (they watch the abort flag): the caller may free
    // what they read once this returns.
    int was = 0;
    cudaGetDevice(&was);
    cudaSetDevice(v_.device);
    if (stream_) cudaStreamSynchronize(stream_);
    cudaSetDevice(was);
  }
  /// Done with the group in order (launch_processes calls it after the rank's function).
  void leave() noexcept {
    cudaSetDevice(v_.device);
    if (stream_) cudaStreamSynchronize(stream_);
    // Nonblocking calls nobody waited for are settled first: one that failed fails this rank
    // with its reason, which a rank already marked as left could no longer record.
    for (auto& w : live_)
      if (auto c = w.lock()) settle(*c);
    g_->leave(v_.rank);
  }
  static constexpr std::chrono::seconds kAbortReadWait{2};

  /// Splits (communicator::split): the members of a part share a new group. Threads: made by
  /// the first of them to come; processes: over a split of the bootstrap.
  split_offer prepare_split() { return g_->prepare_split(); }
  transport split(const split_plan& p, split_offer&& o) const { return transport(g_->split(g_, p, std::move(o)), p.rank); }

  /// Device memory of at least `bytes`, kept from call to call (a fused batch packs its parts
  /// into it: features/fuse.hpp).
  std::byte* pack_buffer(std::size_t bytes) { return grow(pack_, bytes); }

  /// Calls of the library's own on host memory (split's agreement, automatic's parameters)
  /// run on a copy in this memory (collectives/executor.hpp: on_transport_memory).
  std::byte* host_staging(std::size_t bytes) { return grow(host_, bytes); }
  void copy_from_host(std::byte* dst, const void* src, std::size_t bytes) {
    check(cudaSetDevice(v_.device), "cudaSetDevice");
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_), "cudaMemcpyAsync (to the device)");
    check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  }
  void copy_to_host(void* dst, const std::byte* src, std::size_t bytes) {
    settle_deferred();  // (what it copies must be the outcome of calls known to have succeeded)
    check(cudaSetDevice(v_.device), "cudaSetDevice");
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_), "cudaMemcpyAsync (to the host)");
    check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  }

  /// Every part enqueued on the rank's stream, then one wait (a fused batch's packing: features/fuse.hpp);
  /// within a stream-ordered call, no wait: what follows on the stream comes after.
  void copy_local(std::span<const local_copy_part> parts) {
    check(cudaSetDevice(v_.device), "cudaSetDevice");
    for (const local_copy_part& p : parts) {
      if (p.bytes == 0) continue;
      if (const cudaError_t e = cudaMemcpyAsync(p.dst, p.src, p.bytes, cudaMemcpyDeviceToDevice, stream_); e != cudaSuccess) {
        cudaStreamSynchronize(stream_);
        check(e, "cudaMemcpyAsync");
      }
    }
    if (!deferring()) check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  }
  template <class E, class Op>
  void finalize(E* p, std::size_t count, int ranks) {
    if constexpr (has_finalize_v<Op, E>) {
      using D = device_type_t<E>;
      check(cudaSetDevice(v_.device), "cudaSetDevice");
      check(cuda::finalize<D, Op>(reinterpret_cast<D*>(p), count, ranks, stream_, v_.sms), "the finalize kernel");
      if (!deferring()) check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
    }
  }

  /// collx::async on this transport (features/async.hpp): f, the blocking call, runs now, its kernels are
  /// enqueued and not waited for; the work completes when the stream has passed them, and its
  /// wait() throws what their statuses say. Errors found while enqueueing (a bad argument, a
  /// mismatch found by the exchange between processes) are the work's too.
  template <class F>
  work enqueue(F&& f) {
    // (A call is settled by the transport at the latest when it goes: a work that outlives its
    // communicator finds its calls done and never touches the transport.)
    struct state final : collx::detail::work_state {
      transport* t;
      std::vector<std::shared_ptr<detail::stream_call>> calls;  // the kernels; the last one marks the end of f's work
      std::exception_ptr err;
      bool test() override {
        for (auto& c : calls)
          if (!c->settled() && !t->try_settle(*c)) return false;
        return true;
      }
      void wait() override {
        for (auto& c : calls)
          if (!c->settled()) t->settle(*c);
        if (err) std::rethrow_exception(err);
        for (auto& c : calls)
          if (c->err) std::rethrow_exception(c->err);
      }
    };
    auto s = std::make_shared<state>();
    s->t = this;
    detail::deferral d{this, {}};
    detail::deferral* outer = std::exchange(detail::tl_deferral, &d);
    try {
      std::forward<F>(f)();
      // What f enqueued after its kernels (avg's division, copies back from staging, a fused
      // batch's copies) is done when the stream passes this: a call with no kernel and no
      // status, settled last.
      auto end = std::make_shared<detail::stream_call>();
      check(cudaSetDevice(v_.device), "cudaSetDevice");  // (the event is the device's: f may have enqueued nothing)
      end->ev = event();
      check(cudaEventRecord(end->ev, stream_), "cudaEventRecord");
      remember(end);
      d.calls.push_back(std::move(end));
    } catch (...) {
      s->err = std::current_exception();
    }
    detail::tl_deferral = outer;
    s->calls = std::move(d.calls);
    return work(std::move(s));
  }

  template <class E, class Op>
  void run_schedule(const call_info& call, const schedule& s, const E* in, E* out, const Op& op) {
    using D = device_type_t<E>;
    check_not_aborted(call);
    check(cudaSetDevice(v_.device), "cudaSetDevice");
    const std::shared_ptr<const device_plan> kept = s.lowered_shared<device_plan>(lowering_key(sizeof(E)), [&] {
      return std::make_shared<const device_plan>(device::lower(s, size(), sizeof(E), kDeviceChunk), v_.device);
    });
    const device_plan& p = *kept;
    plan_args a{};
    std::byte* bufs[4] = {nullptr, reinterpret_cast<std::byte*>(const_cast<E*>(in)), reinterpret_cast<std::byte*>(out),
                          s.tmp_elems() != 0 ? grow(tmp_, s.tmp_elems() * sizeof(E)) : nullptr};
    after_.clear();
    if (g_->between_processes()) {
      // What the plan posts from must be memory the peers can map: staged where it is not.
      auto exportable = [&](const std::byte* q, std::uint64_t bytes) { return g_->exportable(q, bytes); };
      auto stage = [&](int slot, std::size_t bytes) { return grow(bounce_[slot], bytes); };
      device::ipc::stage_buffers(bufs, p.host.extent, p.host.posts_from, exportable, stage, before_, after_);
      g_->exchange(call, bufs, p.host, a.peer_base);
      a.translate = 1;
      for (const local_copy_part& c : before_)  // (Default: a host buffer is staged too)
        check(cudaMemcpyAsync(c.dst, c.src, c.bytes, cudaMemcpyDefault, stream_), "cudaMemcpyAsync (staging)");
    }
    const device::region_layout lay{size()};
    a.plan = p.view;
    a.bases = reinterpret_cast<std::uint64_t*>(v_.region + lay.bases());
    a.totals = p.totals;
    for (int b = 0; b < 4; ++b) a.bufs[b] = bufs[b];
    void** t = reinterpret_cast<void**>(v_.region + lay.tables());
    const std::size_t n = std::size_t(size());
    a.in_from = reinterpret_cast<inbox* const*>(t);
    a.out_to = reinterpret_cast<inbox* const*>(t + n);
    a.acks_mine = reinterpret_cast<ack* const*>(t + 2 * n);
    a.acks_theirs = reinterpret_cast<ack* const*>(t + 3 * n);
    auto* line = reinterpret_cast<std::uint64_t*>(v_.region + lay.line());
    a.barrier = line + device::kBarrierWord;
    a.barrier_base = line + device::kBarrierBaseWord;
    a.exited = line + device::kExitedWord;
    a.abort = v_.abort_dev;
    a.sig = call.sig.hash();
    a.timeout_ns = std::uint64_t(std::clamp<std::int64_t>(call.timeout.count(), 0, std::int64_t(1) << 62));
    a.rank = rank();
    a.size = size();
    // Blocks: one per chunk of the largest operation, as many as fit beside the other ranks.
    static const int per_sm = [] {  // of this very kernel: heavier ops fit fewer blocks
      int b = 0;
      check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, plan_kernel<D, Op>, kThreads, 0),
            "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
      return b;
    }();
    const int sharing = g_->residents(v_.rank);  // (this group's ranks on the device, and other groups')
    if (per_sm < 1 || sharing > v_.sms * per_sm)
      call.fail(errc::invalid_argument, std::to_string(sharing) + " ranks share device " + std::to_string(v_.device) +
                                            ", more than its kernels can run at once (" + std::to_string(v_.sms * per_sm) + ")");
    const int blocks = int(std::min<std::uint64_t>(std::uint64_t(max_blocks(per_sm, sharing)), std::max<std::uint64_t>(1, device::chunks_of(p.most, p.host.chunk))));
    // The call's status slot (one per call in flight), its launch number and blocks.
    const int slot = take_slot();
    device::job_rank& j = *v_.job;
    std::memset(&j.status[slot], 0, sizeof(plan_status));
    a.status = &v_.job_dev->status[slot];
    a.finished = &v_.job_dev->finished;
    // Counted as launched before the abort flag is read: a failing peer raises the flag before
    // it reads the counts (both sequentially consistent), so either this sees the failure and
    // launches nothing, or the peer waits for this launch to end.
    const std::uint64_t launch = std::atomic_ref<std::uint64_t>(j.launched).fetch_add(1, std::memory_order_seq_cst) + 1;
    if (jobs_.aborted()) {
      std::atomic_ref<std::uint64_t>(j.launched).fetch_sub(1, std::memory_order_seq_cst);
      check_not_aborted(call);
    }
    a.launch = launch;
    j.blocks += std::uint64_t(blocks);
    a.exit_target = j.blocks;
    if (const cudaError_t e = launch_plan<D, Op>(a, op, blocks, stream_); e != cudaSuccess) {
      j.blocks -= std::uint64_t(blocks);
      std::atomic_ref<std::uint64_t>(j.launched).fetch_sub(1, std::memory_order_seq_cst);
      check(e, "launching the collective's kernel");
    }
    for (const local_copy_part& c : after_)
      check(cudaMemcpyAsync(c.dst, c.src, c.bytes, cudaMemcpyDefault, stream_), "cudaMemcpyAsync (staging)");
    auto c = std::make_shared<detail::stream_call>();
    c->ev = event();
    c->slot = slot;
    c->sig = call.sig;
    c->rank = call.rank;
    c->job_comm = call.comm == nullptr;
    if (call.comm != nullptr) c->id = *call.comm;
    c->timeout = call.timeout;
    c->plan = kept;  // (the schedule may leave its cache while the kernel is queued)
    check(cudaEventRecord(c->ev, stream_), "cudaEventRecord");
    slots_[std::size_t(slot)] = c;
    remember(c);
    if (deferring()) {
      detail::tl_deferral->calls.push_back(std::move(c));
      return;
    }
    settle(*c, &call);
    if (c->err) std::rethrow_exception(c->err);
  }

 private:
  static std::uint64_t lowering_key(std::size_t elem) noexcept { return 0xc0da0000ull ^ (std::uint64_t(elem) << 32) ^ kDeviceChunk; }

  bool deferring() const noexcept { return detail::tl_deferral != nullptr && detail::tl_deferral->transport == this; }

  void check_not_aborted(const call_info& call) const {
    if (!jobs_.aborted()) return;
    const int f = jobs_.first_failed();
    if (f < 0) call.fail(errc::peer_lost, "the job was aborted");
    call.fail(errc::peer_lost, f == rank() ? "this rank already failed: " + jobs_.why(f)
                                           : "the job was aborted: " + call.peer(f) + " failed: " + jobs_.why(f));
  }

  /// The most blocks this rank's kernel may have when `per_sm` of its blocks fit on one
  /// multiprocessor: every block of every rank on the device must be resident at once
  /// (plan_kernel.cuh's grid barrier and the peers' waits), so they share the device. Ranks
  /// sharing a device may run different kernels at once (one rank is already in its next call),
  /// whose blocks need different resources: a block of headroom per rank absorbs what the
  /// multiprocessors' fragmentation takes.
  int max_blocks(int per_sm, int sharing) const noexcept {
    return std::max(1, v_.sms * std::max(1, per_sm) / std::max(1, sharing) - (sharing > 1 ? 1 : 0));
  }

  std::byte* grow(dev_buffer& b, std::size_t bytes) {
    if (bytes > b.bytes || b.p == nullptr) {
      g_->release(v_.rank, b, stream_);
      b = g_->allocate(v_.rank, bytes, stream_);
    }
    return b.p;
  }

  cudaEvent_t event() {
    std::lock_guard g(*events_mu_);
    if (!free_events_.empty()) {
      cudaEvent_t e = free_events_.back();
      free_events_.pop_back();
      return e;
    }
    cudaEvent_t e = nullptr;
    check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    events_.push_back(e);
    return e;
  }
  /// Calls the transport settles before it goes, whoever holds them.
  void remember(const std::shared_ptr<detail::stream_call>& c) {
    std::lock_guard g(*events_mu_);
    if (live_.size() >= 256)
      live_.erase(std::remove_if(live_.begin(), live_.end(), [](const std::weak_ptr<detail::stream_call>& w) {
                    auto x = w.lock();
                    return !x || x->settled();
                  }),
                  live_.end());
    live_.push_back(c);
  }

  /// A free status slot: the next one round the ring, after settling the call that held it.
  int take_slot() {
    if (slots_.empty()) slots_.resize(std::size_t(device::kStatusSlots));
    const int s = int(next_slot_++ % std::uint64_t(device::kStatusSlots));
    if (auto& c = slots_[std::size_t(s)]) {
      settle(*c);
      c.reset();
    }
    return s;
  }

  /// Settles every call the current deferral holds (a copy back to the host must see their
  /// outcome), throwing the first one's error.
  void settle_deferred() {
    if (!deferring()) return;
    for (auto& c : detail::tl_deferral->calls) {
      settle(*c);
      if (c->err) std::rethrow_exception(c->err);
    }
  }

  bool try_settle(detail::stream_call& c) {
    if (c.settled()) return true;
    const cudaError_t e = cudaEventQuery(c.ev);
    if (e == cudaErrorNotReady) {
      if (g_->between_processes()) g_->peer_gone();  // a dead peer ends the kernel's waits now
      return false;
    }
    settle(c);
    return true;
  }

  /// Waits until the stream has passed call c (between processes: watching the peers'
  /// processes meanwhile), then turns its status into its outcome (c.err). `live`: the call's
  /// own call_info, while it is still in progress (its flight record is named in the error). A
  /// call whose kernel reports an error fails this rank (as an error leaving a blocking call
  /// does: collectives/executor.hpp), so its peers stop too, and waits for their kernels.
  void settle(detail::stream_call& c, const call_info* live = nullptr) noexcept {
    if (c.settled()) return;
    cudaEvent_t ev = nullptr;
    std::string failed_why;
    {
      std::lock_guard g(c.mu);
      if (c.settled()) return;
      int was = 0;
      cudaGetDevice(&was);
      cudaSetDevice(v_.device);
      cudaError_t e = cudaSuccess;
      if (!g_->between_processes()) {
        e = cudaEventSynchronize(c.ev);
      } else {
        // Spin a little (a small call ends within microseconds), then sleep in growing steps,
        // watching the peers' processes: a peer killed mid-call fails the group (its kernels end).
        const auto t0 = std::chrono::steady_clock::now();
        auto pause = std::chrono::microseconds(2);
        while ((e = cudaEventQuery(c.ev)) == cudaErrorNotReady) {
          if (std::chrono::steady_clock::now() - t0 > std::chrono::microseconds(50)) {
            g_->peer_gone();
            std::this_thread::sleep_for(pause);
            pause = std::min(pause * 2, std::chrono::microseconds(1000));
          }
        }
      }
      cudaSetDevice(was);
      ev = c.ev;
      if (c.slot < 0) {  // the end of a nonblocking call's work: no kernel, no status
        if (e != cudaSuccess)
          c.err = std::make_exception_ptr(error(errc::transport_error, std::string("collx::cuda: ") + cudaGetErrorString(e)));
      } else {
        call_info info;
        info.sig = c.sig;
        info.rank = c.rank;
        info.comm = c.job_comm ? nullptr : &c.id;
        info.timeout = c.timeout;
        const call_info& call = live != nullptr ? *live : info;
        try {
          if (e != cudaSuccess) call.fail(errc::transport_error, std::string("the collective's kernel failed: ") + cudaGetErrorString(e));
          raise_status(call, v_.job->status[c.slot]);
        } catch (const std::exception& x) {
          c.err = std::current_exception();
          failed_why = x.what();
        }
      }
      c.plan.reset();
      c.done.store(true, std::memory_order_release);
    }
    {
      std::lock_guard ge(*events_mu_);
      free_events_.push_back(ev);
    }
    if (!failed_why.empty() && live == nullptr) abort(failed_why);  // (a blocking call's error is aborted by the executor)
  }

  /// The error a kernel's status stands for, naming the peer, as a host transport's would.
  void raise_status(const call_info& call, const plan_status& seen) const {
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
      case st_bad_address:
        call.fail(errc::transport_error, call.peer(seen.peer) + " posted a message from a buffer it had not announced");
      default: {
        // A peer's kernel raised the abort flag as it failed: its host names the cause as soon
        // as that kernel has ended (a few microseconds; 200 ms at most here).
        int f = jobs_.first_failed();
        for (int i = 0; f < 0 && i < 200; ++i) {
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
          f = jobs_.first_failed();
        }
        call.fail(errc::peer_lost, "the job was aborted while waiting for " +
                                       (seen.peer >= 0 ? call.peer(seen.peer) : std::string("this rank's other blocks")) + ": " +
                                       (f >= 0 ? call.peer(f) + " failed: " + jobs_.why(f) : std::string("a rank failed")));
      }
    }
  }

  std::shared_ptr<group_base> g_;
  rank_view v_;
  device::job_view jobs_;
  cudaStream_t own_stream_ = nullptr;
  cudaStream_t stream_ = nullptr;
  dev_buffer tmp_, pack_, host_;
  dev_buffer bounce_[2];
  std::vector<local_copy_part> before_, after_;
  std::vector<std::shared_ptr<detail::stream_call>> slots_;
  std::uint64_t next_slot_ = 0;
  // (a work may be waited for on another thread than the one issuing the calls)
  std::unique_ptr<std::mutex> events_mu_ = std::make_unique<std::mutex>();
  std::vector<cudaEvent_t> events_, free_events_;
  std::vector<std::weak_ptr<detail::stream_call>> live_;
};

/// Runs f(comm) on n thread-ranks over cuda::transport (rank r on devices[r % size]) and
/// rethrows the first failure once every thread has ended, as collx::launch_threads does.
template <class F>
void launch_threads(int n, F&& f, options opts = {}, std::vector<int> devices = {0}) {
  if (n < 1) throw error(errc::invalid_argument, "cuda::launch_threads: the rank count must be at least 1, got " + std::to_string(n));
  // Each rank's stream needs its own hardware queue of the device (8 by default): streams beyond
  // them share queues in order, and a kernel waiting on a peer whose kernel is queued behind it
  // would wait until its deadline. Read when the process's CUDA context is made: set here when
  // the user has not (it takes effect if no context exists yet; tests/gpu/run.sh exports it).
  ::setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 0);
  auto g = std::make_shared<thread_group>(n, std::move(devices));
  std::mutex mu;
  std::vector<std::exception_ptr> failed(static_cast<std::size_t>(n));
  auto record = [&](int r, const char* why) {
    g->jobs().fail(r, why);
    std::lock_guard lk(mu);
    failed.at(static_cast<std::size_t>(r)) = std::current_exception();
  };
  auto body = [&](int r) {
    try {
      communicator<transport> comm{transport{g, r}, opts};
      f(comm);
      comm.transport().leave();
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
  const int cause = g->jobs().first_failed();
  if (cause >= 0 && failed[std::size_t(cause)]) std::rethrow_exception(failed[std::size_t(cause)]);
  for (auto& e : failed)
    if (e) std::rethrow_exception(e);
}

/// The device a process-rank uses: COLLX_CUDA_DEVICE if set, else its local rank modulo the
/// devices it sees (one device per local rank, as torchrun's LOCAL_RANK is used).
inline int device_for_local_rank(int local_rank) {
  if (const long long d = collx::detail::env_int("COLLX_CUDA_DEVICE", 0ll, 1023ll, -1ll); d >= 0) return int(d);
  int count = 0;
  check(cudaGetDeviceCount(&count), "cudaGetDeviceCount");
  if (count < 1) throw error(errc::transport_error, "collx::cuda: no CUDA device");
  return local_rank % count;
}

/// A process-rank of a job started by a launcher (mpirun, srun, torchrun: core/job_env.hpp),
/// bootstrapped over shared memory (or tcp with COLLX_BOOTSTRAP=tcp), on the device of its
/// local rank. A collective call of every rank of the job.
inline communicator<transport> from_env(options opts = {}) {
  const launch_info li = launch_info_from_env();
  const std::string b = collx::detail::env_string("COLLX_BOOTSTRAP", "shm");
  if (b != "shm" && b != "tcp") throw error(errc::invalid_argument, "COLLX_BOOTSTRAP must be shm or tcp, not \"" + b + "\"");
  communicator<collx::transport::any> boot =
      b == "tcp"
          ? communicator<collx::transport::any>{collx::transport::any(collx::transport::tcp::from_env()), opts}
          : communicator<collx::transport::any>{collx::transport::any(collx::transport::shm::from_env()), opts};
  return communicator<transport>{transport::over(std::move(boot), device_for_local_rank(li.local_rank), opts.timeout), opts};
}

/// Forks n process-ranks (launch/processes.hpp), rank r on devices[r % size] (default: r modulo
/// the devices there are), each bootstrapped over shared memory, runs f(comm) in each and
/// reports every child's failure. The calling process must not have used CUDA before: a child
/// of fork() cannot use a CUDA context its parent made.
template <class F>
void launch_processes(int n, F&& f, options opts = {}, std::vector<int> devices = {}) {
  if (n < 1) throw error(errc::invalid_argument, "cuda::launch_processes: the rank count must be at least 1, got " + std::to_string(n));
  const std::string job = collx::detail::unique_job_name();
  collx::detail::shm_job_cleanup cleanup{collx::transport::shm::segment_name(job)};
  collx::detail::launch_processes_with<collx::detail::no_decorator>(
      n, job,
      [&](const std::string& j, int r) {
        communicator<collx::transport::any> boot{collx::transport::any(collx::transport::shm(j, r, n, {})), opts};
        const int d = devices.empty() ? device_for_local_rank(r) : devices[std::size_t(r) % devices.size()];
        return transport::over(std::move(boot), d, opts.timeout);
      },
      std::forward<F>(f), opts);
}

}  // namespace collx::cuda
