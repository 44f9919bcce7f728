#pragma once
// The two kinds of group a collx::cuda::transport belongs to: thread-ranks of one process
// (thread_group, with the device residency every group of the process shares), and process-ranks,
// one device each, whose memory reaches each other through features/device_ipc.hpp
// (process_group). Part of cuda/transport.cuh (include that).
#if !defined(__CUDACC__)
#error "collx/cuda/*.cuh headers compile only under nvcc"
#endif
#include "buffers.cuh"

namespace collx::cuda {

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

}  // namespace collx::cuda
