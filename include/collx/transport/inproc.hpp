#pragma once
// transport::inproc: ranks are threads of one process. A message is never copied into a channel:
// the sender publishes a pointer to its data, the receiver copies or reduces straight from the
// sender's memory (single copy), then acknowledges; a send is done when its message has been
// acknowledged, which is what makes reading the sender's buffer safe (and makes every send
// synchronous, the rule point-to-point calls ask for: collectives/p2p.hpp).
//
// Each ordered pair of ranks has one channel: a ring of kDepth message descriptors with two
// counters, `posted` (written by the sender) and `consumed` (written by the receiver). A step's
// sends and receives progress together: the loop posts every send that has room, serves every
// receive whose message is there and collects acknowledgements, so a step may hold any number
// of messages to one peer (more than kDepth only fills and drains the ring). When nothing can
// move, a rank sleeps on its own doorbell (core/wait.hpp), which every peer rings when it
// posts to it or acknowledges one of its messages. Ranks that fail or leave are recorded in the
// group, and every waiter checks for them between sleeps, so a failure anywhere ends the
// collective everywhere instead of hanging it.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "../core/concepts.hpp"
#include "../core/wait.hpp"
#include "../core/error.hpp"
#include "../core/call_info.hpp"
#include "../core/split_plan.hpp"
#include "../core/deliver.hpp"
#include "engine.hpp"

namespace collx::transport {

class inproc {
 public:
  using transport_concept = transport_tag;
  using memory_space = host_memory;
  static constexpr const char* name = "inproc";

  /// Messages a sender may have outstanding to one receiver before it must wait for it: a
  /// larger step just takes turns (the loop serves receives while its sends wait for room).
  static constexpr std::uint32_t kDepth = 16;

  struct send_state {
    std::uint32_t ticket = 0;  // the `consumed` count that acknowledges it (counters wrap)
  };
  struct recv_state {};
  using step = engine::step<send_state, recv_state, true>;

  struct message {
    const std::byte* data = nullptr;
    std::size_t bytes = 0;
    operand spread;      // the sender's buffer when it is spread (its pieces outlive the read)
    call_signature sig;  // by value: peers may inspect it after the sender has unwound
  };

  struct alignas(64) channel {
    std::atomic<std::uint32_t> posted{0};
    alignas(64) std::atomic<std::uint32_t> consumed{0};
    // 1 while the receiver reads the sender's memory. A failing sender waits for it to drop
    // before unwinding (which may free that memory); the receiver re-checks the sender's state
    // after raising it. Both sides use seq_cst, so one of them always sees the other.
    std::atomic<std::uint32_t> reading{0};
    alignas(64) message slots[kDepth];
  };

  enum class rank_state : int { live = 0, left = 1, failed = 2 };

  /// The state the n thread-ranks of one job share.
  class group {
   public:
    explicit group(int n)
        : n_(n), cores_(detail::usable_cores()), channels_(std::size_t(n) * std::size_t(n)), bells_(std::size_t(n)),
          state_(std::size_t(n)), why_(std::size_t(n)), board_(std::size_t(n)), attached_(std::size_t(n), 1),
          joined_(std::size_t(n), 0) {}
    /// Where each rank is (the desync report: core/flight_record.hpp).
    detail::position_board positions() noexcept { return {board_.data(), sizeof(detail::position), n_}; }
    int size() const noexcept { return n_; }
    /// The cores the job's threads may use (read when the group is made, before any is pinned).
    int cores() const noexcept { return cores_; }
    channel& chan(int from, int to) noexcept { return channels_[std::size_t(from) * std::size_t(n_) + std::size_t(to)]; }
    detail::waitable& doorbell(int rank) noexcept { return bells_[std::size_t(rank)].w; }
    void ring(int rank) noexcept {
      detail::waitable& d = doorbell(rank);
      d.word.fetch_add(1, std::memory_order_seq_cst);
      if (d.sleepers.load(std::memory_order_seq_cst) != 0) detail::futex_wake_all(d.word, false);
    }

