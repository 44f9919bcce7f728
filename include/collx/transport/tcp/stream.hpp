#pragma once
// The data path of transport::tcp: one stream per pair of ranks, carrying frames (wire.hpp), a
// channel of the progress engine (transport/engine.hpp; its moves in tcp/channel.hpp), which
// moves a step's sends and receives over them together.
//
// Data. A message is a 136-byte header (the sender's call signature and the byte count: the
// receiver checks both before reading a byte of payload, so mismatched calls fail with
// errc::mismatch and a wrong length can never overrun a buffer) followed by the payload. A
// step's sends and receives progress together over non-blocking sockets (a ring step sends and
// receives at once); received data lands straight in its destination, or, when it is reduced,
// in a 64 KiB bounce buffer that is delivered (core/deliver.hpp) as it fills. Messages to
// one peer keep their order (one stream per pair).
//
// Synchronous sends (point to point: collectives/p2p.hpp). The sender sends a request to send
// (rts: the header alone); the receiver, once its receive is there, answers clear to send (cts);
// only then does the data frame follow, and the send is done when it is written. So a send
// returns only once its receiver has called the matching receive, at every size. A rank
// waiting for a cts reads what its peer sends it meanwhile: another cts, or the peer's own rts
// (set aside for the receive that will take it: a rank that sends and receives with one peer
// at once, sendrecv, needs that); a data frame stays where it is, at the head of the stream,
// until a receive takes it.
//
// Waiting. A rank with nothing to move polls its sockets without sleeping for a while
// (kSpinTime: a peer's answer on another core of this host arrives in ~7 us, a sleeping
// thread's wake-up costs ~28 us on the development VM), then sleeps in poll() in slices,
// checking the call's deadline. Spinning is skipped when the job's ranks on this host
// outnumber its cores (the peer probably needs this core).
//
// Faults. A peer that dies closes its sockets (the kernel does it): its peers see EOF or a
// reset and throw errc::peer_lost naming it. A rank that fails sends an abort frame with its
// reason where its stream is between frames; one that leaves normally sends a farewell, so a
// peer still waiting learns that it made fewer calls. A peer that stops mid-message, or never
// comes, runs the waiting ranks into their deadline: errc::timeout naming it, and where the
// other ranks are, asked of them (tcp/desync.hpp: a rank sleeping in this loop answers such
// questions on every listener of its process).
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <deque>
#include <span>
#include <string>
#include <vector>

#include "../../core/concepts.hpp"
#include "../../core/wait.hpp"
#include "../../core/error.hpp"
#include "../../core/call_info.hpp"
#include "../../core/deliver.hpp"
#include "desync.hpp"
#include "rendezvous.hpp"
#include "socket.hpp"
#include "wire.hpp"
#include "../engine.hpp"

namespace collx::transport::tcp_detail {

class streams {
 public:
  /// Bytes of a reduced message received before they are delivered.
  static constexpr std::size_t kBounceBytes = std::size_t(64) << 10;
  /// How long a rank with nothing to move polls before it sleeps (see the top).
  static constexpr std::chrono::microseconds kSpinTime{100};
  /// Requests to send from one peer that a rank sets aside while it waits for that peer's cts.
  static constexpr std::size_t kAside = 8;

  streams() = default;
  streams(std::vector<conn> peers, bool crowded) : crowded_(crowded) {
    peers_.resize(peers.size());
    for (std::size_t q = 0; q < peers.size(); ++q) {
      peers_[q].s = std::move(peers[q].s);
      peers_[q].where = std::move(peers[q].where);
      peers_[q].tls = std::move(peers[q].tls);
      tls_ = tls_ || bool(peers_[q].tls);
    }
  }

  const std::string& where(int p) const { return peers_.at(std::size_t(p)).where; }

  /// The desync report (tcp/desync.hpp): this communicator's query point, listed while it
  /// lives, and its board (this rank's position, and the peers' once asked).
  void observe(query_listing q, detail::position* board) {
    qp_ = std::move(q);
    board_ = board;
  }
  /// Connections to the listener that were not queries (a shrink's hellos), for shrink.
  std::vector<net::fd> take_parked() { return qp_.take_parked(); }
  /// The socket of the connection to peer p (a split listens on the address it uses).
  int socket_of(int p) const { return peers_.at(std::size_t(p)).s.get(); }
  bool dead() const noexcept { return dead_; }

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

