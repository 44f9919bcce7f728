#pragma once
// Ranks as processes for device plans, without a GPU: features/device_ipc.hpp's peer_group over host
// memory, and the plan walked on the host across real processes.
//
// memfd_backend is the memory backend (features/device_ipc.hpp) of host memory: an allocation is a memfd
// mapped shared, exported as its descriptor (passed over the ranks' Unix sockets, as CUDA's VMM
// handles are) or, in the `opaque` mode, as bytes naming it (pid and descriptor number: a peer
// opens /proc/<pid>/fd/<n>, as a cudaIpcMemHandle_t is opened). memfd_alloc() is the user's
// allocator of exportable memory; anything else (a std::vector) cannot be exported, and is
// staged, as device memory from a pool that cannot be exported is.
//
// ipc_planned is a transport of ranks as processes that walks each call's device plan
// (device/plan.hpp's run_plan, one worker per rank) in the memory peer_group maps: the
// regions' inboxes and acks, the job block, the peers' buffers through the table each call's
// exchange fills, messages posted as (buffer, offset) pairs. Everything cuda::transport's
// process-ranks do but the kernel and the CUDA calls runs here.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <collx/collx.hpp>
#include <collx/features/device_ipc.hpp>
#include <collx/device/plan.hpp>

#include <map>
#include <mutex>
#include <thread>

namespace collx_test::ipc {

namespace dipc = collx::device::ipc;

struct memfd_allocation {
  std::byte* p = nullptr;
  std::size_t bytes = 0;  // mapped (whole pages)
  std::uint64_t id = 0;
  int fd = -1;
};

/// The process's memfd allocations, by address (what CUDA's driver knows of its allocations).
inline std::mutex& registry_mu() {
  static std::mutex m;
  return m;
}
inline std::map<const std::byte*, memfd_allocation>& registry() {
  static std::map<const std::byte*, memfd_allocation> r;
  return r;
}
inline std::uint64_t next_id() {
  static std::uint64_t k = 0;
  return ++k;
}

/// Exportable memory of `bytes` (zeroed), freed with memfd_free.
inline std::byte* memfd_alloc(std::size_t bytes) {
  const std::size_t size = (std::max<std::size_t>(bytes, 1) + 4095) / 4096 * 4096;
  const int fd = int(::syscall(SYS_memfd_create, "collx-test", MFD_CLOEXEC));
  if (fd < 0 || ::ftruncate(fd, off_t(size)) != 0) throw std::runtime_error("memfd_create");
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    ::close(fd);
    throw std::runtime_error("mmap");
  }
  std::lock_guard g(registry_mu());
  registry()[static_cast<std::byte*>(p)] = {static_cast<std::byte*>(p), size, next_id(), fd};
  return static_cast<std::byte*>(p);
}
inline void memfd_free(std::byte* p) noexcept {
  if (p == nullptr) return;
  std::lock_guard g(registry_mu());
  auto it = registry().find(p);
  if (it == registry().end()) return;
  ::munmap(it->second.p, it->second.bytes);
  ::close(it->second.fd);
  registry().erase(it);
}

/// A vector-like span of exportable memory.
template <class E>
struct shared_vec {
  E* p = nullptr;
  std::size_t n = 0;
  explicit shared_vec(std::size_t count) : p(reinterpret_cast<E*>(memfd_alloc(count * sizeof(E)))), n(count) {}
  explicit shared_vec(const std::vector<E>& v) : shared_vec(v.size()) { std::copy(v.begin(), v.end(), p); }
  shared_vec(const shared_vec&) = delete;
  shared_vec& operator=(const shared_vec&) = delete;
  ~shared_vec() { memfd_free(reinterpret_cast<std::byte*>(p)); }
  std::span<E> span() { return {p, n}; }
  std::span<const E> cspan() const { return {p, n}; }
  std::vector<E> get() const { return std::vector<E>(p, p + n); }
};

struct memfd_backend {
  using owned = memfd_allocation;
  /// fd: descriptors over the Unix sockets; opaque: /proc/<pid>/fd/<n> in the handle bytes.
  dipc::handle_kind mode = dipc::handle_kind::fd;
  int imports = 0, unmaps = 0;  // (the tests count them)
  std::chrono::milliseconds delay_import{0};  // a slow peer: import waits this long first

