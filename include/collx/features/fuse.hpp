#pragma once
// collx::fused: several calls issued as one, as NCCL's ncclGroupStart/End and torch's
// coalescing manager do.
//
//   collx::fused f(comm);
//   for (auto& g : small_grads) f.all_reduce(std::span{g}, collx::ops::sum{});
//   f.broadcast(std::span{flags}, 0);
//   f.send(std::span{act}, next).recv(std::span{grad}, next);
//   f.run();                          // or: collx::work w = f.launch(); ... w.wait();
//
// - All-reduces of one element type, op and policy (an op without state: every op collx has;
//   a policy with the same parameters) run as one all_reduce over their buffers where they are
//   (core/concepts.hpp: pieces): one message per peer per step, the latency of one call for all of
//   them, and no copy in or out. Over a transport that cannot move such spread buffers they
//   are packed into the communicator's pack buffer and copied back. Packed, each element is
//   reduced as in a call of the packed size (an op that is not associative in floating point may
//   round differently from the separate calls; integers and exact ops give the same result).
// - Sends and receives are posted together, in one step: two ranks may send to each other, and a
//   pipeline stage sends forward and receives backward at once (a separate send and recv would
//   each wait for the other side in turn).
// - Everything else runs back to back, in the order added, as one call on the communicator's
//   queue: no hand-off or synchronisation between them.
// The calls run in the order of their first appearance (a pack where its first all_reduce was
// added, the sends and receives where the first of them was). Every rank must add the same calls
// in the same order; the buffers belong to the batch until it has run.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <type_traits>
#include <vector>

#include "async.hpp"

namespace collx {

template <class T>
class fused {
 public:
  explicit fused(communicator<T>& comm) : comm_(&comm) {}
  fused(const fused&) = delete;
  fused& operator=(const fused&) = delete;

  /// In place, packed with the batch's other all-reduces of E, Op and Algo.
  template <class E, class Op, class Algo = algo::automatic>
    requires(!detail::is_span_v<Op>)
  fused& all_reduce(std::span<E> buf, Op op, Algo a = {}) {
    return add_reduce<E>(buf.data(), buf.data(), buf.size(), op, a);
  }
  template <class E, class Op, class Algo = algo::automatic>
  fused& all_reduce(std::span<const std::type_identity_t<E>> in, std::span<E> out, Op op, Algo a = {}) {
    if (in.size() != out.size()) {
      // Left to the call itself, which fails the communicator with the usual message.
      return then([in, out, op, a](communicator<T>& c) { collx::all_reduce(c, in, out, op, a); });
    }
    return add_reduce<E>(in.data(), out.data(), in.size(), op, a);
  }

  /// Posted in one step with the batch's other sends and receives.
  template <class E>
  fused& send(std::span<E> data, int peer) {
    return add_p2p(peer, reinterpret_cast<const std::byte*>(data.data()), nullptr, data.size_bytes(), sizeof(E));
  }
  template <class E>
  fused& recv(std::span<E> data, int peer) {
    static_assert(!std::is_const_v<E>, "collx: recv needs a writable span");
    return add_p2p(peer, nullptr, reinterpret_cast<std::byte*>(data.data()), data.size_bytes(), sizeof(E));
  }

  // The rest: in order, back to back.
#define COLLX_FUSED_CALL(name)                                                         \
  template <class... A>                                                                \
  fused& name(A... args) {                                                             \
    return then([args...](communicator<T>& c) { ::collx::name(c, args...); });        \
  }
  COLLX_FUSED_CALL(reduce_scatter)
  COLLX_FUSED_CALL(all_gather)
  COLLX_FUSED_CALL(broadcast)
  COLLX_FUSED_CALL(reduce)
  COLLX_FUSED_CALL(all_to_all)
  COLLX_FUSED_CALL(all_to_all_v)
  COLLX_FUSED_CALL(gather)
  COLLX_FUSED_CALL(scatter)
  COLLX_FUSED_CALL(barrier)
#undef COLLX_FUSED_CALL

  /// Any call, f(comm), in its place in the batch.
  fused& then(std::function<void(communicator<T>&)> f) {
    items_.push_back(std::make_shared<generic>(std::move(f)));
    return *this;
  }