  /// Receive from any source (collectives/p2p.hpp, recv_any): waits until the stream from one
  /// of `peers` starts with a point-to-point request to send of this communicator (read and
  /// held, or set aside earlier), and returns that peer (the first in `peers` when several
  /// do). Headers of other frames read meanwhile stay held for the receive that takes them. A
  /// peer that has left is passed over; the wait fails when every one has, or when one failed.
  int probe(std::span<const int> peers, const call_info& call) {
    check_live(call);
    return engine::wait_any(*this, peers, call);
  }

  // ---- the channel (transport/engine.hpp) ------------------------------------------------------
  enum class send_phase : std::uint8_t { rts, cts, data, done };
  enum class recv_phase : std::uint8_t { rts, header, payload, done };
  struct send_state {
    tcp_wire::msg_header h;
    send_phase phase = send_phase::data;
    bool writing = false;  // this send's frame is the one the stream is inside
    std::size_t off = 0;   // bytes of the frame written
  };
  struct recv_state {
    recv_phase phase = recv_phase::header;
    std::size_t off = 0;   // payload bytes delivered
    std::size_t fill = 0;  // reductions: bytes waiting in the bounce buffer
  };
  using step = engine::step<send_state, recv_state>;
  struct token {};

  void open(step& s) {
    const call_info& call = *s.call;
    const std::size_t elem = std::max<std::size_t>(1, s.ctx->comb.elem_size);
    const bool sync = s.ctx->synchronous;
    for (std::size_t i = 0; i < s.sends.size(); ++i) {
      send_state& o = s.so[i].s;
      o.phase = sync ? send_phase::rts : send_phase::data;
      o.h.sig = call.sig;
      o.h.bytes = s.sends[i].bytes;
      o.h.kind = std::uint32_t(sync ? tcp_wire::msg_kind::rts : tcp_wire::msg_kind::data);
    }
    for (std::size_t i = 0; i < s.recvs.size(); ++i) {
      s.ro[i].s.phase = sync ? recv_phase::rts : recv_phase::header;
      if (s.recvs[i].how != combine::copy) {
        if (bounce_.size() <= i) bounce_.resize(i + 1);
        bounce_[i].resize(std::max(elem, kBounceBytes / elem * elem));
      }
    }
  }
  /// The clear-to-send frames owed, written wherever a stream is between frames.
  bool service(step& s) {
    bool moved = false;
    if (cts_owed_ > 0)
      for (std::size_t q = 0; q < peers_.size(); ++q)
        if (peers_[q].cts_due > 0) moved = flush_cts(peers_[q], int(q), *s.call) || moved;
    return moved;
  }

  engine::moved try_send(step& s, std::size_t i);

  engine::moved try_recv(step& s, std::size_t i);

  token arm() const noexcept { return {}; }
  /// Sleeps in poll() on the sockets that block progress, and where position queries come
  /// (tcp/desync.hpp), which it answers.
  void sleep(const step& s, token, std::chrono::nanoseconds d) {
    if (tls_) {  // TLS may hold decrypted bytes a receive waits for: no poll would wake for them
      bool ready = false;
      s.each_open([&](int q, bool send, std::size_t) { ready = ready || (!send && buffered(peers_[std::size_t(q)])); });
      if (ready) return;
    }
    pfd_.clear();
    if (cts_owed_ > 0)
      for (std::size_t q = 0; q < peers_.size(); ++q)
        if (peers_[q].cts_due > 0) pfd_.push_back({peers_[q].s.get(), POLLOUT, 0});
    s.each_open([&](int q, bool send, std::size_t i) {
      const short ev = send && s.so[i].s.phase != send_phase::cts ? POLLOUT : POLLIN;
      pfd_.push_back({peers_[std::size_t(q)].s.get(), ev, 0});
    });
    poll_and_serve(d);
  }
  void sleep_any(std::span<const int> peers, token, std::chrono::nanoseconds d) {
    if (tls_)
      for (int q : peers)
        if (buffered(peers_[std::size_t(q)])) return;
    pfd_.clear();
    for (int q : peers)
      if (const peer& p = peers_[std::size_t(q)]; p.s && !p.left && !p.have && !p.mid_recv) pfd_.push_back({p.s.get(), POLLIN, 0});
    poll_and_serve(d);
  }
  /// A peer's answer on another core of this host arrives in ~7 us, a sleeping thread's wake-up
  /// costs ~28 us on the development VM: poll without sleeping for kSpinTime first, unless the
  /// job's ranks on this host outnumber its cores (the peer probably needs this core).
  engine::waiting spinning() const noexcept { return {0, crowded_ ? std::chrono::nanoseconds(0) : kSpinTime, 0}; }
  /// Over tcp a peer's fate arrives on its stream (a farewell, an abort frame, the connection's
  /// end), read by the sweeps and by stalled(): it is thrown from there.
  engine::fate fate_of(int) const noexcept { return engine::fate::live; }
  std::string why(int) const { return {}; }
  int failed_rank() const noexcept { return -1; }
  std::string failure(int) const { return {}; }
  /// A rank that failed told every peer why (an abort frame), also those not waiting for it in
  /// this step: look, so that a failure anywhere ends the wait everywhere.
  bool stalled(const step& s) {
    scan_aborts(*s.call);
    return false;
  }
  void before_timeout(const call_info& call) { ask_peers(call); }
  const char* waiting_for(const step& s, bool send, std::size_t i) const {
    if (!send) return s.ro[i].s.phase == recv_phase::rts ? "its request to send over tcp" : "its data over tcp";
    return s.ctx->synchronous ? "it to receive this rank's message (over tcp)" : "room to send to it over tcp";
  }
  /// recv_any's look (engine::wait_any).
  int probe_head(std::span<const int> peers, const call_info& call, bool slow);

