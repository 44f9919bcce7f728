#pragma once
// transport::tcp as a channel of the progress engine (transport/engine.hpp): how one send or one
// receive moves over its stream (frames, rts/cts for synchronous sends, the bounce buffer of a
// reduction), the clear-to-send frames owed, and recv_any's look. Part of tcp/stream.hpp, which
// includes it after the class; include tcp.hpp, not this file.

namespace collx::transport::tcp_detail {

inline engine::moved streams::try_send(step& s, std::size_t i) {
  const call_info& call = *s.call;
  send_state& st = s.so[i].s;
  const send_desc& d = s.sends[i];
  peer& p = peers_[std::size_t(d.peer)];
  bool moved = false;
  if (st.phase == send_phase::rts) {
    if (p.mid_send && !st.writing) return engine::some_if(moved);
    st.writing = true;
    moved = write_frame(p, d.peer, st.h, nullptr, st.off, call) || moved;
    if (st.off < sizeof st.h) return engine::some_if(moved);
    st.writing = false;
    st.off = 0;
    st.phase = send_phase::cts;
  }
  if (st.phase == send_phase::cts) {
    // Read what the peer sends meanwhile until its cts comes (or a frame that is not ours).
    while (p.cts_got == 0 && read_header(p, d.peer, call, moved) && absorb_control(p)) moved = true;
    if (p.cts_got == 0) return engine::some_if(moved);
    --p.cts_got;
    st.phase = send_phase::data;
    st.h.kind = std::uint32_t(tcp_wire::msg_kind::data);
    moved = true;
  }
  if (p.mid_send && !st.writing) return engine::some_if(moved);
  st.writing = true;
  moved = write_frame(p, d.peer, st.h, &d, st.off, call) || moved;
  if (st.off < sizeof st.h + d.bytes) return engine::some_if(moved);
  st.writing = false;
  st.phase = send_phase::done;
  if (p.cts_due > 0) flush_cts(p, d.peer, call);
  return engine::moved::done;
}

inline engine::moved streams::try_recv(step& s, std::size_t i) {
  const call_info& call = *s.call;
  recv_state& st = s.ro[i].s;
  const recv_desc& d = s.recvs[i];
  peer& p = peers_[std::size_t(d.peer)];
  bool moved = false;
  if (st.phase == recv_phase::rts) {  // a synchronous receive: the sender's request first
    tcp_wire::parsed_header h;
    if (!p.aside.empty()) {
      h = p.aside.front();
      p.aside.pop_front();
    } else {
      if (!next_for_receive(p, d.peer, call, moved)) return engine::some_if(moved);
      h = p.h;
      p.have = false;
    }
    call.check_match(d.peer, h.sig, std::size_t(h.bytes), d.bytes);  // a peer in another call: mismatch
    call.heard(d.peer, h.sig);
    if (h.kind != tcp_wire::msg_kind::rts) garbage(d.peer, call, "a message where a request to send was due");
    ++p.cts_due;
    ++cts_owed_;
    flush_cts(p, d.peer, call);
    st.phase = recv_phase::header;
    moved = true;
  }
  if (st.phase == recv_phase::header) {
    if (!next_for_receive(p, d.peer, call, moved)) return engine::some_if(moved);
    const tcp_wire::parsed_header& h = p.h;
    call.check_match(d.peer, h.sig, std::size_t(h.bytes), d.bytes);  // a peer in another call: mismatch
    call.heard(d.peer, h.sig);
    if (h.kind != tcp_wire::msg_kind::data) garbage(d.peer, call, "a request to send where a message was due");
    p.have = false;
    p.mid_recv = true;
    st.phase = recv_phase::payload;
    moved = true;
  }
  // The payload.
  while (st.off < d.bytes) {
    std::byte* to;
    std::size_t room;
    if (d.how == combine::copy) {
      room = d.bytes - st.off;
      to = detail::recv_target(d, st.off, room);
    } else {
      std::vector<std::byte>& b = bounce_[i];
      to = b.data() + st.fill;
      room = std::min(b.size() - st.fill, d.bytes - st.off - st.fill);
    }
    const ssize_t r = rd(p, to, room);
    if (r > 0) {
      moved = true;
      if (d.how == combine::copy) {
        st.off += std::size_t(r);
        continue;
      }
      st.fill += std::size_t(r);
      // Deliver whole elements once the bounce buffer is full or the message complete.
      if (st.fill == bounce_[i].size() || st.off + st.fill == d.bytes) {
        detail::deliver(d, st.off, bounce_[i].data(), st.fill, s.ctx->comb);
        st.off += st.fill;
        st.fill = 0;
      }
      continue;
    }
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    closed(d.peer, call, r == 0 ? 0 : errno);
  }
  if (st.off < d.bytes) return engine::some_if(moved);
  st.phase = recv_phase::done;
  p.mid_recv = false;
  return engine::moved::done;
}

inline int streams::probe_head(std::span<const int> peers, const call_info& call, bool slow) {
  bool moved = false;
  int live = 0;
  for (int q : peers) {
    peer& p = peers_[std::size_t(q)];
    if (p.left) continue;
    ++live;
    if (!p.aside.empty()) {
      if (call.takes_any_source(p.aside.front().sig)) return q;
      continue;
    }
    try {
      if (!p.s || !read_header(p, q, call, moved)) continue;
    } catch (const error&) {
      if (!p.left) throw;
      --live;
      continue;
    }
    if (p.h.kind == tcp_wire::msg_kind::rts && call.takes_any_source(p.h.sig)) return q;
  }
  if (live == 0) call.fail(errc::peer_lost, "every rank it could receive from has left the job (" + call.peers(peers) + ")");
  if (slow) scan_aborts(call);  // a failure anywhere ends the wait
  return -1;
}

inline bool streams::write_frame(peer& p, int q, const tcp_wire::msg_header& h, const send_desc* d, std::size_t& off, const call_info& call) {
  constexpr int kRuns = 16;
  const std::size_t bytes = d ? d->bytes : 0;
  bool wrote = false;
  while (off < sizeof h + bytes) {
    iovec iov[1 + kRuns];
    int k = 0;
    if (off < sizeof h) iov[k++] = {const_cast<char*>(reinterpret_cast<const char*>(&h)) + off, sizeof h - off};
    for (std::size_t poff = off < sizeof h ? 0 : off - sizeof h; poff < bytes && k < 1 + kRuns;) {
      std::size_t len = bytes - poff;
      const std::byte* at = detail::operand_at(d->data, d->spread, poff, len);
      iov[k++] = {const_cast<std::byte*>(at), len};
      poff += len;
    }
    const ssize_t w = wr(p, iov, k);
    if (w > 0) {
      off += std::size_t(w);
      p.mid_send = off < sizeof h + bytes;  // the stream is inside a frame until it is all written
      wrote = true;
      continue;
    }
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      // TLS has sealed the record it could not send: only this frame, from this offset, may be
      // written next on this stream (OpenSSL's rule for a retried write)
      if (p.tls) p.mid_send = true;
      break;
    }
    const int e = errno;
    scan_aborts(call);  // a peer that failed closed its end after saying why
    lost(q, call, std::string("sending to it failed: ") + std::strerror(e));
  }
  return wrote;
}

inline bool streams::flush_cts(peer& p, int q, const call_info& call) {
  bool wrote = false;
  while (p.cts_due > 0 && (!p.mid_send || p.cts_writing)) {
    if (!p.cts_writing) {
      p.cts_h = {};
      p.cts_h.kind = std::uint32_t(tcp_wire::msg_kind::cts);
      p.cts_h.sig = call.sig;
      p.cts_off = 0;
      p.cts_writing = true;
    }
    wrote = write_frame(p, q, p.cts_h, nullptr, p.cts_off, call) || wrote;
    if (p.cts_off < sizeof p.cts_h) break;
    p.cts_writing = false;
    --p.cts_due;
    --cts_owed_;
  }
  return wrote;
}

}  // namespace collx::transport::tcp_detail