  /// The whole batch as one nonblocking call; the batch is empty again after.
  work launch() {
    return detail::submit(*comm_, "fused", [items = take(), c = comm_] {
      for (auto& i : items) i->run(*c);
    });
  }
  /// The whole batch as one blocking call, in its turn on this thread, after the nonblocking
  /// calls issued before it (as every blocking call: no hand-off to the progress thread); empty
  /// again after, also when it fails.
  void run() {
    const auto items = take();
    const detail::call_queue::turn turn(detail::queue_of(*comm_, "fused"), "fused");
    for (auto& i : items) i->run(*comm_);
  }

  std::size_t size() const noexcept { return items_.size(); }

 private:
  struct item {
    virtual ~item() = default;
    virtual void run(communicator<T>& c) = 0;
  };
  struct generic final : item {
    std::function<void(communicator<T>&)> f;
    explicit generic(std::function<void(communicator<T>&)> x) : f(std::move(x)) {}
    void run(communicator<T>& c) override { f(c); }
  };
  template <class E, class Op, class Algo>
  struct pack final : item {
    struct part {
      const E* in;
      E* out;
      std::size_t n;
    };
    Op op;
    Algo algo;
    std::vector<part> parts;
    pieces spread;  // the parts as one buffer
    std::vector<local_copy_part> packing, unpacking;  // else: the copies into a pack buffer and back
    pack(Op o, Algo a) : op(o), algo(a) {}
    void run(communicator<T>& c) override {
      if (parts.size() == 1) {
        const part& p = parts[0];
        if (p.in == p.out) collx::all_reduce(c, std::span<E>(p.out, p.n), op, algo);
        else collx::all_reduce(c, std::span<const E>(p.in, p.n), std::span<E>(p.out, p.n), op, algo);
        return;
      }
      std::size_t total = 0;
      for (const part& p : parts) total += p.n;
      if constexpr (!algo::is_compressed_v<Algo>) {  // (algo::compressed encodes one flat buffer: its batch is packed)
        if (detail::takes_pieces(c.transport())) {
          // One all_reduce over the parts where they are (core/concepts.hpp: pieces): in place, each
          // part's input first copied to its output when they differ.
          spread.at.assign(1, 0);
          spread.base.clear();
          spread.at.reserve(parts.size() + 1);
          spread.base.reserve(parts.size());
          for (const part& p : parts) {
            if (p.in != p.out && p.n != 0) std::memcpy(p.out, p.in, p.n * sizeof(E));
            spread.base.push_back(reinterpret_cast<std::byte*>(p.out));
            spread.at.push_back(spread.at.back() + p.n * sizeof(E));
          }
          auto call = detail::make_call<E, Op>(c, "all_reduce", Algo::name, total);
          detail::all_reduce_impl<T, E>(c, call, detail::spread_buffers<E>{&spread, &spread}, total, op, algo);
          return;
        }
      }
      // A transport that cannot move spread buffers: the parts are packed into a pack buffer,
      // reused from call to call, never initialised (a training step packs the same shapes
      // every time): the communicator's in host memory; in the transport's own memory (a
      // device's) through its pack_buffer and copy_local, never a host memcpy on its pointers.
      std::byte* raw = nullptr;
      if constexpr (detail::host_memory_v<T>) {
        raw = c.pack_buffer(total * sizeof(E));
      } else {
        static_assert(requires(T& t) { { t.pack_buffer(std::size_t{}) } -> std::same_as<std::byte*>; },
                      "collx: fused all-reduces over a transport whose memory_space is not host_memory need its "
                      "`std::byte* pack_buffer(std::size_t bytes)` (memory of its space, kept from call to call)");
        raw = c.transport().pack_buffer(total * sizeof(E));
      }
      // Packed and unpacked in one copy_local each (a device transport waits once, not once a
      // part).
      E* buf = reinterpret_cast<E*>(raw);
      packing.clear();
      unpacking.clear();
      std::size_t at = 0;
      for (const part& p : parts) {
        if (p.n != 0) {
          auto* packed = reinterpret_cast<std::byte*>(buf + at);
          packing.push_back({packed, reinterpret_cast<const std::byte*>(p.in), p.n * sizeof(E)});
          unpacking.push_back({reinterpret_cast<std::byte*>(p.out), packed, p.n * sizeof(E)});
        }
        at += p.n;
      }
      detail::local_copies(c.transport(), std::span<const local_copy_part>(packing));
      collx::all_reduce(c, std::span<E>(buf, total), op, algo);
      detail::local_copies(c.transport(), std::span<const local_copy_part>(unpacking));
    }
  };
  struct p2p final : item {
    struct msg {
      int peer;
      const std::byte* src;  // a send
      std::byte* dst;        // a receive
      std::size_t bytes;
    };
    std::vector<msg> msgs;
    std::size_t elem = 0;  // the element size they share, or 1 when they differ
    void run(communicator<T>& c) override {
      call_info call = detail::p2p_call<std::byte>(c);
      call.sig.elem_size = std::uint32_t(elem == 0 ? 1 : elem);
      for (const msg& m : msgs) detail::check_peer(c, call, m.peer, m.src ? "fused send" : "fused recv");
      // Regions are offsets from the lowest address of each side (the executor's in and out).
      auto low = [&](bool sends) {
        std::uintptr_t lo = UINTPTR_MAX;
        for (const msg& m : msgs)
          if ((m.src != nullptr) == sends && m.bytes != 0)
            lo = std::min(lo, reinterpret_cast<std::uintptr_t>(sends ? m.src : m.dst));
        return lo == UINTPTR_MAX ? std::uintptr_t(0) : lo;
      };
      const std::uintptr_t in0 = low(true), out0 = low(false);
      schedule s;
      for (const msg& m : msgs) {
        if (m.src != nullptr) s.send(m.peer, {buf::in, m.bytes ? reinterpret_cast<std::uintptr_t>(m.src) - in0 : 0, m.bytes});
        else s.recv(m.peer, {buf::out, m.bytes ? reinterpret_cast<std::uintptr_t>(m.dst) - out0 : 0, m.bytes});
      }
      detail::execute(c, call, s, reinterpret_cast<const std::byte*>(in0), reinterpret_cast<std::byte*>(out0), no_op{});
    }
  };