  /// This rank failed: tell peers why where a stream is between frames, then close
  /// everything (peers see the connection end and fail with errc::peer_lost).
  void abort(const std::string& why) noexcept {
    if (dead_) return;
    dead_ = true;
    dead_why_ = why;
    const std::string reason = detail::head_and_tail(why, tcp_wire::kMaxAbortReason);
    const auto until = net::clock::now() + std::chrono::milliseconds(100);  // for all peers together
    for (peer& p : peers_)
      if (p.s && !p.mid_send) send_frame(p, tcp_wire::msg_kind::abort, reason, until);
    close_all();
  }

  /// Leaves the job normally: peers still waiting for this rank learn that it has left.
  void leave() noexcept {
    if (dead_) return;
    dead_ = true;
    dead_why_ = "it has left the job";
    const auto until = net::clock::now() + std::chrono::milliseconds(100);
    for (peer& p : peers_)
      if (p.s && !p.mid_send) send_frame(p, tcp_wire::msg_kind::bye, {}, until);
    close_all();
  }

 private:
  struct peer {
    net::fd s;
    tls_link tls;  // its TLS end (tcp/tls.hpp), when the job encrypts: every byte goes through it
    std::string where;
    bool mid_send = false, mid_recv = false, gone = false, left = false;
    // incoming: a frame header being read, or read and held until someone takes it
    std::byte raw[sizeof(tcp_wire::msg_header)];
    std::size_t hoff = 0;
    bool have = false;
    tcp_wire::parsed_header h;
    std::deque<tcp_wire::parsed_header> aside;  // the peer's requests to send, read while waiting for its cts
    int cts_got = 0;                            // clear-to-sends received, not yet used
    // outgoing: clear-to-sends owed, and the one being written
    int cts_due = 0;
    bool cts_writing = false;
    tcp_wire::msg_header cts_h;
    std::size_t cts_off = 0;
  };
  /// Writes what it can of the frame `h` + the payload of send d (none for a control frame),
  /// `off` bytes of which are written; true when something was written. The payload goes run
  /// by run of its buffer (a spread one has several: core/concepts.hpp, pieces).
  bool write_frame(peer& p, int q, const tcp_wire::msg_header& h, const send_desc* d, std::size_t& off, const call_info& call);
  /// The clear-to-send frames this rank owes peer q, written whenever its stream is between frames.
  bool flush_cts(peer& p, int q, const call_info& call);
  /// Reads headers from peer q, taking the clear-to-sends among them (for sends of ours), until
  /// one for a receive is held; false when none is yet.
  bool next_for_receive(peer& p, int q, const call_info& call, bool& moved) {
    while (read_header(p, q, call, moved) && p.h.kind == tcp_wire::msg_kind::cts) {
      ++p.cts_got;
      p.have = false;
    }
    return p.have;
  }
  /// Takes the held header when it is a cts (for the first send to q that waits for one) or,
  /// while the peer's own request waits behind, an rts (set aside). False when what is held
  /// is for a receive (or nothing is held).
  static bool absorb_control(peer& p) {
    if (!p.have) return false;
    if (p.h.kind == tcp_wire::msg_kind::cts) {
      ++p.cts_got;
      p.have = false;
      return true;
    }
    if (p.h.kind == tcp_wire::msg_kind::rts && p.aside.size() < kAside) {
      p.aside.push_back(p.h);
      p.have = false;
      return true;
    }
    return false;
  }
  /// poll() on pfd_ and the desync report's listeners, at most d; then answers the queries.
  void poll_and_serve(std::chrono::nanoseconds d) {
    const std::size_t listeners = pfd_.size();
    if (qp_) add_listeners(pfd_);
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(d).count();
    ::poll(pfd_.data(), pfd_.size(), int(std::clamp<long long>(ms + 1, 1, detail::kSleepSlice.count())));
    if (qp_) serve_listeners(pfd_, listeners);
  }

