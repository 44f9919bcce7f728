#pragma once
// transport::planned: ranks are threads of one process, and each call's schedule is lowered to
// the device plan (device/plan.hpp) that transport::cuda's kernel walks, then walked here on the
// host by the very same run_plan(), with host memory and host atomics. It is what tests the
// lowering and the pull protocol of the device path on machines without a GPU (every
// collective, policy and rank count against the serial reference: tests/test_plan.cpp), and a
// working single-copy transport between threads in its own right.
//
//   collx::launch_threads<collx::transport::planned>(8, [](auto& comm) { ... });
//
// It stands on transport::inproc's group for liveness, doorbells and splits; its own state is
// each ordered pair's counters and mailbox (the layout the device keeps in peer memory), made
// once per group. A waiting rank sleeps on its doorbell, which a peer rings when it posts to it
// or takes one of its chunks; every wait has the call's deadline and ends when a peer fails.
#include <atomic>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "../core/concepts.hpp"
#include "../core/wait.hpp"
#include "../device/plan.hpp"
#include "../core/error.hpp"
#include "../ops/apply.hpp"
#include "../core/call_info.hpp"
#include "../core/split_plan.hpp"
#include "inproc.hpp"

namespace collx::transport {

template <class Inner = inproc>
class planned {
  static_assert(std::is_same_v<Inner, inproc>, "collx: transport::planned runs over transport::inproc's group");

 public:
  using transport_concept = transport_tag;
  using memory_space = host_memory;
  static constexpr const char* name = "planned";
  /// Bytes a rank moves at a time (device/plan.hpp: chunk); every chunk is taken separately.
  static constexpr std::uint64_t kChunk = 64 * 1024;

  struct message {
    const std::byte* data = nullptr;
    std::uint64_t bytes = 0;
    call_signature sig;
  };
  struct alignas(64) pair {
    std::atomic<std::uint64_t> posted{0};
    alignas(64) std::atomic<std::uint64_t> taken{0};
    // 1 while the receiver reads the sender's memory: a failing sender waits for it to drop
    // before it unwinds (inproc's rule).
    std::atomic<std::uint32_t> reading{0};
    alignas(64) message slots[device::kSlots];
  };
  /// Every ordered pair's counters and mailbox, shared by the group's ranks.
  struct channels {
    explicit channels(int n) : n_(n), pairs_(std::size_t(n) * std::size_t(n)) {}
    pair& at(int from, int to) noexcept { return pairs_[std::size_t(from) * std::size_t(n_) + std::size_t(to)]; }
    int n_;
    std::vector<pair> pairs_;
  };

  explicit planned(Inner t)
      : t_(std::move(t)), ch_(&t_.shared_group()->template extension<channels>()),
        sent_(std::size_t(t_.size()), 0), taken_(std::size_t(t_.size()), 0), received_(std::size_t(t_.size()), 0),
        spin_(detail::spin_for(t_.size(), t_.shared_group()->cores())) {}

  int rank() const noexcept { return t_.rank(); }
  int size() const noexcept { return t_.size(); }
  Inner& inner() noexcept { return t_; }
  const Inner& inner() const noexcept { return t_; }
  /// The chunk a call is lowered for (tests make it small to cut messages into many chunks).
  /// Every rank must use the same: both sides count a message's chunks.
  void set_chunk(std::uint64_t bytes) noexcept { chunk_ = bytes == 0 ? kChunk : bytes; }
  /// Walks each phase's copies and receives last to first (tests: a plan's result must not
  /// depend on the order of the work within a phase, which the device's blocks share out).
  void set_reversed(bool r) noexcept { reversed_ = r; }

  void abort(const std::string& why) noexcept {
    t_.abort(why);
    for (int q = 0; q < size(); ++q)
      while (ch_->at(rank(), q).reading.load(std::memory_order_seq_cst) != 0) detail::cpu_relax();
  }
  void leave() noexcept { t_.leave(); }
  split_offer prepare_split() { return t_.prepare_split(); }
  planned split(const split_plan& p, split_offer&& o) const { return planned(t_.split(p, std::move(o))); }

  template <class E, class Op>
  void run_schedule(const call_info& call, const schedule& s, const E* in, E* out, const Op& op) {
    check_live(call);
    // Lowered once per cached schedule, element size and chunk (schedule::lowered).
    const device::plan& p = s.lowered<device::plan>((std::uint64_t(sizeof(E)) << 48) ^ chunk_, [&] {
      return std::make_shared<const device::plan>(device::lower(s, size(), sizeof(E), chunk_));
    });
    tmp_.resize(s.tmp_elems() * sizeof(E) + 16);
    env<E, Op> e{this, &call, &op, {nullptr, reinterpret_cast<std::byte*>(const_cast<E*>(in)), reinterpret_cast<std::byte*>(out),
                                    s.tmp_elems() ? tmp_.data() : nullptr}, reversed_};
    const device::bases b{sent_.data(), taken_.data(), received_.data()};
    device::run_plan(p.view(), b, e);  // the host env throws where the device's would return false
    for (std::size_t q = 0; q < sent_.size(); ++q) {
      sent_[q] += p.msgs_to[q];
      taken_[q] += p.chunks_to[q];
      received_[q] += p.msgs_from[q];
    }
  }