  template <class E, class Op, class Algo>
  fused& add_reduce(const E* in, E* out, std::size_t n, Op op, Algo a) {
    static_assert(detail::check_reducing<E, Op, Algo>());
    if constexpr (std::is_empty_v<Op>) {
      // One pack per element type, op and policy, the policy's parameters included (ring's
      // chunk size): the key of its schedules (comm/schedule_cache.hpp). The pack added to
      // last is looked at first: a batch adds runs of alike calls.
      static constexpr char kind = 0;  // one per <E, Op, Algo>
      std::optional<detail::schedule_key> key;  // built when needed: not for a policy without parameters
      auto key_of = [&]() -> const detail::schedule_key& {
        if (!key) {
          key.emplace().kind = &kind;
          detail::add_fields(*key, a);
        }
        return *key;
      };
      auto alike = [&](const detail::schedule_key& k) { return k.kind == &kind && (std::is_empty_v<Algo> || k == key_of()); };
      if (last_ >= packs_.size() || !alike(packs_[last_].first)) {
        last_ = 0;
        while (last_ < packs_.size() && !alike(packs_[last_].first)) ++last_;
        if (last_ == packs_.size()) {
          auto p = std::make_shared<pack<E, Op, Algo>>(op, a);
          packs_.push_back({key_of(), p.get()});
          items_.push_back(std::move(p));
        }
      }
      static_cast<pack<E, Op, Algo>*>(packs_[last_].second)->parts.push_back({in, out, n});
    } else {
      auto p = std::make_shared<pack<E, Op, Algo>>(op, a);
      p->parts.push_back({in, out, n});
      items_.push_back(std::move(p));
    }
    return *this;
  }

  fused& add_p2p(int peer, const std::byte* src, std::byte* dst, std::size_t bytes, std::size_t elem) {
    if (!p2p_) {
      auto p = std::make_shared<p2p>();
      p2p_ = p.get();
      items_.push_back(std::move(p));
    }
    p2p_->msgs.push_back({peer, src, dst, bytes});
    p2p_->elem = p2p_->elem == 0 || p2p_->elem == elem ? elem : 1;
    return *this;
  }

  /// The batch's calls, leaving it empty.
  std::vector<std::shared_ptr<item>> take() {
    auto items = std::move(items_);
    items_.clear();
    packs_.clear();
    last_ = SIZE_MAX;
    p2p_ = nullptr;
    return items;
  }

  communicator<T>* comm_;
  std::vector<std::shared_ptr<item>> items_;
  std::vector<std::pair<detail::schedule_key, item*>> packs_;
  std::size_t last_ = SIZE_MAX;  // the pack added to last (in packs_)
  p2p* p2p_ = nullptr;
};

}  // namespace collx
