#pragma once
// The progress engine: the one loop that runs a step's sends and receives, over any transport.
//
// A transport supplies a channel: how to move one send or one receive a little further, whether
// anything could move now, how to sleep until something might, and what became of a peer. The
// engine owns everything else, once, for every transport:
//
//  - order: messages to or from one peer share a stream, so only the first unfinished one per
//    peer moves (core/concepts.hpp: may_progress); a channel that queues its sends
//    (step's `Pipeline`) may post a send once every earlier one to that peer is posted;
//  - the pending count, and the fast path: a step whose operations all move in the first sweep
//    (an 8-byte all_reduce between two ranks of one host) reads no clock, records nothing and
//    looks at no peer's state;
//  - the wait: spin (iterations or a time), yield, then sleep in slices (core/wait.hpp says why
//    each), the deadline from the moment the wait blocks, measured again after every move;
//  - the flight record (core/call_info.hpp: timed_wait) and the rank's sign of life;
//  - liveness and blame: a peer this step waits for that failed or left ends the wait, but only
//    after looking once more whether what it did before it went lets the step go on (gone, then
//    ready: core/wait.hpp, gone_unready); a failure anywhere else in the job ends it too, naming
//    the rank that failed; at the deadline, errc::timeout naming the peer and what was awaited.
//
// A channel C (a transport's class, or one it owns) keeps a step<S, R, Pipeline> (S and R: its
// per-operation state, reset every step) and has:
//   using token                            what arm() returns: a futex word's value, or empty
//   moved try_send(step&, std::size_t i)   post, or move on, send i
//   moved try_recv(step&, std::size_t i)   post, or move on, receive i
//   token arm()                            read before the last look: a change after it wakes sleep()
//   void sleep(step&, token, nanoseconds)   at most that long, less when something may move
//   waiting spinning() const               how long to spin and yield before sleeping
//   fate fate_of(int p)                    whether p is live, left or failed (a peer that died: failed)
//   std::string why(int p)                 why p is gone, said after "lost <p>: "
//   int failed_rank()                      a rank that failed anywhere in the job, or -1
//   std::string failure(int f)             the reason that rank gave
// and optionally (each found with `requires`; each has a default):
//   bool ready(const step&)             cheap, no side effects: could anything move? Without
//                                          it the engine spins and waits by sweeping.
//   void open(step&)                    once per step, before the first sweep
//   bool service(step&)                 work of the channel's own each sweep (tcp: owed cts)
//   bool stalled(step&)                 between sleeps: true when it moved something itself
//                                          (shm's trickle); may throw (a mismatch seen there)
//   bool hold(step&)                    nothing moved: true to sweep again at once (shm's
//                                          spin for a single-copy acknowledgement)
//   const char* waiting_for(const step&, bool send, std::size_t i)   the timeout's words
//   void before_timeout(const call_info&)  tcp asks its peers where they are
// and, for recv_any (see wait_any):
//   int probe_head(std::span<const int> peers, const call_info&, bool slow)
//   void sleep_any(std::span<const int> peers, token, nanoseconds)
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <string>
#include <vector>

#include "../core/call_info.hpp"
#include "../core/concepts.hpp"
#include "../core/error.hpp"
#include "../core/wait.hpp"