    /// The group of a communicator split from this one (core/split_plan.hpp): every member asks for
    /// it, the first makes it, the last takes it out of the registry. Its ranks are gone when
    /// they are gone here (a thread that left or failed the job has left every group).
    static std::shared_ptr<group> join_split(const std::shared_ptr<group>& parent, const split_plan& p) {
      return detail::join_split_group<group>(parent.get(), p, [&] {
        auto g = std::make_shared<group>(p.size);
        g->parent_ = parent;
        g->members_ = p.members;
        return g;
      });
    }

    /// State of type X that a transport standing on this group keeps for all its ranks
    /// (transport::planned's pair counters): made once, by the first rank to ask, as X(size()).
    template <class X>
    X& extension() {
      static constexpr char kind = 0;
      std::lock_guard lk(mu_);
      if (!ext_) {
        ext_ = std::make_shared<X>(n_);
        ext_kind_ = &kind;
      }
      if (ext_kind_ != &kind) std::terminate();  // one kind of extension per group
      return *static_cast<X*>(ext_.get());
    }

    /// Marks `rank` as gone: it left normally, or it failed (and then the whole job is aborted).
    void leave(int rank, bool failed, const std::string& why) noexcept {
      {
        std::lock_guard lk(mu_);
        if (state_[std::size_t(rank)].load() != int(rank_state::live)) return;
        if (failed) {
          why_[std::size_t(rank)] = why;
          if (first_failed_.load() < 0) first_failed_.store(rank);
        }
        state_[std::size_t(rank)].store(int(failed ? rank_state::failed : rank_state::left));
      }
      for (int q = 0; q < n_; ++q) ring(q);  // every sleeper re-checks
    }
    /// Rank `rank`'s transport is gone (destroyed): a shrink counts the rank lost.
    void detach(int rank) noexcept {
      {
        std::lock_guard lk(shrink_mu_);
        attached_[std::size_t(rank)] = 0;
      }
      shrink_cv_.notify_all();
    }

    /// communicator::shrink over threads (core/split_plan.hpp): each survivor marks itself joined
    /// and waits until every rank has joined or is gone (its transport destroyed, or it left);
    /// the first to see that, or its deadline, decides for all, and makes the new group.
    std::shared_ptr<group> shrink(int rank, const shrink_request& q, std::vector<int>& members) {
      const auto deadline = std::chrono::steady_clock::now() + q.timeout;
      std::unique_lock lk(shrink_mu_);
      joined_[std::size_t(rank)] = std::max(joined_[std::size_t(rank)], q.epoch);
      shrink_cv_.notify_all();
      auto alive = [&](int r) { return attached_[std::size_t(r)] != 0 && state(r) != rank_state::left; };
      for (;;) {
        if (const auto it = decisions_.find(q.epoch); it != decisions_.end()) {
          decision& d = it->second;
          const auto at = std::find(d.members.begin(), d.members.end(), rank);
          if (at == d.members.end())
            throw error(errc::peer_lost, q.what + ": the survivors went on without this rank (it joined after their deadline)");
          members = d.members;
          return d.g;
        }
        bool all = true;
        for (int r = 0; r < n_ && all; ++r) all = joined_[std::size_t(r)] >= q.epoch || !alive(r);
        if (all || std::chrono::steady_clock::now() >= deadline) {
          decision d;
          for (int r = 0; r < n_; ++r)
            if (joined_[std::size_t(r)] >= q.epoch && alive(r)) d.members.push_back(r);
          d.g = std::make_shared<group>(int(d.members.size()));
          decisions_.emplace(q.epoch, std::move(d));
          shrink_cv_.notify_all();
          continue;
        }
        // A rank that leaves the job (group::leave) does not notify: look again now and then.
        shrink_cv_.wait_until(lk, std::min(deadline, std::chrono::steady_clock::now() + detail::kSleepSlice));
      }
    }

