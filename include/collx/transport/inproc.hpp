#pragma once
// transport::inproc: ranks are threads of one process. A message is never copied into a channel:
// the sender publishes a pointer to its data, the receiver copies or reduces straight from the
// sender's memory (single copy), then acknowledges; a step ends when all its sends have been
// acknowledged, which is what makes reading the sender's buffer safe.
//
// Each ordered pair of ranks has one channel: a small ring of message descriptors with two
// counters, `posted` (written by the sender) and `consumed` (written by the receiver). Both
// counters are waitable words (detail/wait.hpp), so a rank that waits spins briefly and then
// sleeps. Ranks that fail or leave are recorded in the group, and every waiter checks for them
// between sleeps, so a failure anywhere ends the collective everywhere instead of hanging it.
#include <atomic>
#include <cstring>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "../concepts.hpp"
#include "../detail/wait.hpp"
#include "../error.hpp"
#include "../signature.hpp"

namespace collx::transport {

class inproc {
 public:
  using transport_concept = transport_tag;
  using memory_space = host_memory;
  static constexpr const char* name = "inproc";

  /// Messages a sender may have outstanding to one receiver. Policies send at most a few
  /// messages to one peer in one step; the depth only has to exceed that.
  static constexpr std::uint32_t kDepth = 16;

  struct message {
    const std::byte* data = nullptr;
    std::size_t bytes = 0;
    call_signature sig;  // by value: peers may inspect it after the sender has unwound
  };

  struct alignas(64) channel {
    detail::waitable posted;
    alignas(64) detail::waitable consumed;
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
    explicit group(int n) : n_(n), channels_(std::size_t(n) * std::size_t(n)), state_(std::size_t(n)), why_(std::size_t(n)) {}
    int size() const noexcept { return n_; }
    channel& chan(int from, int to) noexcept { return channels_[std::size_t(from) * std::size_t(n_) + std::size_t(to)]; }

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
      for (auto& c : channels_) {  // wake every sleeper so it re-checks
        c.posted.wake(false);
        c.consumed.wake(false);
      }
    }
    rank_state state(int rank) const noexcept { return rank_state(state_[std::size_t(rank)].load()); }
    int first_failed() const noexcept { return first_failed_.load(); }
    std::string why(int rank) const {
      std::lock_guard lk(mu_);
      return why_[std::size_t(rank)];
    }

   private:
    int n_;
    std::vector<channel> channels_;
    std::vector<std::atomic<int>> state_;
    mutable std::mutex mu_;
    std::vector<std::string> why_;
    std::atomic<int> first_failed_{-1};
  };