namespace collx::engine {

/// What one try_send or try_recv did: nothing; some of it; a send posted whole that waits for
/// its acknowledgement (it no longer holds back later sends to its peer in a pipelining
/// channel); the operation is complete.
enum class moved : std::uint8_t { nothing, some, handed, done };
/// `some` when anything moved, else `nothing`: what an operation that is not finished returns.
constexpr moved some_if(bool any) noexcept { return any ? moved::some : moved::nothing; }

/// What became of a peer.
enum class fate : std::uint8_t { live, left, failed };

/// How a wait spins before it sleeps: `spins` passes (or, when `spin_time` is set, passes
/// for that long), then `yields` sched_yield()s.
struct waiting {
  int spins = detail::kSpinIterations;
  std::chrono::nanoseconds spin_time{0};
  int yields = detail::kYieldIterations;
};

/// One operation's progress: the engine's flags and the channel's own state.
template <class S>
struct op {
  bool done = false;    // (may_progress reads it)
  bool handed = false;  // posted whole, awaiting its acknowledgement
  S s{};
};

/// The step being run, with the channel's per-operation state S (sends) and R (receives);
/// `Pipeline`: the send order rule of a channel that queues its sends (see the top). A
/// transport keeps one as a member: its vectors are reused, so a warm step allocates nothing.
template <class S, class R, bool Pipeline = false>
struct step {
  using send_state = S;
  using recv_state = R;
  std::span<const send_desc> sends;
  std::span<const recv_desc> recvs;
  const exchange_context* ctx = nullptr;
  const call_info* call = nullptr;
  std::vector<op<S>> so;
  std::vector<op<R>> ro;
  std::size_t pending = 0;

  /// Whether send i may move now (the order rule).
  bool send_open(std::size_t i) const {
    if constexpr (Pipeline) {
      for (std::size_t j = 0; j < i; ++j)
        if (!so[j].done && !so[j].handed && sends[j].peer == sends[i].peer) return false;
      return true;
    } else {
      return may_progress(sends, so, i);
    }
  }
  /// A step two channels share (exchange_pair) may order a receive here after receives on the
  /// other channel (a chain of reductions into one buffer that crosses them): `gate(gate_ctx,
  /// i)` says whether receive i's are done. Null for a step of one channel.
  bool (*gate)(const void*, std::size_t) = nullptr;
  const void* gate_ctx = nullptr;