  // ---- the stream's bytes, plain or through TLS ----------------------------------------------
  /// As recv(MSG_DONTWAIT): bytes read, 0 at the stream's end, -1 with errno (EAGAIN: none yet).
  static ssize_t rd(peer& p, void* b, std::size_t n) noexcept {
    if (!p.tls) return ::recv(p.s.get(), b, n, MSG_DONTWAIT);
    std::size_t got = 0;
    const int r = SSL_read_ex(p.tls.get(), b, n, &got);
    return r == 1 ? ssize_t(got) : tls_failed(p, r);
  }
  /// As recv(MSG_PEEK | MSG_DONTWAIT).
  static ssize_t peek(peer& p, void* b, std::size_t n) noexcept {
    if (!p.tls) return ::recv(p.s.get(), b, n, MSG_PEEK | MSG_DONTWAIT);
    std::size_t got = 0;
    const int r = SSL_peek_ex(p.tls.get(), b, n, &got);
    return r == 1 ? ssize_t(got) : tls_failed(p, r);
  }
  /// As sendmsg(MSG_NOSIGNAL | MSG_DONTWAIT) of k runs: bytes written, or -1 with errno.
  static ssize_t wr(peer& p, iovec* iov, int k) noexcept {
    if (!p.tls) {
      msghdr m{};
      m.msg_iov = iov;
      m.msg_iovlen = std::size_t(k);
      return ::sendmsg(p.s.get(), &m, MSG_NOSIGNAL | MSG_DONTWAIT);
    }
    // A small frame (a header, and a payload that fits one record with it) goes as one record:
    // one seal and one system call, not one per run (the same bytes on a retry, as OpenSSL
    // requires: the runs are rebuilt from the same offset).
    std::size_t small = 0;
    for (int i = 0; i < k && small <= kRecord; ++i) small += iov[i].iov_len;
    if (k > 1 && small <= kRecord) {
      std::byte one[kRecord];
      std::size_t at = 0;
      for (int i = 0; i < k; ++i) {
        std::memcpy(one + at, iov[i].iov_base, iov[i].iov_len);
        at += iov[i].iov_len;
      }
      std::size_t w = 0;
      const int r = SSL_write_ex(p.tls.get(), one, at, &w);
      return r == 1 ? ssize_t(w) : tls_failed(p, r);
    }
    ssize_t total = 0;
    for (int i = 0; i < k; ++i) {
      std::size_t w = 0;
      const int r = SSL_write_ex(p.tls.get(), iov[i].iov_base, iov[i].iov_len, &w);
      if (r == 1) {
        total += ssize_t(w);
        if (w < iov[i].iov_len) break;
        continue;
      }
      // (what was written stands; this run is retried as it was, as OpenSSL requires)
      if (total > 0) {
        ERR_clear_error();
        return total;
      }
      return tls_failed(p, r);
    }
    return total;
  }
  /// The most a TLS record carries (RFC 8446: 2^14 bytes).
  static constexpr std::size_t kRecord = std::size_t(16) << 10;
  /// A TLS call that did not succeed, as the socket call it stands for would say it.
  static ssize_t tls_failed(peer& p, int r) noexcept {
    const int e = SSL_get_error(p.tls.get(), r);
    ERR_clear_error();
    switch (e) {
      case SSL_ERROR_WANT_READ:
      case SSL_ERROR_WANT_WRITE: errno = EAGAIN; return -1;
      case SSL_ERROR_ZERO_RETURN: return 0;
      case SSL_ERROR_SYSCALL:
        if (errno == 0 || errno == EAGAIN) return 0;  // the connection ended without TLS's farewell
        return -1;
      default: errno = EPROTO; return -1;  // a record that does not authenticate: tampered with
    }
  }
  /// Writes all of b, n before `until` (best effort: false when it could not).
  static bool write_all(peer& p, const void* b, std::size_t n, net::clock::time_point until) noexcept {
    if (!p.tls) return net::write_all(p.s.get(), b, n, until) == net::io::ok;
    const char* at = static_cast<const char*>(b);
    while (n > 0) {
      iovec v{const_cast<char*>(at), n};
      const ssize_t w = wr(p, &v, 1);
      if (w > 0) {
        at += w;
        n -= std::size_t(w);
        continue;
      }
      if (w < 0 && errno != EAGAIN && errno != EINTR) return false;
      if (net::clock::now() >= until) return false;
      pollfd f{p.s.get(), POLLOUT | POLLIN, 0};
      ::poll(&f, 1, std::clamp(net::ms_until(until), 1, 10));
    }
    return true;
  }
  /// Reads exactly n bytes before `until`.
  static bool read_all(peer& p, void* b, std::size_t n, net::clock::time_point until) noexcept {
    if (!p.tls) return net::read_exact(p.s.get(), b, n, until) == net::io::ok;
    char* at = static_cast<char*>(b);
    while (n > 0) {
      const ssize_t r = rd(p, at, n);
      if (r > 0) {
        at += r;
        n -= std::size_t(r);
        continue;
      }
      if (r == 0 || (errno != EAGAIN && errno != EINTR)) return false;
      if (net::clock::now() >= until) return false;
      pollfd f{p.s.get(), POLLIN, 0};
      ::poll(&f, 1, std::clamp(net::ms_until(until), 1, 10));
    }
    return true;
  }
  /// Decrypted bytes that TLS holds for the stream, which no poll of the socket would announce.
  /// (Bytes read ahead that are not a whole record yet need more from the socket: poll's.)
  static bool buffered(const peer& p) noexcept { return p.tls && SSL_pending(p.tls.get()) > 0; }