  owned allocate(std::size_t bytes) {
    std::byte* p = memfd_alloc(bytes);
    std::lock_guard g(registry_mu());
    return registry()[p];
  }
  void release(owned& o) noexcept {
    memfd_free(o.p);
    o.p = nullptr;
  }
  dipc::alloc_desc describe(const std::byte* p, std::size_t bytes, std::uint64_t& offset) const {
    dipc::alloc_desc d;
    offset = 0;
    std::lock_guard g(registry_mu());
    auto it = registry().upper_bound(p);
    if (p == nullptr || it == registry().begin()) return d;
    --it;
    const memfd_allocation& a = it->second;
    if (p < a.p || p + bytes > a.p + a.bytes) return d;
    d.id = a.id;
    d.size = a.bytes;
    d.kind = mode;
    if (mode == dipc::handle_kind::opaque) {
      const std::int64_t pid = ::getpid(), fd = a.fd;
      std::memcpy(d.handle.data(), &pid, sizeof pid);
      std::memcpy(d.handle.data() + 8, &fd, sizeof fd);
    }
    offset = std::uint64_t(p - a.p);
    return d;
  }
  int export_fd(const dipc::alloc_desc& d) const {
    std::lock_guard g(registry_mu());
    for (const auto& [p, a] : registry())
      if (a.id == d.id) return ::dup(a.fd);
    throw collx::error(collx::errc::transport_error, "memfd backend: no allocation " + std::to_string(d.id));
  }
  std::byte* import(const dipc::alloc_desc& d, int fd) {
    if (delay_import.count() > 0) std::this_thread::sleep_for(delay_import);
    int f = fd;
    if (d.kind == dipc::handle_kind::opaque) {
      std::int64_t pid = 0, n = 0;
      std::memcpy(&pid, d.handle.data(), sizeof pid);
      std::memcpy(&n, d.handle.data() + 8, sizeof n);
      const std::string path = "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(n);
      f = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
      if (f < 0) throw collx::error(collx::errc::transport_error, "memfd backend: cannot open " + path + ": " + std::strerror(errno));
    }
    void* p = ::mmap(nullptr, d.size, PROT_READ | PROT_WRITE, MAP_SHARED, f, 0);
    if (f != fd) ::close(f);
    if (p == MAP_FAILED) throw collx::error(collx::errc::transport_error, std::string("memfd backend: mmap: ") + std::strerror(errno));
    ++imports;
    return static_cast<std::byte*>(p);
  }
  void unmap(std::byte* base, const dipc::alloc_desc& d) noexcept {
    ::munmap(base, d.size);
    ++unmaps;
  }
  void write(std::byte* dst, const void* src, std::size_t bytes) const { std::memcpy(dst, src, bytes); }
  void* register_host(void* p, std::size_t) const { return p; }
  void unregister_host(void*) const noexcept {}
  std::array<std::uint8_t, 16> device_id() const { return {}; }
  const char* kind_name() const noexcept { return mode == dipc::handle_kind::fd ? "memfd, descriptors" : "memfd, /proc paths"; }
};

/// Ranks as processes walking device plans on the host in memory peer_group maps.
class ipc_planned {
 public:
  using transport_concept = collx::transport_tag;
  using memory_space = collx::host_memory;
  static constexpr const char* name = "ipc-planned";
  using group = dipc::peer_group<memfd_backend>;

  explicit ipc_planned(collx::communicator<collx::transport::any> boot, memfd_backend be = {},
                       std::chrono::nanoseconds timeout = std::chrono::seconds(20))
      : g_(std::make_unique<group>(std::move(boot), std::move(be), timeout)),
        spin_(collx::detail::spin_for(g_->size())) {}
  ipc_planned(ipc_planned&&) noexcept = default;
  ~ipc_planned() {
    if (!g_) return;
    for (auto* o : {&tmp_, &bounce_in_, &bounce_out_})
      if (o->p) g_->backend().release(*o);
  }

  int rank() const noexcept { return g_->rank(); }
  int size() const noexcept { return g_->size(); }
  group& grp() noexcept { return *g_; }
  /// The chunk a call is lowered for (every rank must use the same).
  void set_chunk(std::uint64_t bytes) noexcept { chunk_ = bytes == 0 ? kChunk : bytes; }
  /// Calls that staged a buffer they could not export, so far.
  int staged() const noexcept { return staged_; }

  void abort(const std::string& why) noexcept { g_->fail(rank(), why); }