    rank_state state(int rank) const noexcept {
      const auto s = rank_state(state_[std::size_t(rank)].load());
      if (s != rank_state::live || !parent_) return s;
      return parent_->state(members_[std::size_t(rank)]);
    }
    int first_failed() const noexcept {
      const int f = first_failed_.load();
      if (f >= 0 || !parent_) return f;
      for (int r = 0; r < n_; ++r)
        if (parent_->state(members_[std::size_t(r)]) == rank_state::failed) return r;
      return -1;
    }
    std::string why(int rank) const {
      {
        std::lock_guard lk(mu_);
        if (!why_[std::size_t(rank)].empty() || !parent_) return why_[std::size_t(rank)];
      }
      return parent_->why(members_[std::size_t(rank)]);
    }

   private:
    struct alignas(64) bell {
      detail::waitable w;
    };
    int n_;
    int cores_;
    std::vector<channel> channels_;
    std::vector<bell> bells_;
    std::vector<std::atomic<int>> state_;
    mutable std::mutex mu_;
    std::vector<std::string> why_;
    std::vector<detail::position> board_;
    std::atomic<int> first_failed_{-1};
    std::shared_ptr<void> ext_;  // extension()
    const void* ext_kind_ = nullptr;
    std::shared_ptr<group> parent_;  // split groups: the group split, and the members' ranks there
    std::vector<int> members_;
    // shrink(): whose transport still exists, the last shrink each rank joined, and the
    // decisions made (kept: a rank that comes late must find it has been left out)
    struct decision {
      std::vector<int> members;
      std::shared_ptr<group> g;
    };
    std::mutex shrink_mu_;
    std::condition_variable shrink_cv_;
    std::vector<char> attached_;
    std::vector<std::uint32_t> joined_;
    std::map<std::uint32_t, decision> decisions_;
  };

  inproc(std::shared_ptr<group> g, int rank) : g_(std::move(g)), rank_(rank), spin_(detail::spin_for(g_->size(), g_->cores())) {}
  // One rank's place in its group: destroyed, the rank has left it (a communicator split from
  // the job, dropped while its peers still call on it: they learn at once, as over shm and
  // tcp, instead of at their deadline). Moved, never copied.
  inproc(inproc&&) noexcept = default;
  inproc& operator=(inproc&& o) noexcept {
    if (this != &o) {
      leave();
      if (g_) g_->detach(rank_);
      g_ = std::move(o.g_);
      rank_ = o.rank_;
      spin_ = o.spin_;
      st_ = std::move(o.st_);
    }
    return *this;
  }
  inproc(const inproc&) = delete;
  inproc& operator=(const inproc&) = delete;
  ~inproc() {
    leave();
    if (g_) g_->detach(rank_);
  }

  int rank() const noexcept { return rank_; }
  /// Every rank's position (the desync report at a deadline: core/call_info.hpp).
  detail::position_board positions() const noexcept { return g_->positions(); }
  int size() const noexcept { return g_->size(); }
  /// The group this rank belongs to (what transports standing on inproc share: planned.hpp).
  const std::shared_ptr<group>& shared_group() const noexcept { return g_; }
  /// Buffers spread over pieces (core/concepts.hpp) are read and written through core/deliver.hpp.
  bool takes_pieces() const noexcept { return true; }

  /// Splits (core/split_plan.hpp): the new communicator's group is made in this process.
  split_offer prepare_split() { return {}; }
  inproc split(const split_plan& p, split_offer&&) const { return inproc(group::join_split(g_, p), p.rank); }
  /// communicator::shrink (core/split_plan.hpp): the survivors' group, made in this process.
  inproc shrink(const shrink_request& q, std::vector<int>& members) {
    std::shared_ptr<group> g = g_->shrink(rank_, q, members);
    const int me = int(std::find(members.begin(), members.end(), rank_) - members.begin());
    return inproc(std::move(g), me);
  }

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
  /// of `peers` holds a point-to-point message of this communicator at its head, and returns
  /// that peer (the first in `peers` when several do). Nothing is taken.
  int probe(std::span<const int> peers, const call_info& call) {
    check_live(call);
    return engine::wait_any(*this, peers, call);
  }