  static void send_frame(peer& p, tcp_wire::msg_kind k, const std::string& payload, net::clock::time_point until) noexcept {
    tcp_wire::msg_header h;
    h.kind = std::uint32_t(k);
    h.bytes = payload.size();
    std::string b(reinterpret_cast<const char*>(&h), sizeof h);
    b += payload;
    // Best effort within a short time: a peer whose buffers are full learns from the close.
    (void)write_all(p, b.data(), b.size(), until);
  }

  /// Closes every connection after its last frame: a FIN after what was sent, and what peers
  /// sent that nobody will take read away first. A socket closed with unread data sends a reset
  /// instead, which can reach the peer before the abort frame and lose it ("connection reset
  /// by peer" in place of why this rank failed: the chaos run saw it).
  void close_all() noexcept {
    char sink[4096];
    for (peer& p : peers_) {
      if (!p.s) continue;
      // (no TLS close_notify: after a failure OpenSSL forbids it, and the peer reads the
      // connection's end as the stream's either way: tcp/tls.hpp)
      ::shutdown(p.s.get(), SHUT_WR);
      for (int k = 0; k < 1024; ++k) {  // what is there now, at most 4 MiB: no waiting
        const ssize_t r = ::recv(p.s.get(), sink, sizeof sink, MSG_DONTWAIT);
        if (r > 0 || (r < 0 && errno == EINTR)) continue;
        break;
      }
      p.tls.reset();
      p.s.reset();
    }
  }