 private:
  using state = inproc::rank_state;

  void check_live(const call_info& call) const {
    if (const state me = group().state(rank()); me != state::live)
      call.fail(errc::peer_lost, me == state::failed ? "this rank already failed: " + group().why(rank())
                                                     : std::string("this rank has already left the communicator"));
  }
  inproc::group& group() const noexcept { return *t_.shared_group(); }

  /// Waits until ready() holds: peer q's failure, or its leaving, ends the wait with peer_lost
  /// (a failure anywhere does: the job is aborted); the deadline with a timeout naming q.
  template <class Ready>
  void wait_for(int q, const call_info& call, const char* what, Ready ready) {
    if (ready()) return;
    auto check = [&] {
      if (ready()) return;
      if (const int f = group().first_failed(); f >= 0 && f != rank())
        call.fail(errc::peer_lost, "the job was aborted while waiting for " + call.peer(q) + " (" + what + "): " + call.peer(f) +
                                       " failed: " + group().why(f));
      if (detail::gone_unready([&] { return group().state(q) != state::live; }, ready))
        call.fail(errc::peer_lost, call.peer(q) + " has left the communicator while this rank waited for it (" + what + ")");
    };
    detail::timed_wait tw(call, q);
    if (detail::wait_on(group().doorbell(rank()), ready, check, call.timeout, false, spin_, tw.hook()) == detail::wait_result::timed_out)
      call.timed_out(q, what);
  }

  /// The host's run_plan environment: one worker per rank.
  template <class E, class Op>
  struct env {
    planned* t;
    const call_info* call;
    const Op* op;
    std::byte* bufs[4];  // indexed by collx::buf: none, in, out, tmp

    bool rev;
    int worker() const noexcept { return 0; }
    int workers() const noexcept { return 1; }
    bool reversed() const noexcept { return rev; }
    std::byte* base(std::uint8_t b) const noexcept { return bufs[b & 3]; }
    bool barrier() const noexcept { return true; }

    void post(int q, std::uint64_t index, std::uint8_t buf, std::uint64_t off, std::uint64_t bytes) {
      pair& c = t->ch_->at(t->rank(), q);
      message& m = c.slots[index % device::kSlots];
      m.data = base(buf) + off;
      m.bytes = bytes;
      m.sig = call->sig;
      c.posted.store(index + 1, std::memory_order_release);
      t->group().ring(q);
    }
    bool arrived(int q, std::uint64_t index, std::uint64_t bytes, const std::byte*& data) {
      pair& c = t->ch_->at(q, t->rank());
      t->wait_for(q, *call, "its message", [&] { return c.posted.load(std::memory_order_acquire) > index; });
      const message& m = c.slots[index % device::kSlots];
      call->check_match(q, m.sig, m.bytes, bytes);
      call->heard(q, m.sig);
      data = m.data;
      return true;
    }
    void copy(std::byte* d, const std::byte* s, std::uint64_t bytes) const { std::memcpy(d, s, bytes); }
    void move(std::byte* d, const std::byte* s, std::uint64_t bytes) const { std::memmove(d, s, bytes); }
    void combine(int q, std::byte* d, const std::byte* with, const std::byte* recv, std::uint64_t bytes, std::uint8_t how) {
      // Reading q's memory: raise `reading`, then make sure q has not failed (and unwound) meanwhile.
      pair& c = t->ch_->at(q, t->rank());
      c.reading.store(1, std::memory_order_seq_cst);
      if (t->group().state(q) == state::failed) {
        c.reading.store(0, std::memory_order_seq_cst);
        call->fail(errc::peer_lost, call->peer(q) + " failed: " + t->group().why(q));
      }
      const std::size_t n = bytes / sizeof(E);
      if (how == std::uint8_t(collx::combine::copy)) {
        std::memcpy(d, recv, bytes);
      } else if constexpr (!std::is_same_v<Op, no_op>) {
        auto* dst = reinterpret_cast<E*>(d);
        const auto* w = reinterpret_cast<const E*>(with);
        const auto* r = reinterpret_cast<const E*>(recv);
        if (how == std::uint8_t(collx::combine::received_left)) ops::apply<E>(*op, dst, r, w, n);
        else ops::apply<E>(*op, dst, w, r, n);
      }
      c.reading.store(0, std::memory_order_seq_cst);
    }
    void take(int q) {
      t->ch_->at(q, t->rank()).taken.fetch_add(1, std::memory_order_release);
      t->group().ring(q);
    }
    bool taken(int q, std::uint64_t chunks) {
      pair& c = t->ch_->at(t->rank(), q);
      t->wait_for(q, *call, "it to take this rank's message", [&] { return c.taken.load(std::memory_order_acquire) >= chunks; });
      return true;
    }
  };

  Inner t_;
  channels* ch_;
  std::vector<std::uint64_t> sent_, taken_, received_;
  std::vector<std::byte> tmp_;
  std::uint64_t chunk_ = kChunk;
  bool reversed_ = false;
  int spin_;
};

}  // namespace collx::transport
