#pragma once
// A rank's pools of send buffers (its data slots and small buffers in the segment), as the rank
// itself keeps track of them: which are free, and which chunk of which channel holds the others.
// Only the sender allocates, and it learns that a buffer is free again from the receiver's
// `consumed` counter of that channel (nothing else is written per chunk), so the receiver's
// path is the same as with a ring of slots per channel.
//
// Deadlock freedom. One peer holds at most kPeerSlots data slots, so one slow peer cannot take
// a whole pool. A pool can still run dry across peers (a tree step feeding three of them); a
// step then waits for a receiver to consume, which it will, since in a schedule a message of
// step t is received in step t and no rank's earlier steps depend on later ones. When nothing
// can move for a while (the wait's slow path), a send that lacks a buffer may go on in smaller
// chunks: a small buffer instead of a slot, or the line itself, so a channel never waits on a
// pool that other channels hold.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "layout.hpp"

namespace collx::transport::shm_detail {

class send_pool {
 public:
  /// Which buffers a new chunk may take.
  enum class kind { inline_line, small, data };

  void reset(int peers, std::uint32_t slots) {
    free_data_.reserve_ring(slots);
    free_small_.reserve_ring(shm_layout::kSmall);
    for (std::uint32_t i = 0; i < slots; ++i) free_data_.push(std::uint16_t(i));
    for (std::uint32_t i = 0; i < shm_layout::kSmall; ++i) free_small_.push(std::uint16_t(shm_layout::kBufSmall + i));
    chan_.assign(std::size_t(peers), {});
    outstanding_.clear();
    peer_slots_ = std::min(shm_layout::kPeerSlots, slots);
  }

  /// A buffer of `k` for a chunk to `peer` whose channel has `consumed` (read when needed,
  /// through `consumed_of(peer)`), or kNone. Inline chunks need no buffer (kBufInline).
  template <class Consumed>
  std::uint16_t take(kind k, int peer, Consumed&& consumed_of) {
    if (k == kind::inline_line) return shm_layout::kBufInline;
    chan& c = chan_[std::size_t(peer)];
    fifo& pool = k == kind::data ? free_data_ : free_small_;
    if (k == kind::data && c.data_out >= peer_slots_) reclaim(peer, consumed_of(peer));
    if (k == kind::data && c.data_out >= peer_slots_) return kNone;
    if (pool.empty())
      for (std::size_t i = outstanding_.size(); i-- > 0;) reclaim(outstanding_[i], consumed_of(outstanding_[i]));
    if (pool.empty()) return kNone;
    const std::uint16_t b = pool.pop();
    if (k == kind::data) ++c.data_out;
    return b;
  }

  /// The sender's view of the channel's `consumed` counter: chunks before it have been
  /// reclaimed. Lines of the channel before it are free (a chunk's line is p % kLines).
  std::uint32_t reclaimed(int peer) const noexcept { return chan_[std::size_t(peer)].reclaimed; }

  /// Whether take() would find a buffer (reclaiming what the receivers have consumed; takes none).
  template <class Consumed>
  bool can_take(kind k, int peer, Consumed&& consumed_of) {
    if (k == kind::inline_line) return true;
    const std::uint16_t b = take(k, peer, consumed_of);
    if (b == kNone) return false;
    (k == kind::data ? free_data_ : free_small_).push(b);
    if (k == kind::data) --chan_[std::size_t(peer)].data_out;
    return true;
  }

  /// Records that chunk number `p` of the channel to `peer` uses buffer `b` (the caller has made
  /// sure p - reclaimed(peer) < kLines).
  void posted(int peer, std::uint32_t p, std::uint16_t b) {
    chan& c = chan_[std::size_t(peer)];
    c.buf_of[p % shm_layout::kLines] = b;
    c.posted = p + 1;
    if (!c.listed && b != shm_layout::kBufInline && b != shm_layout::kBufRemote) {
      c.listed = true;
      outstanding_.push_back(peer);
    }
  }

  /// Returns the buffers of every chunk the receiver has consumed (`consumed`: its counter).
  void reclaim(int peer, std::uint32_t consumed) {
    chan& c = chan_[std::size_t(peer)];
    for (; c.reclaimed != consumed; ++c.reclaimed) {
      const std::uint16_t b = c.buf_of[c.reclaimed % shm_layout::kLines];
      c.buf_of[c.reclaimed % shm_layout::kLines] = shm_layout::kBufInline;
      if (b == shm_layout::kBufInline || b == shm_layout::kBufRemote) continue;
      if (b >= shm_layout::kBufSmall) free_small_.push(b);
      else {
        free_data_.push(b);
        --c.data_out;
      }
    }
    if (c.listed && c.reclaimed == c.posted) {
      c.listed = false;
      for (std::size_t i = 0; i < outstanding_.size(); ++i)
        if (outstanding_[i] == peer) {
          outstanding_[i] = outstanding_.back();
          outstanding_.pop_back();
          break;
        }
    }
  }

  static constexpr std::uint16_t kNone = 0xfffd;

 private:
  struct chan {
    std::uint16_t buf_of[shm_layout::kLines];  // the buffer of chunk p, at p % kLines
    std::uint32_t posted = 0, reclaimed = 0;
    std::uint32_t data_out = 0;                // data slots held by unconsumed chunks
    bool listed = false;                       // in outstanding_
    chan() {
      for (auto& b : buf_of) b = shm_layout::kBufInline;
    }
  };
  /// Free buffers, first in first out: the buffer a receiver has just read is taken last, so
  /// the sender never writes lines the receiver's core still holds (2 ranks, 32 KiB all_reduce,
  /// ring, 16 KiB chunks, 11 alternating runs of `collx-perf --transport shm -np 2 -b 32K -e 32K
  /// -n 3000`: 8.2 us with a queue, 11.7 with a stack that hands the warmest buffer out first).
  class fifo {
   public:
    void clear() { v_.clear(); head_ = 0; size_ = 0; }
    void reserve_ring(std::size_t n) { v_.assign(n, 0); head_ = 0; size_ = 0; }
    bool empty() const noexcept { return size_ == 0; }
    void push(std::uint16_t b) noexcept { v_[(head_ + size_++) % v_.size()] = b; }
    std::uint16_t pop() noexcept {
      const std::uint16_t b = v_[head_];
      head_ = (head_ + 1) % v_.size();
      --size_;
      return b;
    }
   private:
    std::vector<std::uint16_t> v_;
    std::size_t head_ = 0, size_ = 0;
  };
  fifo free_data_, free_small_;
  std::vector<chan> chan_;
  std::vector<int> outstanding_;  // peers with chunks not yet reclaimed that hold buffers
  std::uint32_t peer_slots_ = shm_layout::kPeerSlots;
};

}  // namespace collx::transport::shm_detail