  /// Reads the next frame header from peer q if there is none held; true when one is held. A
  /// farewell or an abort frame throws errc::peer_lost (a farewell marks the peer `left`).
  bool read_header(peer& p, int q, const call_info& call, bool& moved) {
    if (p.have) return true;
    if (p.mid_recv) return false;  // a receive is reading a payload from this stream
    while (p.hoff < sizeof p.raw) {
      const ssize_t r = rd(p, p.raw + p.hoff, sizeof p.raw - p.hoff);
      if (r > 0) {
        p.hoff += std::size_t(r);
        moved = true;
        continue;
      }
      if (r < 0 && errno == EINTR) continue;
      if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return false;
      closed(q, call, r == 0 ? 0 : errno);
    }
    std::string why;
    const auto h = tcp_wire::parse_header(std::span<const std::byte, sizeof p.raw>(p.raw), why);
    if (!h) garbage(q, call, why);
    if (h->kind == tcp_wire::msg_kind::bye) {
      p.gone = true;
      scan_aborts(call);  // it may have left because another rank failed: that is the news
      p.left = true;      // (only now: the probe passes over a peer that left, not a failure)
      call.fail(errc::peer_lost, "lost " + call.peer(q) + ": it has left the job (it made fewer calls than this rank)");
    }
    if (h->kind == tcp_wire::msg_kind::abort) aborted(q, call, std::size_t(h->bytes));
    p.hoff = 0;
    p.h = *h;
    p.have = true;
    return true;
  }

  /// Before a timeout's message: the peers' positions, asked of them (tcp/desync.hpp), onto
  /// the board the message reads.
  void ask_peers(const call_info& call) {
    if (!qp_ || board_ == nullptr || call.board.base != board_) return;
    std::vector<std::string> where(peers_.size());
    for (std::size_t q = 0; q < peers_.size(); ++q) where[q] = peers_[q].where;
    ask_positions(*qp_.get(), where, board_, std::chrono::milliseconds(300));
  }

  /// A rank whose transport failed or left takes part in no more calls.
  void check_live(const call_info& call) const {
    if (dead_) call.fail(errc::peer_lost, "the tcp transport of this rank already failed: " + dead_why_);
  }

  [[noreturn]] void lost(int q, const call_info& call, const std::string& what) {
    peers_[std::size_t(q)].gone = true;
    call.fail(errc::peer_lost, "lost " + call.peer(q) + " (" + peers_[std::size_t(q)].where + "): " + what);
  }
  /// Throws the reason of the first peer whose stream, between frames, starts with an abort
  /// frame (read without consuming anything else).
  void scan_aborts(const call_info& call) {
    for (std::size_t q = 0; q < peers_.size(); ++q) {
      peer& p = peers_[q];
      if (!p.s || p.hoff != 0 || p.have || p.mid_recv) continue;
      const auto reason_bytes = tcp_wire::abort_at_head_with([&p](void* b, std::size_t n) { return peek(p, b, n); });
      if (!reason_bytes) continue;
      tcp_wire::msg_header h;
      (void)!rd(p, &h, sizeof h);
      aborted(int(q), call, *reason_bytes);
    }
  }

  [[noreturn]] void closed(int q, const call_info& call, int err) {
    scan_aborts(call);
    if (err == 0) lost(q, call, "its connection closed without a farewell (the process died or was killed)");
    if (err == EPROTO && peers_[std::size_t(q)].tls)  // (tls_failed: a record whose tag does not hold)
      garbage(q, call, "a TLS record from it does not authenticate: its bytes were changed on the way");
    lost(q, call, std::string("its connection failed: ") + std::strerror(err));
  }
  [[noreturn]] void garbage(int q, const call_info& call, const std::string& why) {
    peers_[std::size_t(q)].tls.reset();
    peers_[std::size_t(q)].s.reset();  // the stream is out of step: never read it again
    call.fail(errc::transport_error, "garbage on the connection from " + call.peer(q) + " (" +
                                         peers_[std::size_t(q)].where + "): " + why);
  }
  [[noreturn]] void aborted(int q, const call_info& call, std::size_t reason_bytes) {
    std::string why(reason_bytes, '\0');  // bounded by parse_header (kMaxAbortReason)
    if (!read_all(peers_[std::size_t(q)], why.data(), why.size(), net::clock::now() + std::chrono::seconds(1))) why = "(reason lost)";
    lost(q, call, "it failed: " + tcp_wire::printable_reason(std::move(why)));
  }

  std::vector<peer> peers_;
  int cts_owed_ = 0;  // clear-to-sends owed to all peers together
  bool crowded_ = false;
  bool tls_ = false;  // its streams go through TLS
  bool dead_ = false;
  std::string dead_why_;
  step st_;
  std::vector<std::vector<std::byte>> bounce_;
  std::vector<pollfd> pfd_;
  query_listing qp_;                  // the desync report's (observe)
  detail::position* board_ = nullptr;
};

}  // namespace collx::transport::tcp_detail

// The channel the progress engine drives, defined apart (tcp/channel.hpp).
#include "channel.hpp"