  template <class E, class Op>
  void run_schedule(const collx::call_info& call, const collx::schedule& s, const E* in, E* out, const Op& op) {
    if (g_->aborted()) {
      const int f = g_->first_failed();
      call.fail(collx::errc::peer_lost, f == rank() ? "this rank already failed: " + g_->why(f)
                                                    : "the job was aborted: " + call.peer(f) + " failed: " + g_->why(f));
    }
    const collx::device::plan& pl = s.lowered<collx::device::plan>((std::uint64_t(sizeof(E)) << 48) ^ chunk_ ^ 0x1bc0000ull, [&] {
      return std::make_shared<const collx::device::plan>(collx::device::lower(s, size(), sizeof(E), chunk_));
    });
    const std::size_t tmp_bytes = s.tmp_elems() * sizeof(E);
    if (tmp_bytes > tmp_.bytes) {
      if (tmp_.p) g_->backend().release(tmp_);
      tmp_ = g_->backend().allocate(tmp_bytes);
    }
    std::byte* bufs[4] = {nullptr, reinterpret_cast<std::byte*>(const_cast<E*>(in)), reinterpret_cast<std::byte*>(out),
                          tmp_bytes ? tmp_.p : nullptr};
    // What the plan posts from must be exportable: memory that is not is staged.
    auto exportable = [&](const std::byte* p, std::uint64_t bytes) {
      std::uint64_t off = 0;
      return g_->backend().describe(p, bytes, off).kind != dipc::handle_kind::none;
    };
    auto stage = [&](int slot, std::size_t bytes) {
      owned_buffer& o = slot == 0 ? bounce_in_ : bounce_out_;
      if (bytes > o.bytes) {
        if (o.p) g_->backend().release(o);
        o = g_->backend().allocate(bytes);
      }
      return o.p;
    };
    if (dipc::stage_buffers(bufs, pl.extent, pl.posts_from, exportable, stage, before_, after_)) {
      ++staged_;
      for (const auto& c : before_) std::memcpy(c.dst, c.src, c.bytes);
    }
    dipc::buffer_ref refs[3];
    for (int b = 1; b <= 3; ++b)
      if ((pl.posts_from & (1u << b)) != 0 && pl.extent[b] != 0) refs[b - 1].a = g_->backend().describe(bufs[b], pl.extent[b], refs[b - 1].offset);
    g_->exchange(call, refs, table_);
    env<E, Op> e{this, &call, &op, {bufs[0], bufs[1], bufs[2], bufs[3]}};
    std::uint64_t* base = reinterpret_cast<std::uint64_t*>(g_->region() + g_->layout().bases());
    const auto n = std::size_t(size());
    const collx::device::bases b{base, base + n, base + 2 * n};
    collx::device::run_plan(pl.view(), b, e);  // the host env throws where the device's would return false
    for (std::size_t q = 0; q < n; ++q) {
      base[q] += pl.msgs_to[q];
      base[n + q] += pl.chunks_to[q];
      base[2 * n + q] += pl.msgs_from[q];
    }
    for (const auto& c : after_) std::memcpy(c.dst, c.src, c.bytes);
  }

 private:
  using owned_buffer = memfd_allocation;
  static constexpr std::uint64_t kChunk = 64 * 1024;

  void** tables() const noexcept { return reinterpret_cast<void**>(g_->region() + g_->layout().tables()); }
  void ring(int q) const noexcept {
    collx::detail::waitable& w = g_->doorbell(q);
    w.word.fetch_add(1, std::memory_order_seq_cst);
    if (w.sleepers.load(std::memory_order_seq_cst) != 0) w.wake(true);
  }

  template <class Ready>
  void wait_for(int q, const collx::call_info& call, const char* what, Ready ready) {
    if (ready()) return;
    auto check = [&] {
      if (ready()) return;
      g_->peer_gone();
      if (collx::detail::gone_unready([&] { return g_->left(q); }, ready))
        call.fail(collx::errc::peer_lost, call.peer(q) + " has left the communicator while this rank waited for it (" + what + ")");
      if (const int f = g_->first_failed(); f >= 0 && f != rank())
        call.fail(collx::errc::peer_lost, "the job was aborted while waiting for " + call.peer(q) + " (" + what + "): " + call.peer(f) +
                                              " failed: " + g_->why(f));
    };
    collx::detail::timed_wait tw(call, q);
    if (collx::detail::wait_on(g_->doorbell(rank()), ready, check, call.timeout, true, spin_, tw.hook()) ==
        collx::detail::wait_result::timed_out)
      call.timed_out(q, what);
  }

  template <class E, class Op>
  struct env {
    ipc_planned* t;
    const collx::call_info* call;
    const Op* op;
    std::byte* bufs[4];

    int worker() const noexcept { return 0; }
    int workers() const noexcept { return 1; }
    bool reversed() const noexcept { return false; }
    std::byte* base(std::uint8_t b) const noexcept { return bufs[b & 3]; }
    bool barrier() const noexcept { return true; }
    collx::device::inbox& in_from(int q) const { return *static_cast<collx::device::inbox*>(t->tables()[q]); }
    collx::device::inbox& out_to(int q) const { return *static_cast<collx::device::inbox*>(t->tables()[t->size() + q]); }
    collx::device::ack& acks_mine(int q) const { return *static_cast<collx::device::ack*>(t->tables()[2 * t->size() + q]); }
    collx::device::ack& acks_theirs(int q) const { return *static_cast<collx::device::ack*>(t->tables()[3 * t->size() + q]); }