  // ---- the channel (transport/engine.hpp) ----------------------------------------------------
  // A send may be posted once every earlier send of the step to the same peer is (a channel is
  // a queue: the step's Pipeline rule); it is done when acknowledged. A receive may run once it
  // is first to its peer and its operand is final.

  using token = std::uint32_t;
  engine::moved try_send(step& s, std::size_t i) {
    const send_desc& d = s.sends[i];
    auto& o = s.so[i];
    channel& ch = g_->chan(rank_, d.peer);
    if (!o.handed) {
      const std::uint32_t head = ch.posted.load(std::memory_order_relaxed);
      if (head - ch.consumed.load(std::memory_order_acquire) >= kDepth) return engine::moved::nothing;
      ch.slots[head % kDepth] = {d.data, d.bytes, d.spread, s.call->sig};
      ch.posted.store(head + 1, std::memory_order_seq_cst);
      g_->ring(d.peer);
      o.s.ticket = head + 1;
      return engine::moved::handed;
    }
    return acked(ch, o.s.ticket) ? engine::moved::done : engine::moved::nothing;
  }
  engine::moved try_recv(step& s, std::size_t i) {
    const recv_desc& r = s.recvs[i];
    const call_info& call = *s.call;
    channel& ch = g_->chan(r.peer, rank_);
    const std::uint32_t tail = ch.consumed.load(std::memory_order_relaxed);
    if (ch.posted.load(std::memory_order_acquire) == tail) return engine::moved::nothing;
    const message& m = ch.slots[tail % kDepth];
    call.check_match(r.peer, m.sig, m.bytes, r.bytes);
    call.heard(r.peer, m.sig);
    ch.reading.store(1, std::memory_order_seq_cst);
    if (g_->state(r.peer) == rank_state::failed) {
      ch.reading.store(0, std::memory_order_seq_cst);
      call.fail(errc::peer_lost, "lost " + call.peer(r.peer) + ": it failed: " + g_->why(r.peer));
    }
    detail::deliver_from(r, 0, send_desc{rank_, m.data, m.bytes, m.spread}, r.bytes, s.ctx->comb);
    ch.consumed.store(tail + 1, std::memory_order_seq_cst);
    ch.reading.store(0, std::memory_order_seq_cst);
    g_->ring(r.peer);
    return engine::moved::done;
  }
  /// Can anything move now? (no side effects)
  bool ready(const step& s) const {
    for (std::size_t i = 0; i < s.sends.size(); ++i) {
      const auto& o = s.so[i];
      if (o.done) continue;
      const channel& ch = g_->chan(rank_, s.sends[i].peer);
      if (o.handed ? acked(ch, o.s.ticket)
                   : s.send_open(i) && ch.posted.load(std::memory_order_relaxed) - ch.consumed.load(std::memory_order_acquire) < kDepth)
        return true;
    }
    for (std::size_t i = 0; i < s.recvs.size(); ++i) {
      if (s.ro[i].done || !s.recv_open(i)) continue;
      const channel& ch = g_->chan(s.recvs[i].peer, rank_);
      if (ch.posted.load(std::memory_order_acquire) != ch.consumed.load(std::memory_order_relaxed)) return true;
    }
    return false;
  }
  token arm() const noexcept { return g_->doorbell(rank_).word.load(std::memory_order_seq_cst); }
  void sleep(const step& s, token t, std::chrono::nanoseconds d) {
    engine::futex_sleep(g_->doorbell(rank_), t, false, d, [&] { return ready(s); });
  }
  void sleep_any(std::span<const int>, token t, std::chrono::nanoseconds d) {
    engine::futex_sleep(g_->doorbell(rank_), t, false, d, [] { return false; });
  }
  engine::waiting spinning() const noexcept { return {spin_, std::chrono::nanoseconds(0), detail::kYieldIterations}; }
  engine::fate fate_of(int p) const noexcept {
    const rank_state st = g_->state(p);
    return st == rank_state::live ? engine::fate::live : st == rank_state::left ? engine::fate::left : engine::fate::failed;
  }
  std::string why(int p) const {
    return fate_of(p) == engine::fate::failed ? "it failed: " + g_->why(p)
                                           : std::string("it has left the communicator (it made fewer calls than this rank)");
  }
  int failed_rank() const noexcept { return g_->first_failed(); }
  std::string failure(int f) const { return g_->why(f); }
  /// Ranks that disagree about the call's shape (a root, a policy) may never message each other
  /// directly; a pending message of the same call with another signature shows it.
  bool stalled(const step& s) const {
    const call_info& call = *s.call;
    for (int q = 0; q < size() && call.sig.seq != 0; ++q) {  // seq 0: point to point, not collective
      if (q == rank_) continue;
      const channel& in = g_->chan(q, rank_);
      const std::uint32_t tail = in.consumed.load(std::memory_order_relaxed);
      if (in.posted.load(std::memory_order_acquire) == tail) continue;
      const message& m = in.slots[tail % kDepth];
      if (m.sig.seq == call.sig.seq && !(m.sig == call.sig)) call.check_match(q, m.sig, m.bytes, m.bytes);
    }
    return false;
  }
  const char* waiting_for(const step& s, bool send, std::size_t i) const {
    if (!send) return "its data";
    return s.ctx->synchronous ? "it to receive this rank's message" : s.so[i].handed ? "it to take this rank's data" : "room in its queue";
  }
  /// recv_any's look (engine::wait_any): the first of `peers` whose channel holds a
  /// point-to-point message of this communicator at its head; between sleeps (`slow`), a wait
  /// on peers that have all left fails, their fates read before their channels.
  int probe_head(std::span<const int> peers, const call_info& call, bool slow) const {
    bool all_gone = slow;
    for (int p : peers) all_gone = all_gone && g_->state(p) != rank_state::live;
    for (int p : peers) {
      const channel& ch = g_->chan(p, rank_);
      const std::uint32_t tail = ch.consumed.load(std::memory_order_relaxed);
      if (ch.posted.load(std::memory_order_acquire) == tail) continue;
      if (call.takes_any_source(ch.slots[tail % kDepth].sig)) return p;
    }
    if (all_gone)
      call.fail(errc::peer_lost, "every rank it could receive from has left the communicator (" + call.peers(peers) + ")");
    return -1;
  }

  /// Marks this rank failed, then waits until no peer is still reading its memory, so the
  /// caller may unwind and free its buffers. (A reader is a thread of this process that is
  /// copying: it ends, whatever its own state.)
  void abort(const std::string& why) noexcept {
    g_->leave(rank_, true, why);
    for (int q = 0; q < size(); ++q)
      while (g_->chan(rank_, q).reading.load(std::memory_order_seq_cst) != 0) detail::cpu_relax();
  }

  /// Called by launch_threads when this rank's function returns, and on destruction.
  void leave() noexcept {
    if (g_) g_->leave(rank_, false, {});
  }

 private:
  /// A rank that failed or left takes part in no more calls.
  void check_live(const call_info& call) const {
    if (const rank_state me = g_->state(rank_); me != rank_state::live)
      call.fail(errc::peer_lost, me == rank_state::failed ? "this rank already failed: " + g_->why(rank_)
                                                          : std::string("this rank has already left the communicator"));
  }
  static bool acked(const channel& ch, std::uint32_t ticket) noexcept {
    return std::int32_t(ch.consumed.load(std::memory_order_acquire) - ticket) >= 0;
  }
  std::shared_ptr<group> g_;
  int rank_;
  int spin_;
  step st_;
};

}  // namespace collx::transport
