#pragma once
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
//
// Defined apart, by responsibility: device buffers (cuda/buffers.cuh), the two kinds of group
// (cuda/groups.cuh), plans in device memory (cuda/device_plan.cuh), and the launchers
// (cuda/launch.cuh).
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
#include "device_plan.cuh"

namespace collx::cuda {

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

}  // namespace collx::cuda

#include "launch.cuh"