    void post(int q, std::uint64_t index, std::uint8_t buf, std::uint64_t off, std::uint64_t bytes) {
      collx::device::inbox& box = out_to(q);
      collx::device::message& m = box.slots[index % collx::device::kSlots];
      m.addr = collx::device::address_of_buffer(buf, off);
      m.bytes = bytes;
      m.sig = call->sig.hash();
      std::atomic_ref<std::uint64_t>(box.posted).store(index + 1, std::memory_order_release);
      t->ring(q);
    }
    bool arrived(int q, std::uint64_t index, std::uint64_t bytes, const std::byte*& data) {
      collx::device::inbox& box = in_from(q);
      t->wait_for(q, *call, "its message", [&] { return std::atomic_ref<std::uint64_t>(box.posted).load(std::memory_order_acquire) > index; });
      const collx::device::message& m = box.slots[index % collx::device::kSlots];
      if (m.sig != call->sig.hash())
        call->fail(collx::errc::mismatch, "and " + call->peer(q) + " made different calls (its message's signature differs)");
      if (m.bytes != bytes)
        call->fail(collx::errc::mismatch, "expected " + std::to_string(bytes) + " B from " + call->peer(q) + " but it sent " +
                                              std::to_string(m.bytes) + " B (counts differ between ranks)");
      if (m.bytes == 0) {  // (read from nowhere: a message of no bytes names no buffer)
        data = nullptr;
        return true;
      }
      const std::uint8_t b = collx::device::buffer_of_address(m.addr);
      const std::uint64_t at = t->table_[std::size_t(q) * 3 + std::size_t(b) - 1];
      if ((m.addr & collx::device::kBufferAddress) == 0 || b < 1 || b > 3 || at == 0)
        call->fail(collx::errc::transport_error, call->peer(q) + " posted from a buffer it did not announce");
      data = reinterpret_cast<const std::byte*>(at + collx::device::offset_of_address(m.addr));
      return true;
    }
    void copy(std::byte* d, const std::byte* s, std::uint64_t bytes) const { std::memcpy(d, s, bytes); }
    void move(std::byte* d, const std::byte* s, std::uint64_t bytes) const { std::memmove(d, s, bytes); }
    void combine(int, std::byte* d, const std::byte* with, const std::byte* recv, std::uint64_t bytes, std::uint8_t how) {
      const std::size_t n = bytes / sizeof(E);
      if (how == std::uint8_t(collx::combine::copy)) {
        std::memcpy(d, recv, bytes);
      } else if constexpr (!std::is_same_v<Op, collx::no_op>) {
        auto* dst = reinterpret_cast<E*>(d);
        const auto* w = reinterpret_cast<const E*>(with);
        const auto* r = reinterpret_cast<const E*>(recv);
        if (how == std::uint8_t(collx::combine::received_left)) collx::ops::apply<E>(*op, dst, r, w, n);
        else collx::ops::apply<E>(*op, dst, w, r, n);
      }
    }
    void take(int q) {
      std::atomic_ref<std::uint64_t>(acks_theirs(q).taken).fetch_add(1, std::memory_order_release);
      t->ring(q);
    }
    bool taken(int q, std::uint64_t chunks) {
      collx::device::ack& k = acks_mine(q);
      t->wait_for(q, *call, "it to take this rank's message",
                  [&] { return std::atomic_ref<std::uint64_t>(k.taken).load(std::memory_order_acquire) >= chunks; });
      return true;
    }
  };

  std::unique_ptr<group> g_;
  int spin_;
  std::uint64_t chunk_ = kChunk;
  owned_buffer tmp_{}, bounce_in_{}, bounce_out_{};
  dipc::peer_table table_;
  std::vector<collx::local_copy_part> before_, after_;
  int staged_ = 0;
};

/// Processes over shm with a type-erased communicator (what ipc_planned is bootstrapped on).
struct processes_any {
  template <class F>
  void operator()(int n, F&& f) const { collx::launch_processes<collx::transport::as_any>(n, std::forward<F>(f)); }
};

/// Processes over shm, each running its collectives over ipc_planned (bootstrapped on a
/// communicator split from the job's).
template <dipc::handle_kind Mode = dipc::handle_kind::fd, std::uint64_t Chunk = 0>
struct processes_ipc {
  template <class F>
  void operator()(int n, F&& f, collx::options o = {}) const {
    collx::launch_processes<collx::transport::as_any>(n, [&](auto& comm) {
      memfd_backend be;
      be.mode = Mode;
      collx::communicator<ipc_planned> c{ipc_planned(comm.split(0, comm.rank(), "ipc-boot"), be), o};
      c.transport().set_chunk(Chunk);
      f(c);
    }, o);
  }
};

}  // namespace collx_test::ipc