  inproc(std::shared_ptr<group> g, int rank) : g_(std::move(g)), rank_(rank), spin_(detail::spin_for(g_->size())) {}

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return g_->size(); }

  void exchange(std::span<const send_desc> sends, std::span<const recv_desc> recvs, const exchange_context& ctx) {
    const call_info& call = *ctx.call;
    struct ticket { channel* ch; std::uint32_t n; int peer; };
    ticket tickets_small[8];
    std::vector<ticket> tickets_big;
    ticket* tickets = tickets_small;
    if (sends.size() > 8) { tickets_big.resize(sends.size()); tickets = tickets_big.data(); }

    for (std::size_t i = 0; i < sends.size(); ++i) {
      const send_desc& s = sends[i];
      channel& ch = g_->chan(rank_, s.peer);
      const std::uint32_t head = ch.posted.word.load(std::memory_order_relaxed);
      wait(ch.consumed, [&] { return head - ch.consumed.word.load(std::memory_order_acquire) < kDepth; }, call, s.peer,
           "room in its queue");
      ch.slots[head % kDepth] = {s.data, s.bytes, call.sig};
      ch.posted.publish(head + 1, false);
      tickets[i] = {&ch, head + 1, s.peer};
    }
    for (const recv_desc& r : recvs) {
      channel& ch = g_->chan(r.peer, rank_);
      const std::uint32_t tail = ch.consumed.word.load(std::memory_order_relaxed);
      wait(ch.posted, [&] { return ch.posted.word.load(std::memory_order_acquire) != tail; }, call, r.peer, "its data");
      const message& m = ch.slots[tail % kDepth];
      call.check_match(r.peer, m.sig, m.bytes, r.bytes);
      ch.reading.store(1, std::memory_order_seq_cst);
      if (g_->state(r.peer) == rank_state::failed) {
        ch.reading.store(0, std::memory_order_seq_cst);
        call.fail(errc::peer_lost, "lost rank " + std::to_string(r.peer) + ": it failed: " + g_->why(r.peer));
      }
      if (r.bytes != 0) {
        if (r.how == combine::copy) std::memcpy(r.dst, m.data, r.bytes);
        else if (r.how == combine::received_left) ctx.comb(r.dst, m.data, r.with, r.bytes / ctx.comb.elem_size);
        else ctx.comb(r.dst, r.with, m.data, r.bytes / ctx.comb.elem_size);
      }
      ch.consumed.publish(tail + 1, false);
      ch.reading.store(0, std::memory_order_seq_cst);
    }
    for (std::size_t i = 0; i < sends.size(); ++i) {
      const ticket& t = tickets[i];
      wait(t.ch->consumed,
           [&] { return std::int32_t(t.ch->consumed.word.load(std::memory_order_acquire) - t.n) >= 0; }, call, t.peer,
           "it to take this rank's data");
    }
  }

  /// Marks this rank failed, then waits until no peer is still reading its memory, so the
  /// caller may unwind and free its buffers.
  void abort(const std::string& why) noexcept {
    g_->leave(rank_, true, why);
    for (int q = 0; q < size(); ++q)
      while (g_->chan(rank_, q).reading.load(std::memory_order_seq_cst) != 0) detail::cpu_relax();
  }

  /// Called by launch_threads when this rank's function returns.
  void leave() noexcept { g_->leave(rank_, false, {}); }

 private:
  template <class Done>
  void wait(detail::waitable& w, Done done, const call_info& call, int peer, const char* what) {
    auto check = [&] {
      // Ranks that disagree about the call's shape (a root, a policy) may never message each
      // other directly; a pending message of the same call with another signature shows it.
      for (int q = 0; q < size() && call.sig.seq != 0; ++q) {  // seq 0: point to point, not collective
        if (q == rank_) continue;
        const channel& in = g_->chan(q, rank_);
        const std::uint32_t tail = in.consumed.word.load(std::memory_order_relaxed);
        if (in.posted.word.load(std::memory_order_acquire) == tail) continue;
        const message& m = in.slots[tail % kDepth];
        if (m.sig.seq == call.sig.seq && !(m.sig == call.sig)) call.check_match(q, m.sig, m.bytes, m.bytes);
      }
      const rank_state ps = g_->state(peer);
      // The peer may have done its part (posted, or consumed ours) and then left or failed after
      // this rank last looked: its state is written after that, so look again before blaming it.
      if ((ps != rank_state::live || g_->first_failed() >= 0) && done()) return;
      if (ps == rank_state::failed)
        call.fail(errc::peer_lost, "lost rank " + std::to_string(peer) + ": it failed: " + g_->why(peer));
      if (ps == rank_state::left)
        call.fail(errc::peer_lost, "lost rank " + std::to_string(peer) +
                                       ": it has left the communicator (it made fewer calls than this rank)");
      const int f = g_->first_failed();
      if (f >= 0 && f != rank_)
        call.fail(errc::peer_lost, "the job was aborted while waiting for rank " + std::to_string(peer) + ": rank " +
                                       std::to_string(f) + " failed: " + g_->why(f));
    };
    if (detail::wait_on(w, done, check, call.timeout, false, spin_) == detail::wait_result::timed_out)
      call.timed_out(peer, what);
  }

  std::shared_ptr<group> g_;
  int rank_;
  int spin_;
};

}  // namespace collx::transport
