#pragma once
// transport::shm as a channel of the progress engine (transport/engine.hpp): how one send or one
// receive moves through the segment's lines and pools, and what the engine asks of a channel
// between sleeps (the trickle, a peer's fate). Part of shm.hpp, which includes it after the
// class; include shm.hpp, not this file.

namespace collx::transport {

inline void shm::open(step& s) {
  const call_info& call = *s.call;
  elem_ = std::max<std::size_t>(1, s.ctx->comb.elem_size);
  chunk_ = cfg_.slot_bytes / elem_ * elem_;
  if (chunk_ == 0)
    call.fail(errc::invalid_argument, "an element of " + std::to_string(elem_) + " B does not fit a " +
                                          std::to_string(cfg_.slot_bytes) + " B shared-memory slot");
  hash_ = call.sig.hash();
  sig_at_ = publish(call.sig, hash_);
  // Single copy only for collectives that move data without reducing it: a receiver that
  // reduces would do the kernel's copy and the reduction alone, while through the channel the
  // sender's copy and the receiver's reduction overlap (see shm_config::single_copy_bytes).
  single_copy_now_ = cma_ && s.ctx->comb.fn == nullptr;
  busy_since_ = {};
}

inline bool shm::line_room(int peer, std::uint32_t posted) {
  if (posted - pool_.reclaimed(peer) < shm_layout::kLines) return true;
  pool_.reclaim(peer, consumed_of(peer));
  return posted - pool_.reclaimed(peer) < shm_layout::kLines;
}

inline void shm::post(step& s, std::size_t i, std::size_t nb, std::uint16_t b) {
  using namespace shm_layout;
  const send_desc& d = s.sends[i];
  send_state& st = s.so[i].s;
  channel_ctl& c = ctl(rank_, d.peer);
  const std::uint32_t posted = c.posted.load(std::memory_order_relaxed);
  slot_line& l = c.line[posted % kLines];
  line_body body;
  body.chunk = std::uint32_t(nb);
  body.sig_at = std::uint16_t(sig_at_);
  body.buf = b;
  body.total = d.bytes;
  body.sig_hash = hash_;
  // (a zero-length message has no data pointer: gather copies nothing)
  detail::gather(b == kBufInline ? body.inline_data : pool_buffer(rank_, b), d, st.off, nb);
  std::memcpy(&l.body, &body, sizeof body);  // one burst, then seq (see line_body)
  l.seq.store(posted + 1, std::memory_order_release);
  c.posted.store(posted + 1, std::memory_order_relaxed);
  pool_.posted(d.peer, posted, b);
  ring(d.peer);
  st.off += nb;
  st.started = true;
  if (st.off == d.bytes && s.ctx->synchronous) {  // done once the receiver has consumed the last chunk
    st.awaiting_ack = true;
    st.ack_at = posted + 1;
  }
}

inline engine::moved shm::try_send(step& s, std::size_t i) {
  using namespace shm_layout;
  send_state& st = s.so[i].s;
  const send_desc& d = s.sends[i];
  channel_ctl& c = ctl(rank_, d.peer);
  if (st.awaiting_ack)  // single copy, or a synchronous send: done when the receiver has it
    return std::int32_t(c.consumed.load(std::memory_order_acquire) - st.ack_at) >= 0 ? engine::moved::done : engine::moved::nothing;
  if (st.started && st.off == d.bytes) return engine::moved::done;  // its last chunk went in the trickle
  if (!st.started && single_copy_now_ && d.spread.of == nullptr &&
      cfg_.single_copy_for(d.bytes, !s.recvs.empty(), s.sends.size() > 1, crowded())) {
    const std::uint32_t posted = c.posted.load(std::memory_order_relaxed);
    if (!line_room(d.peer, posted)) return engine::moved::nothing;
    slot_line& l = c.line[posted % kLines];
    line_body body;
    body.chunk = 0;
    body.sig_at = std::uint16_t(sig_at_);
    body.buf = kBufRemote;
    body.total = d.bytes;
    body.sig_hash = hash_;
    const std::uint64_t addr = reinterpret_cast<std::uintptr_t>(d.data);
    std::memcpy(body.inline_data, &addr, sizeof addr);
    std::memcpy(&l.body, &body, sizeof body);
    l.seq.store(posted + 1, std::memory_order_release);
    c.posted.store(posted + 1, std::memory_order_relaxed);
    pool_.posted(d.peer, posted, kBufRemote);
    ring(d.peer);
    st.ack_at = posted + 1;
    st.awaiting_ack = st.started = true;
    return engine::moved::handed;
  }
  engine::moved m = engine::moved::nothing;
  for (;;) {
    const std::uint32_t posted = c.posted.load(std::memory_order_relaxed);
    if (!line_room(d.peer, posted)) return m;
    const std::size_t nb = std::min(chunk_, d.bytes - st.off);
    const std::uint16_t b = pool_.take(kind_of(nb), d.peer, [this](int p) { return consumed_of(p); });
    if (b == shm_detail::send_pool::kNone) return m;
    post(s, i, nb, b);
    m = engine::moved::some;
    if (st.off == d.bytes) return st.awaiting_ack ? engine::moved::handed : engine::moved::done;
  }
}

inline engine::moved shm::try_recv(step& s, std::size_t i) {
  using namespace shm_layout;
  const call_info& call = *s.call;
  recv_state& st = s.ro[i].s;
  const recv_desc& d = s.recvs[i];
  channel_ctl& c = ctl(d.peer, rank_);
  engine::moved m = engine::moved::nothing;
  for (;;) {
    const std::uint32_t consumed = c.consumed.load(std::memory_order_relaxed);
    const slot_line& sl = c.line[consumed % kLines];
    if (sl.seq.load(std::memory_order_acquire) != consumed + 1) return m;
    const line_body& l = sl.body;
    if (!st.started && (l.sig_hash != hash_ || l.total != d.bytes)) check_match(d.peer, l, d.bytes, call);
    // A peer this rank waited on: when did it enter the call? (its published signature)
    if (call.rec != nullptr && call.rec->wants_entry(d.peer)) call.heard(d.peer, rc(d.peer).sigs[l.sig_at % kSigRing]);
    if (l.buf == kBufRemote) {  // single copy: read the whole message from the sender
      std::uint64_t addr = 0;
      std::memcpy(&addr, l.inline_data, sizeof addr);
      read_remote(c, d, addr, call, s.ctx->comb, elem_);
      c.consumed.store(consumed + 1, std::memory_order_release);
      ring(d.peer);
      st.off = d.bytes;
      st.started = true;
      return engine::moved::done;
    }
    const std::size_t nb = std::size_t(l.chunk);
    if (nb > d.bytes - st.off || nb % elem_ != 0 || (nb == 0 && d.bytes != 0))
      call.fail(errc::mismatch, "got a chunk of " + std::to_string(nb) + " B from " + call.peer(d.peer) + " where " +
                                    std::to_string(d.bytes - st.off) + " B remained");
    detail::deliver(d, st.off, buffer(d.peer, l, call), nb, s.ctx->comb);
    c.consumed.store(consumed + 1, std::memory_order_release);
    ring(d.peer);
    st.off += nb;
    st.started = true;
    m = engine::moved::some;
    if (st.off == d.bytes) return engine::moved::done;
  }
}

inline bool shm::ready(const step& s) {
  using namespace shm_layout;
  for (std::size_t i = 0; i < s.sends.size(); ++i) {
    const auto& o = s.so[i];
    if (o.done) continue;
    const int peer = s.sends[i].peer;
    if (o.s.awaiting_ack) {
      if (std::int32_t(consumed_of(peer) - o.s.ack_at) >= 0) return true;
      continue;
    }
    if (!s.send_open(i)) continue;
    if (o.s.started && o.s.off == s.sends[i].bytes) return true;
    if (!line_room(peer, ctl(rank_, peer).posted.load(std::memory_order_relaxed))) continue;
    // a buffer is free, or one held by a consumed chunk can be reclaimed
    if (pool_.can_take(kind_of(std::min(chunk_, s.sends[i].bytes - o.s.off)), peer, [this](int p) { return consumed_of(p); }))
      return true;
  }
  for (std::size_t i = 0; i < s.recvs.size(); ++i) {
    if (s.ro[i].done || !s.recv_open(i)) continue;
    const channel_ctl& c = ctl(s.recvs[i].peer, rank_);
    const std::uint32_t consumed = c.consumed.load(std::memory_order_relaxed);
    if (c.line[consumed % kLines].seq.load(std::memory_order_acquire) == consumed + 1) return true;
  }
  return false;
}

// Nothing has moved for a while. A send that waits only for a pool buffer goes on in a smaller
// one (a small buffer, else its line): slow, but no channel ever waits on buffers that other
// channels hold (shm/pool.hpp).
inline bool shm::stalled(step& s) {
  using kind = shm_detail::send_pool::kind;
  for (std::size_t i = 0; i < s.sends.size(); ++i) {
    const auto& o = s.so[i];
    const send_desc& d = s.sends[i];
    if (o.done || o.s.awaiting_ack || (o.s.started && o.s.off == d.bytes) || !s.send_open(i)) continue;
    if (!line_room(d.peer, ctl(rank_, d.peer).posted.load(std::memory_order_relaxed)) ||
        kind_of(std::min(chunk_, d.bytes - o.s.off)) == kind::inline_line)
      continue;  // not starved of buffers alone
    for (auto k : {kind::small, kind::inline_line}) {
      const std::size_t cap = (k == kind::small ? kSmallBytes : kInline) / elem_ * elem_;
      if (cap == 0) continue;
      const std::uint16_t b = pool_.take(k, d.peer, [this](int p) { return consumed_of(p); });
      if (b == shm_detail::send_pool::kNone) continue;
      post(s, i, std::min(cap, d.bytes - o.s.off), b);
      return true;
    }
  }
  return false;
}

// A single-copy send is acknowledged when its receiver has read it, which takes as long as the
// copy (~25 us for 512 KiB): longer than a waiter spins, and a futex sleep would add a wake-up
// (~28 us here) to every such message. So while such an acknowledgement is due, a sender whose
// ranks fit the cores keeps spinning: for kAckSpin, and on for as long as the receiver is
// reading (its `reading` flag), up to kBusyReadSpin; then it sleeps.
inline bool shm::hold(step& s) {
  if (crowded()) return false;
  bool any = false, reading = false;
  for (std::size_t i = 0; i < s.sends.size(); ++i)
    if (s.so[i].s.awaiting_ack && !s.so[i].done) {
      any = true;
      reading = reading || ctl(rank_, s.sends[i].peer).reading.load(std::memory_order_relaxed) != 0;
    }
  if (!any) return false;
  const auto now = std::chrono::steady_clock::now();
  if (busy_since_ == std::chrono::steady_clock::time_point{}) busy_since_ = now;
  if (now - busy_since_ >= (reading ? std::chrono::nanoseconds(kBusyReadSpin) : std::chrono::nanoseconds(kAckSpin))) return false;
  for (int k = 0; k < 64 && !ready(s); ++k) detail::cpu_relax();
  return true;
}

inline engine::fate shm::fate_of(int p) {
  if (!peer_gone(p)) return engine::fate::live;
  return rc(p).state.load(std::memory_order_seq_cst) == shm_layout::kLeft ? engine::fate::left : engine::fate::failed;
}

inline std::string shm::why(int p) const {
  const rank_ctl& r = rc(p);
  if (r.state.load(std::memory_order_seq_cst) == shm_layout::kLeft) return "it has left the job (it made fewer calls than this rank)";
  return std::string(r.why, strnlen(r.why, sizeof r.why));
}

inline int shm::failed_rank() const noexcept { return hdr().first_failed.load(std::memory_order_seq_cst); }

inline std::string shm::failure(int f) const {
  const rank_ctl& r = rc(f);
  return std::string(r.why, strnlen(r.why, sizeof r.why));
}

inline const char* shm::waiting_for(const step& s, bool send, std::size_t i) const {
  if (!send) return "its data";
  return s.ctx->synchronous ? "it to receive this rank's message" : s.so[i].s.awaiting_ack ? "it to read this rank's data" : "room in its channel";
}

// recv_any's look (engine::wait_any): the first of `peers` whose channel holds a point-to-point
// message of this communicator at its head (its first chunk's line is posted).
inline int shm::probe_head(std::span<const int> peers, const call_info& call, bool slow) {
  using namespace shm_layout;
  bool all_gone = slow;
  for (int p : peers) all_gone = all_gone && peer_gone(p);
  for (int p : peers) {
    const channel_ctl& c = ctl(p, rank_);
    const std::uint32_t consumed = c.consumed.load(std::memory_order_relaxed);
    const slot_line& sl = c.line[consumed % kLines];
    if (sl.seq.load(std::memory_order_acquire) != consumed + 1) continue;
    // The signature is published before the line (a stale one, overwritten by a sender many
    // calls ahead, no longer has the line's hash: its receive reports that).
    const call_signature theirs = rc(p).sigs[sl.body.sig_at % kSigRing];
    if (call.takes_any_source(theirs) && theirs.hash() == sl.body.sig_hash) return p;
  }
  if (all_gone) call.fail(errc::peer_lost, "every rank it could receive from has left the job (" + call.peers(peers) + ")");
  return -1;
}

}  // namespace collx::transport