  bool recv_open(std::size_t i) const { return may_progress(recvs, ro, i) && (gate == nullptr || gate(gate_ctx, i)); }
  /// Calls f(peer, send, i) for every unfinished operation that may move now (what a
  /// channel that sleeps in poll() waits on).
  template <class F>
  void each_open(F&& f) const {
    for (std::size_t i = 0; i < sends.size(); ++i)
      if (!so[i].done && send_open(i)) f(sends[i].peer, true, i);
    for (std::size_t i = 0; i < recvs.size(); ++i)
      if (!ro[i].done && recv_open(i)) f(recvs[i].peer, false, i);
  }
};

namespace detail_engine {

template <class C, class St>
bool sweep(C& c, St& s) {
  bool m = false;
  if constexpr (requires { c.service(s); }) m = c.service(s);
  for (std::size_t i = 0; i < s.sends.size(); ++i) {
    auto& o = s.so[i];
    if (o.done || !s.send_open(i)) continue;
    switch (c.try_send(s, i)) {
      case moved::nothing: break;
      case moved::some: m = true; break;
      case moved::handed: m = true; o.handed = true; break;
      case moved::done: m = true; o.done = true; --s.pending; break;
    }
  }
  for (std::size_t i = 0; i < s.recvs.size(); ++i) {
    auto& o = s.ro[i];
    if (o.done || !s.recv_open(i)) continue;
    switch (c.try_recv(s, i)) {
      case moved::nothing: break;
      case moved::some:
      case moved::handed: m = true; break;
      case moved::done: m = true; o.done = true; --s.pending; break;
    }
  }
  return m;
}

/// Whether anything may move: the channel's cheap test, or (without one) a sweep, which moves it.
template <class C, class St>
bool may_move(C& c, St& s) {
  if constexpr (requires { c.ready(s); }) return c.ready(s);
  else return sweep(c, s);
}

/// The first operation still pending (receives first) and what it awaits: whom a wait blames.
template <class C, class St>
int first_pending(C& c, const St& s, const char*& what) {
  for (std::size_t i = 0; i < s.recvs.size(); ++i)
    if (!s.ro[i].done) {
      if constexpr (requires { c.waiting_for(s, false, i); }) what = c.waiting_for(s, false, i);
      else what = "its data";
      return s.recvs[i].peer;
    }
  for (std::size_t i = 0; i < s.sends.size(); ++i)
    if (!s.so[i].done) {
      if constexpr (requires { c.waiting_for(s, true, i); }) what = c.waiting_for(s, true, i);
      else what = s.ctx->synchronous ? "it to receive this rank's message"
                  : s.so[i].handed   ? "it to take this rank's data"
                                     : "room in its channel";
      return s.sends[i].peer;
    }
  return -1;
}

/// Between sleeps: a peer this step waits for that is gone, or a failure elsewhere in the job,
/// ends the wait, unless something may move after all (looked at after the peers' fates): then
/// true, and the wait returns (a channel without `ready` has just moved it, perhaps the step's
/// last operation: waiting on would wait for nothing until the deadline). The step waits for a
/// peer only through an operation that may move now: one held back by the order rule (a receive
/// that reduces into what an earlier one writes) is not yet waiting, and its peer may have sent
/// all it owes and left; that is looked at once the operation opens.
template <class C, class St>
bool check_peers(C& c, St& s, int blocked_on, const char* what) {
  const call_info& call = *s.call;
  int gone = -1;
  for (std::size_t i = 0; i < s.recvs.size() && gone < 0; ++i)
    if (!s.ro[i].done && s.recv_open(i) && c.fate_of(s.recvs[i].peer) != fate::live) gone = s.recvs[i].peer;
  for (std::size_t i = 0; i < s.sends.size() && gone < 0; ++i)
    if (!s.so[i].done && s.send_open(i) && c.fate_of(s.sends[i].peer) != fate::live) gone = s.sends[i].peer;
  const int f = c.failed_rank();
  const bool elsewhere = f >= 0 && f != call.rank;
  if (gone < 0 && !elsewhere) return false;
  if (may_move(c, s)) return true;
  if (gone >= 0) call.fail(errc::peer_lost, "lost " + call.peer(gone) + ": " + c.why(gone));
  call.fail(errc::peer_lost, std::string(call_info::kAbortedWhile) + " waiting for " + call.peer(blocked_on) + " (" + what + "): " +
                                 call.peer(f) + " failed: " + c.failure(f));
}

/// A wait's deadline has passed: the channel's last look (before_timeout: a desync report asks
/// the peers), then `fail()`, which throws.
template <class C, class Fail>
[[noreturn]] void give_up(C& c, const call_info& call, Fail fail) {
  if constexpr (requires { c.before_timeout(call); }) c.before_timeout(call);
  fail();
  std::abort();  // (fail throws)
}

/// The whole call's deadline (options::call_timeout), looked at before a wait spins: a call
/// past it gives up at once (`fail(true)`), whatever the spin would find.
template <class C, class Fail>
void check_whole_call(C& c, const call_info& call, Fail fail) {
  if (call.call_timeout.count() <= 0) return;
  bool whole = false;
  const auto now = std::chrono::steady_clock::now();
  if (now >= call.deadline(now, whole) && whole) give_up(c, call, [&] { fail(true); });
}

/// Nothing moved: waits until something may (returns), or throws (a lost peer, the deadline).
template <class C, class St>
void block(C& c, St& s) {
  const call_info& call = *s.call;
  const char* what = "";
  const int p = first_pending(c, s, what);
  auto timed_out = [&](bool whole) { call.timed_out(p, what, whole); };
  check_whole_call(c, call, timed_out);
  detail::timed_wait tw(call, p);
  const waiting w = c.spinning();
  using clock = std::chrono::steady_clock;
  if (w.spin_time.count() > 0) {
    const auto t0 = clock::now();
    do {
      if (may_move(c, s)) return;
      detail::cpu_relax();
    } while (clock::now() - t0 < w.spin_time);
  } else {
    for (int i = 0; i < w.spins; ++i) {
      if (may_move(c, s)) return;
      detail::cpu_relax();
    }
  }
  if (may_move(c, s)) return;
  tw.start();
  // From here, through the yields (core/wait.hpp, wait_on, says why).
  bool whole = false;
  const auto deadline = call.deadline(clock::now(), whole);
  for (int i = 0; i < w.yields; ++i) {
    if (may_move(c, s)) return;
    sched_yield();
    if ((i & 3) == 3 && clock::now() >= deadline) break;
  }
  for (;;) {
    const auto t = c.arm();
    if (may_move(c, s)) return;
    if constexpr (requires { c.stalled(s); }) {
      if (c.stalled(s)) return;
    }
    if (check_peers(c, s, p, what)) return;
    const auto now = clock::now();
    if (now >= deadline) {
      if (may_move(c, s)) return;
      give_up(c, call, [&] { timed_out(whole); });
    }
    tw.start();
    c.sleep(s, t, std::min<std::chrono::nanoseconds>(deadline - now, detail::kSleepSlice));
  }
}

}  // namespace detail_engine

namespace detail_engine {
template <class C, class St>
void begin(C& c, St& s, std::span<const send_desc> sends, std::span<const recv_desc> recvs, const exchange_context& ctx) {
  s.gate = nullptr;  // (exchange_pair sets it)
  s.sends = sends;
  s.recvs = recvs;
  s.ctx = &ctx;
  s.call = ctx.call;
  s.so.assign(sends.size(), {});
  s.ro.assign(recvs.size(), {});
  s.pending = sends.size() + recvs.size();
  if constexpr (requires { c.open(s); }) c.open(s);
}

/// Nothing moved on either of two channels that share a step (exchange_pair): waits until
/// something may move on one (returns), or throws. As block(), but a sleep on one channel's
/// doorbell or sockets does not wake for the other's: while both have work the sleeps are naps
/// on each in turn, 20 us growing to 1 ms.
template <class C1, class St1, class C2, class St2>
void block_pair(C1& a, St1& sa, C2& b, St2& sb) {
  using clock = std::chrono::steady_clock;
  auto any = [&] { return (sa.pending != 0 && may_move(a, sa)) || (sb.pending != 0 && may_move(b, sb)); };
  const char* what_a = "";
  const char* what_b = "";
  const int pa = sa.pending != 0 ? first_pending(a, sa, what_a) : -1;
  const int pb = sb.pending != 0 ? first_pending(b, sb, what_b) : -1;
  const bool on_a = pa >= 0;  // whom a timeout blames: the first pending on a, else on b
  const call_info& call = on_a ? *sa.call : *sb.call;
  const int p = on_a ? pa : pb;
  const char* what = on_a ? what_a : what_b;
  auto timed_out = [&](bool whole) { call.timed_out(p, what, whole); };
  auto give = [&](bool whole) {
    if (on_a) give_up(a, call, [&] { timed_out(whole); });
    else give_up(b, call, [&] { timed_out(whole); });
  };
  if (call.call_timeout.count() > 0) {
    bool whole = false;
    const auto now = clock::now();
    if (now >= call.deadline(now, whole) && whole) give(true);
  }
  detail::timed_wait tw(call, p);
  const waiting wa = a.spinning(), wb = b.spinning();
  for (int i = 0, n = std::max(wa.spins, wb.spins); i < n; ++i) {
    if (any()) return;
    detail::cpu_relax();
  }
  if (any()) return;
  tw.start();
  bool whole = false;
  const auto deadline = call.deadline(clock::now(), whole);
  for (int i = 0, n = std::max(wa.yields, wb.yields); i < n; ++i) {
    if (any()) return;
    sched_yield();
    if ((i & 3) == 3 && clock::now() >= deadline) break;
  }
  std::chrono::nanoseconds nap = std::chrono::microseconds(20);
  bool turn = false;
  for (;;) {
    const auto ta = a.arm();
    const auto tb = b.arm();
    if (any()) return;
    if constexpr (requires { a.stalled(sa); }) {
      if (sa.pending != 0 && a.stalled(sa)) return;
    }
    if constexpr (requires { b.stalled(sb); }) {
      if (sb.pending != 0 && b.stalled(sb)) return;
    }
    if (sa.pending != 0 && check_peers(a, sa, pa, what_a)) return;
    if (sb.pending != 0 && check_peers(b, sb, pb, what_b)) return;
    const auto now = clock::now();
    if (now >= deadline) {
      if (any()) return;
      give(whole);
    }
    tw.start();
    const auto left = std::chrono::duration_cast<std::chrono::nanoseconds>(deadline - now);
    if (sa.pending != 0 && sb.pending != 0) {
      turn = !turn;
      if (turn) a.sleep(sa, ta, std::min(left, nap));
      else b.sleep(sb, tb, std::min(left, nap));
      nap = std::min<std::chrono::nanoseconds>(nap * 2, std::chrono::milliseconds(1));
    } else if (sa.pending != 0) {
      a.sleep(sa, ta, std::min<std::chrono::nanoseconds>(left, detail::kSleepSlice));
    } else {
      b.sleep(sb, tb, std::min<std::chrono::nanoseconds>(left, detail::kSleepSlice));
    }
  }
}
}  // namespace detail_engine

/// Runs one step to completion over channel c, with `s` (the channel's reused step state).
template <class C, class St>
void exchange(C& c, St& s, std::span<const send_desc> sends, std::span<const recv_desc> recvs,
              const exchange_context& ctx) {
  detail_engine::begin(c, s, sends, recvs, ctx);
  for (;;) {
    const bool m = detail_engine::sweep(c, s);
    if (s.pending == 0) return;
    if (m) continue;
    if constexpr (requires { c.hold(s); }) {
      if (c.hold(s)) continue;
    }
    detail_engine::block(c, s);
  }
}

/// The order rule across the two channels of exchange_pair: side x's receive i (x = 0: a, 1: b)
/// also waits for the other side's receives on[x][first[x][i] .. first[x][i+1]), those of the
/// step before it whose memory it reduces into (reads_what_writes). Empty `first[x]`: none.
struct cross_order {
  std::vector<std::uint32_t> first[2], on[2];
  void clear() {
    for (int x = 0; x < 2; ++x) {
      first[x].clear();
      on[x].clear();
    }
  }
  /// From the step's receives in their order, `side[k]` and `index[k]` saying where receive k
  /// went (side 0 or 1, its index there). Leaves it empty when no receive waits across.
  void build(std::span<const recv_desc> recvs, std::span<const std::uint8_t> side, std::span<const std::uint32_t> index) {
    clear();
    bool any = false;
    for (std::size_t k = 0; k < recvs.size(); ++k) {
      const int x = side[k];
      if (first[x].empty()) first[x].push_back(0);
      for (std::size_t j = 0; j < k; ++j)
        if (side[j] != x && reads_what_writes(recvs[k], recvs[j])) {
          on[x].push_back(index[j]);
          any = true;
        }
      first[x].push_back(std::uint32_t(on[x].size()));
    }
    if (!any) clear();
  }
};

namespace detail_engine {
template <class St>
struct cross_gate {
  const cross_order* order;
  int side;
  const St* other;
};
template <class St>
bool cross_open(const void* c, std::size_t i) {
  const auto& g = *static_cast<const cross_gate<St>*>(c);
  const std::vector<std::uint32_t>& first = g.order->first[g.side];
  for (std::uint32_t k = first[i]; k < first[i + 1]; ++k)
    if (!g.other->ro[g.order->on[g.side][k]].done) return false;
  return true;
}
}  // namespace detail_engine

/// Runs one step whose operations lie on two channels (transport::two_level: peers on this node
/// over one transport, peers on other nodes over another), each with its own operations, step
/// state and context (the two calls name the same call, each numbering ranks as its transport
/// does: call_info::up). Both move in every sweep; the order rule holds on each, and the two
/// share no peer; `order`, when given, orders receives across them (cross_order).
template <class C1, class St1, class C2, class St2>
void exchange_pair(C1& a, St1& sa, std::span<const send_desc> sends_a, std::span<const recv_desc> recvs_a,
                   const exchange_context& ctx_a, C2& b, St2& sb, std::span<const send_desc> sends_b,
                   std::span<const recv_desc> recvs_b, const exchange_context& ctx_b, const cross_order* order = nullptr) {
  const detail_engine::cross_gate<St2> gate_a{order, 0, &sb};
  const detail_engine::cross_gate<St1> gate_b{order, 1, &sa};
  const bool across = order != nullptr && !(order->first[0].empty() && order->first[1].empty());
  auto gate_of = [&](int x) -> bool (*)(const void*, std::size_t) {
    if (!across || order->first[x].empty()) return nullptr;
    return x == 0 ? &detail_engine::cross_open<St2> : &detail_engine::cross_open<St1>;
  };
  detail_engine::begin(a, sa, sends_a, recvs_a, ctx_a);
  detail_engine::begin(b, sb, sends_b, recvs_b, ctx_b);
  sa.gate = gate_of(0);  // (once both steps are begun: each gate reads the other's state)
  sa.gate_ctx = &gate_a;
  sb.gate = gate_of(1);
  sb.gate_ctx = &gate_b;
  struct ungate {  // (the gates point into this frame)
    St1& sa;
    St2& sb;
    ~ungate() { sa.gate = nullptr, sb.gate = nullptr; }
  } const keep{sa, sb};
  for (;;) {
    bool m = detail_engine::sweep(a, sa);
    m = detail_engine::sweep(b, sb) || m;
    if (sa.pending == 0 && sb.pending == 0) return;
    if (m) continue;
    if constexpr (requires { a.hold(sa); }) {
      if (sa.pending != 0 && a.hold(sa)) continue;
    }
    if constexpr (requires { b.hold(sb); }) {
      if (sb.pending != 0 && b.hold(sb)) continue;
    }
    if (sa.pending == 0) detail_engine::block(b, sb);
    else if (sb.pending == 0) detail_engine::block(a, sa);
    else detail_engine::block_pair(a, sa, b, sb);
  }
}

/// recv_any over two channels (wait_any's, below): `peers_a` (numbered as a's call numbers them)
/// and `peers_b`; returns the index in the caller's list, a's peers first. Sleeps are naps on
/// each in turn, as block_pair's.
template <class C1, class C2>
int wait_any_pair(C1& a, std::span<const int> peers_a, const call_info& call_a, C2& b, std::span<const int> peers_b,
                  const call_info& call_b) {
  using clock = std::chrono::steady_clock;
  detail::timed_wait tw(call_b, -1);
  auto look = [&](bool slow) -> int {
    if (const int f = a.probe_head(peers_a, call_a, slow); f >= 0)
      return int(std::find(peers_a.begin(), peers_a.end(), f) - peers_a.begin());
    if (const int f = b.probe_head(peers_b, call_b, slow); f >= 0)
      return int(peers_a.size() + std::size_t(std::find(peers_b.begin(), peers_b.end(), f) - peers_b.begin()));
    return -1;
  };
  for (int i = 0; i < detail::kYieldIterations; ++i) {
    if (const int k = look(false); k >= 0) return k;
    sched_yield();
  }
  bool whole = false;
  const auto deadline = call_b.deadline(clock::now(), whole);
  std::chrono::nanoseconds nap = std::chrono::microseconds(20);
  bool turn = false;
  for (;;) {
    const auto ta = a.arm();
    const auto tb = b.arm();
    if (const int k = look(true); k >= 0) return k;
    for (const auto* c : {&call_a, &call_b}) {
      const int f = c == &call_a ? a.failed_rank() : b.failed_rank();
      if (f >= 0 && f != c->rank)
        c->fail(errc::peer_lost, "the job was aborted while waiting for a message from any of " + call_a.peers(peers_a) +
                                     (peers_a.empty() || peers_b.empty() ? "" : ", ") + call_b.peers(peers_b) + ": " + c->peer(f) +
                                     " failed: " + (c == &call_a ? a.failure(f) : b.failure(f)));
    }
    const auto now = clock::now();
    if (now >= deadline) {
      if (const int k = look(false); k >= 0) return k;
      call_b.timed_out_waiting("a message from any of " + call_a.peers(peers_a) + ", " + call_b.peers(peers_b), whole);
    }
    tw.start();
    const auto d = std::min<std::chrono::nanoseconds>(std::chrono::duration_cast<std::chrono::nanoseconds>(deadline - now), nap);
    turn = !turn;
    if (turn) a.sleep_any(peers_a, ta, d);
    else b.sleep_any(peers_b, tb, d);
    nap = std::min<std::chrono::nanoseconds>(nap * 2, std::chrono::milliseconds(1));
  }
}

/// Receive from any source (collectives/p2p.hpp, recv_any): waits until one of `peers` has a
/// point-to-point message of this communicator waiting, and returns that peer. The channel's
/// `probe_head(peers, call, slow)` says which (-1: none yet); it may read what it must to know.
/// With `slow` (between sleeps) it also throws when every one of `peers` has left, having
/// looked at their fates before their messages (a peer's last message may still be there). A
/// failure anywhere in the job ends the wait.
template <class C>
int wait_any(C& c, std::span<const int> peers, const call_info& call) {
  using clock = std::chrono::steady_clock;
  detail::timed_wait tw(call, -1);
  const waiting w = c.spinning();
  int found = -1;
  auto look = [&](bool slow) { return (found = c.probe_head(peers, call, slow)) >= 0; };
  auto timed_out = [&](bool whole) { call.timed_out_any(peers, whole); };
  if (look(false)) return found;
  detail_engine::check_whole_call(c, call, timed_out);
  if (w.spin_time.count() > 0) {
    const auto t0 = clock::now();
    do {
      if (look(false)) return found;
      detail::cpu_relax();
    } while (clock::now() - t0 < w.spin_time);
  } else {
    for (int i = 0; i < w.spins; ++i) {
      if (look(false)) return found;
      detail::cpu_relax();
    }
  }
  tw.start();
  bool whole = false;
  const auto deadline = call.deadline(clock::now(), whole);
  for (int i = 0; i < w.yields; ++i) {
    if (look(false)) return found;
    sched_yield();
    if ((i & 3) == 3 && clock::now() >= deadline) break;
  }
  for (;;) {
    const auto t = c.arm();
    if (const int f = c.failed_rank(); f >= 0 && f != call.rank && !look(false))
      call.fail(errc::peer_lost, "the job was aborted while waiting for a message from any of " + call.peers(peers) + ": " +
                                     call.peer(f) + " failed: " + c.failure(f));
    if (look(true)) return found;
    const auto now = clock::now();
    if (now >= deadline) {
      if (look(false)) return found;
      detail_engine::give_up(c, call, [&] { timed_out(whole); });
    }
    tw.start();
    c.sleep_any(peers, t, std::min<std::chrono::nanoseconds>(deadline - now, detail::kSleepSlice));
  }
}

/// sleep() for a channel whose sleepers wait on a futex word (a doorbell that peers ring when
/// they post to this rank or take its messages): sleeps unless `ready` already holds.
template <class Ready>
void futex_sleep(detail::waitable& w, std::uint32_t token, bool shared, std::chrono::nanoseconds d, Ready&& ready) {
  w.sleepers.fetch_add(1, std::memory_order_seq_cst);
  if (!ready()) detail::futex_wait(w.word, token, d, shared);
  w.sleepers.fetch_sub(1, std::memory_order_seq_cst);
}

}  // namespace collx::engine
