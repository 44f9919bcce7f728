#pragma once
// transport::tcp — ranks on any hosts, one TCP connection per pair of ranks.
//
// Rendezvous. Ranks meet through a store (tcp/store.hpp): rank 0 serves one at
// MASTER_ADDR:MASTER_PORT (torchrun's env:// convention), or they share a directory
// (COLLX_STORE_PATH). Each rank listens on an ephemeral port of the interface named by
// COLLX_SOCKET_IFNAME (else the one that routes to MASTER_ADDR, else loopback) and publishes
// "address host-id cores" under <job>/addr/<rank>. Rank r then connects to every rank below it
// and accepts every rank above it, all at once in one poll loop, so no order of arrival can
// deadlock. Rendezvous has its own deadline (config::rendezvous_timeout) and its errors name
// the ranks that did not show up.
//
// Admission. A connecting rank first sends a hello with the job's token (COLLX_JOB_TOKEN, or
// 64 hex digits drawn by rank 0 and handed out through the store); the accepting rank checks
// it, the rank number and that no connection from that rank exists yet, answers with a verdict,
// and drops anything else, logging the refused address to stderr. A stranger's connection
// never becomes part of a collective. With COLLX_JOB_TOKEN set, the store refuses clients that
// do not present it too; without it, anyone who can reach the store can read the token from it.
//
// Data. A message is a 128-byte header (the sender's call signature and the byte count: the
// receiver checks both before reading a byte of payload, so mismatched calls fail with
// errc::mismatch and a wrong length can never overrun a buffer) followed by the payload. A
// step's sends and receives progress together over non-blocking sockets (a ring step sends and
// receives at once); received data lands straight in its destination, or, when it is reduced,
// in a 64 KiB bounce buffer that is combined as it fills. Messages to one peer keep their
// order (one stream per pair).
//
// Waiting. A rank with nothing to move polls its sockets without sleeping for a while
// (kSpinTime: a peer's answer on another core of this host arrives in ~7 us, a sleeping
// thread's wake-up costs ~28 us on the development VM), then sleeps in poll() in slices,
// checking the call's deadline. Spinning is skipped when the job's ranks on this host
// outnumber its cores (the peer probably needs this core).
//
// Faults. A peer that dies closes its sockets (the kernel does it): its peers see EOF or a
// reset and throw errc::peer_lost naming it. A rank that fails sends an abort frame with its
// reason where its stream is between messages; one that leaves normally sends a farewell, so a
// peer still waiting learns that it made fewer calls. A peer that stops mid-message, or never
// comes, runs the waiting ranks into their deadline: errc::timeout naming it. Every socket is
// owned (net::fd) and closed on every path.
#include <sys/random.h>
#include <sys/uio.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "../communicator.hpp"
#include "../concepts.hpp"
#include "../detail/wait.hpp"
#include "../environment.hpp"
#include "../error.hpp"
#include "../signature.hpp"
#include "tcp/socket.hpp"
#include "tcp/store.hpp"
#include "tcp/wire.hpp"

namespace collx::transport {

struct tcp_config {
  /// How long rendezvous (store, addresses, connections) may take in all.
  std::chrono::nanoseconds rendezvous_timeout = detail::default_timeout();
  /// The store: a directory every rank sees (file store), else the TCP store at master_addr:master_port.
  std::string store_path = detail::env("COLLX_STORE_PATH") ? detail::env("COLLX_STORE_PATH") : "";
  std::string master_addr;
  int master_port = 0;
  /// Interface to listen on (COLLX_SOCKET_IFNAME); empty: the one that routes to master_addr.
  std::string ifname = detail::env("COLLX_SOCKET_IFNAME") ? detail::env("COLLX_SOCKET_IFNAME") : "";
  /// The job's token (COLLX_JOB_TOKEN); empty: rank 0 draws one and hands it out through the store.
  std::string token = detail::env("COLLX_JOB_TOKEN") ? detail::env("COLLX_JOB_TOKEN") : "";
  /// Socket buffer sizes (SO_SNDBUF/SO_RCVBUF; COLLX_TCP_BUFFER_BYTES overrides, 0 keeps the
  /// kernel's autotuning). Measured on 127.0.0.1, 2 processes on 2 cores, 64 MiB all-reduce
  /// (tree), eight runs of `COLLX_TCP_BUFFER_BYTES=<b> collx-perf --transport tcp -np 2 -b 64M
  /// -e 64M --algo tree -n 3`: autotuning gave 1.9 GB/s in 3 runs of 8 and 3.0 in the others
  /// (a run keeps the windows it settles on); fixed 2, 4 and 8 MiB gave 2.9-3.1 in 8 of 8.
  /// Ring and 8-byte latency do not move with it.
  int socket_buffer_bytes = detail::env("COLLX_TCP_BUFFER_BYTES") ? detail::env_int("COLLX_TCP_BUFFER_BYTES", 0, 1 << 30) : 4 << 20;
  /// For launch_processes: rank 0 serves the store on this already-listening socket.
  int serve_store_fd = -1;
};

class tcp {
 public:
  using transport_concept = transport_tag;
  using memory_space = host_memory;
  static constexpr const char* name = "tcp";
  using config = tcp_config;

  /// Bytes of a reduced message received before they are combined.
  static constexpr std::size_t kBounceBytes = std::size_t(64) << 10;
  /// How long a rank with nothing to move polls before it sleeps (see the header comment).
  static constexpr std::chrono::microseconds kSpinTime{100};

  /// Rank `rank` of `size` in job `job`, meeting through cfg's store (cfg.store_path, or the
  /// TCP store at cfg.master_addr:cfg.master_port served by rank 0).
  tcp(std::string job, int rank, int size, config cfg = {})
      : job_(std::move(job)), rank_(rank), n_(size), cfg_(std::move(cfg)), served_(std::exchange(cfg_.serve_store_fd, -1)) {
    if (size < 1 || rank < 0 || rank >= size)
      throw error(errc::invalid_argument, "tcp: rank " + std::to_string(rank) + " is out of range for " + std::to_string(size) + " ranks");
    if (job_.empty() || job_.size() > 128) throw error(errc::invalid_argument, "tcp: the job name must have 1..128 characters");
    rendezvous();
  }

  /// Rank, size, job and MASTER_ADDR/MASTER_PORT from the launcher's environment (environment.hpp).
  static tcp from_env(config cfg = {}) {
    const launch_info li = launch_info_from_env();
    if (cfg.master_addr.empty()) cfg.master_addr = li.master_addr;
    if (cfg.master_port == 0) cfg.master_port = li.master_port;
    if (cfg.store_path.empty() && (cfg.master_addr.empty() || cfg.master_port == 0))
      throw error(errc::invalid_argument, "tcp: found " + li.launcher + "'s rank and size but no rendezvous: set MASTER_ADDR and "
                                          "MASTER_PORT (rank 0 serves the store there), or COLLX_STORE_PATH (a shared directory)");
    return tcp(li.job, li.rank, li.size, std::move(cfg));
  }

  tcp(tcp&& o) noexcept = default;
  tcp& operator=(tcp&& o) noexcept {
    if (this != &o) {
      leave();
      job_ = std::move(o.job_);
      rank_ = o.rank_;
      n_ = o.n_;
      cfg_ = std::move(o.cfg_);
      peers_ = std::move(o.peers_);
      crowded_ = o.crowded_;
      dead_ = o.dead_;
      served_ = std::move(o.served_);
      o.peers_.clear();
    }
    return *this;
  }
  tcp(const tcp&) = delete;
  tcp& operator=(const tcp&) = delete;
  ~tcp() { leave(); }

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return n_; }
  /// Where peer p is (host:port), for messages and tests.
  std::string peer_address(int p) const { return peers_.at(std::size_t(p)).where; }

  void exchange(std::span<const send_desc> sends, std::span<const recv_desc> recvs, const exchange_context& ctx) {
    const call_info& call = *ctx.call;
    if (dead_) call.fail(errc::peer_lost, "the tcp transport of this rank already failed: " + dead_why_);
    const std::size_t elem = std::max<std::size_t>(1, ctx.comb.elem_size);
    ss_.assign(sends.size(), {});
    rs_.assign(recvs.size(), {});
    std::size_t pending = sends.size() + recvs.size();
    for (std::size_t i = 0; i < sends.size(); ++i) {
      ss_[i].h.sig = call.sig;
      ss_[i].h.bytes = sends[i].bytes;
    }
    for (std::size_t i = 0; i < recvs.size(); ++i)
      if (recvs[i].how != combine::copy) {
        if (rs_bounce_.size() <= i) rs_bounce_.resize(i + 1);
        rs_bounce_[i].resize(std::max(elem, kBounceBytes / elem * elem));
      }

    auto first_to = [](auto ops, const auto& st, std::size_t i) { return may_progress(ops, st, i); };

    auto advance = [&]() -> bool {
      bool moved = false;
      for (std::size_t i = 0; i < sends.size(); ++i) {
        send_state& st = ss_[i];
        if (st.done || !first_to(sends, ss_, i)) continue;
        const send_desc& d = sends[i];
        peer& p = peers_[std::size_t(d.peer)];
        while (st.off < sizeof(tcp_wire::msg_header) + d.bytes) {
          iovec iov[2];
          int k = 0;
          if (st.off < sizeof st.h) iov[k++] = {reinterpret_cast<char*>(&st.h) + st.off, sizeof st.h - st.off};
          const std::size_t poff = st.off < sizeof st.h ? 0 : st.off - sizeof st.h;
          if (d.bytes > poff) iov[k++] = {const_cast<std::byte*>(d.data) + poff, d.bytes - poff};
          msghdr m{};
          m.msg_iov = iov;
          m.msg_iovlen = std::size_t(k);
          const ssize_t w = ::sendmsg(p.s.get(), &m, MSG_NOSIGNAL | MSG_DONTWAIT);
          if (w > 0) {
            st.off += std::size_t(w);
            p.mid_send = true;  // the stream is inside a message until it is all written
            moved = true;
            continue;
          }
          if (w < 0 && errno == EINTR) continue;
          if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
          lost(d.peer, call, std::string("sending to it failed: ") + std::strerror(errno));
        }
        if (st.off == sizeof(tcp_wire::msg_header) + d.bytes) {
          st.done = true;
          p.mid_send = false;
          --pending;
        }
      }
      for (std::size_t i = 0; i < recvs.size(); ++i) {
        recv_state& st = rs_[i];
        if (st.done || !first_to(recvs, rs_, i)) continue;
        const recv_desc& d = recvs[i];
        peer& p = peers_[std::size_t(d.peer)];
        if (!st.have_header) {
          while (st.hoff < sizeof st.raw) {
            const ssize_t r = ::recv(p.s.get(), st.raw + st.hoff, sizeof st.raw - st.hoff, MSG_DONTWAIT);
            if (r > 0) {
              st.hoff += std::size_t(r);
              p.mid_recv = true;
              moved = true;
              continue;
            }
            if (r < 0 && errno == EINTR) continue;
            if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
            closed(d.peer, call, r == 0 ? 0 : errno);
          }
          if (st.hoff < sizeof st.raw) continue;
          std::string why;
          const auto h = tcp_wire::parse_header(std::span<const std::byte, sizeof st.raw>(st.raw), why);
          if (!h) garbage(d.peer, call, why);
          if (h->kind == tcp_wire::msg_kind::bye) {
            p.gone = true;
            call.fail(errc::peer_lost, "lost rank " + std::to_string(d.peer) + ": it has left the job (it made fewer calls than this rank)");
          }
          if (h->kind == tcp_wire::msg_kind::abort) aborted(d.peer, call, std::size_t(h->bytes));
          call.check_match(d.peer, h->sig, std::size_t(h->bytes), d.bytes);
          st.have_header = true;
        }
        while (st.off < d.bytes) {
          std::byte* to;
          std::size_t room;
          if (d.how == combine::copy) {
            to = d.dst + st.off;
            room = d.bytes - st.off;
          } else {
            std::vector<std::byte>& b = rs_bounce_[i];
            to = b.data() + st.fill;
            room = std::min(b.size() - st.fill, d.bytes - st.off - st.fill);
          }
          const ssize_t r = ::recv(p.s.get(), to, room, MSG_DONTWAIT);
          if (r > 0) {
            moved = true;
            if (d.how == combine::copy) {
              st.off += std::size_t(r);
              continue;
            }
            st.fill += std::size_t(r);
            // Combine whole elements once the bounce buffer is full or the message complete.
            if (st.fill == rs_bounce_[i].size() || st.off + st.fill == d.bytes) {
              const std::byte* src = rs_bounce_[i].data();
              if (d.how == combine::received_left) ctx.comb(d.dst + st.off, src, d.with + st.off, st.fill / elem);
              else ctx.comb(d.dst + st.off, d.with + st.off, src, st.fill / elem);
              st.off += st.fill;
              st.fill = 0;
            }
            continue;
          }
          if (r < 0 && errno == EINTR) continue;
          if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
          closed(d.peer, call, r == 0 ? 0 : errno);
        }
        if (st.off == d.bytes) {
          st.done = true;
          p.mid_recv = false;
          --pending;
        }
      }
      return moved;
    };

    auto first_pending_peer = [&] {
      for (std::size_t i = 0; i < recvs.size(); ++i)
        if (!rs_[i].done) return recvs[i].peer;
      for (std::size_t i = 0; i < sends.size(); ++i)
        if (!ss_[i].done) return sends[i].peer;
      return -1;
    };

    try {
      auto last_move = net::clock::now();
      while (pending != 0) {
        if (advance()) {
          if (pending != 0) last_move = net::clock::now();
          continue;
        }
        const auto now = net::clock::now();
        if (!crowded_ && now - last_move < kSpinTime) {
          detail::cpu_relax();
          continue;
        }
        if (now - last_move >= call.timeout) {
          const int p = first_pending_peer();
          call.timed_out(p, "its data over tcp, or room to send to it");
        }
        // Sleep in poll() on the sockets that block progress.
        pfd_.clear();
        for (std::size_t i = 0; i < sends.size(); ++i)
          if (!ss_[i].done && first_to(sends, ss_, i)) pfd_.push_back({peers_[std::size_t(sends[i].peer)].s.get(), POLLOUT, 0});
        for (std::size_t i = 0; i < recvs.size(); ++i)
          if (!rs_[i].done && first_to(recvs, rs_, i)) pfd_.push_back({peers_[std::size_t(recvs[i].peer)].s.get(), POLLIN, 0});
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(call.timeout - (now - last_move)).count();
        ::poll(pfd_.data(), pfd_.size(), int(std::clamp<long long>(left + 1, 1, detail::kSleepSlice.count())));
        // poll() reports readiness, hang-ups and errors alike: the next advance() finds out which.
        for (const pollfd& f : pfd_)
          if (f.revents != 0) last_move = std::max(last_move, now);
      }
    } catch (...) {
      throw;
    }
  }

  /// This rank failed: tell peers why where a stream is between messages, then close
  /// everything (peers see the connection end and fail with errc::peer_lost).
  void abort(const std::string& why) noexcept {
    if (dead_) return;
    dead_ = true;
    dead_why_ = why;
    const std::string reason = why.substr(0, tcp_wire::kMaxAbortReason);
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
    std::string where;
    bool mid_send = false, mid_recv = false, gone = false;
  };
  struct send_state {
    tcp_wire::msg_header h;
    std::size_t off = 0;  // bytes of header + payload written
    bool done = false;
  };
  struct recv_state {
    std::byte raw[sizeof(tcp_wire::msg_header)];
    std::size_t hoff = 0;   // header bytes read
    bool have_header = false;
    std::size_t off = 0;    // payload bytes delivered (combined, for reductions)
    std::size_t fill = 0;   // reductions: bytes waiting in the bounce buffer
    bool done = false;
  };

  static void send_frame(peer& p, tcp_wire::msg_kind k, const std::string& payload, net::clock::time_point until) noexcept {
    tcp_wire::msg_header h;
    h.kind = std::uint32_t(k);
    h.bytes = payload.size();
    std::string b(reinterpret_cast<const char*>(&h), sizeof h);
    b += payload;
    // Best effort within a short time: a peer whose buffers are full learns from the close.
    (void)net::write_all(p.s.get(), b.data(), b.size(), until);
  }

  void close_all() noexcept {
    for (peer& p : peers_) p.s.reset();
  }

  [[noreturn]] void lost(int peer_rank, const call_info& call, const std::string& what) {
    peers_[std::size_t(peer_rank)].gone = true;
    call.fail(errc::peer_lost, "lost rank " + std::to_string(peer_rank) + " (" + peers_[std::size_t(peer_rank)].where + "): " + what);
  }
  [[noreturn]] void closed(int peer_rank, const call_info& call, int err) {
    if (err == 0) lost(peer_rank, call, "its connection closed without a farewell (the process died or was killed)");
    lost(peer_rank, call, std::string("its connection failed: ") + std::strerror(err));
  }
  [[noreturn]] void garbage(int peer_rank, const call_info& call, const std::string& why) {
    peers_[std::size_t(peer_rank)].s.reset();  // the stream is out of step: never read it again
    call.fail(errc::transport_error, "garbage on the connection from rank " + std::to_string(peer_rank) + " (" +
                                         peers_[std::size_t(peer_rank)].where + "): " + why);
  }
  [[noreturn]] void aborted(int peer_rank, const call_info& call, std::size_t reason_bytes) {
    std::string why(reason_bytes, '\0');  // bounded by parse_header (kMaxAbortReason)
    const auto r = net::read_exact(peers_[std::size_t(peer_rank)].s.get(), why.data(), why.size(),
                                   net::clock::now() + std::chrono::seconds(1));
    if (r != net::io::ok) why = "(reason lost)";
    for (char& c : why)
      if (static_cast<unsigned char>(c) < 32 && c != '\n') c = '?';
    lost(peer_rank, call, "it failed: " + why);
  }

  // ---- rendezvous -----------------------------------------------------------------------------

  std::string key(const std::string& what) const { return job_ + "/" + what; }

  static std::string random_token() {
    unsigned char b[32];
    std::size_t got = 0;
    while (got < sizeof b) {
      const ssize_t k = getrandom(b + got, sizeof b - got, 0);
      if (k < 0 && errno == EINTR) continue;
      if (k <= 0) net::sys_fail("tcp: getrandom");
      got += std::size_t(k);
    }
    static const char* hex = "0123456789abcdef";
    std::string s;
    for (unsigned char c : b) {
      s += hex[c >> 4];
      s += hex[c & 15];
    }
    return s;
  }

  /// A token as the fixed-size field of a hello.
  static std::array<std::byte, tcp_wire::kTokenBytes> token_field(const std::string& t) {
    std::array<std::byte, tcp_wire::kTokenBytes> f{};
    std::memcpy(f.data(), t.data(), std::min(t.size(), f.size()));
    return f;
  }

  /// This host, so ranks can tell which of them share one (and its cores).
  static std::string host_id() {
    std::string id;
    std::ifstream b("/proc/sys/kernel/random/boot_id");
    std::getline(b, id);
    char h[256] = {};
    gethostname(h, sizeof h - 1);
    id += std::string("@") + h;
    std::string safe;
    for (char c : id.substr(0, 200)) safe += (c == ' ' ? '_' : c);
    return safe;
  }

  void rendezvous() {
    const auto deadline = net::clock::now() + cfg_.rendezvous_timeout;
    if (cfg_.token.size() > tcp_wire::kTokenBytes)
      throw error(errc::invalid_argument, "tcp: COLLX_JOB_TOKEN has " + std::to_string(cfg_.token.size()) + " characters (at most " +
                                              std::to_string(tcp_wire::kTokenBytes) + ")");
    // The store: rank 0 serves it (TCP), or a shared directory.
    std::unique_ptr<store_server> server;
    std::unique_ptr<store> st;
    std::optional<net::address> master;
    if (!cfg_.master_addr.empty() && cfg_.master_port != 0) master = net::resolve(cfg_.master_addr, cfg_.master_port);
    if (!cfg_.store_path.empty()) {
      st = std::make_unique<file_store>(cfg_.store_path);
    } else {
      if (!master && !served_)
        throw error(errc::invalid_argument, "tcp: no rendezvous: give master_addr and master_port, or store_path");
      if (rank_ == 0) {
        net::fd l;
        if (served_) {
          l = std::move(served_);
          net::set_nonblocking(l.get());
        } else {
          net::address any = *master;
          l = net::listen_on(any).first;  // MASTER_ADDR must be this host's address (as with torchrun)
        }
        net::address at;
        at.len = sizeof at.ss;
        getsockname(l.get(), at.sa(), &at.len);
        if (!master) master = at;
        server = std::make_unique<store_server>(std::move(l), cfg_.token);
      } else if (!master) {
        throw error(errc::invalid_argument, "tcp: no rendezvous address for rank " + std::to_string(rank_));
      }
      st = std::make_unique<tcp_store>(*master, cfg_.token, deadline);
    }
    // The token.
    std::string token = cfg_.token;
    if (token.empty()) {
      if (rank_ == 0) {
        token = random_token();
        st->set(key("token"), token);
      } else {
        auto t = st->get(key("token"), deadline);
        if (!t) throw error(errc::timeout, "tcp: rendezvous timed out: rank 0 never published the job's token in " + st->where() +
                                               " (is rank 0 running in job \"" + job_ + "\"?)");
        token = *t;
      }
    }
    const auto tok = token_field(token);
    // Listen, and publish where.
    net::address here;
    if (!cfg_.ifname.empty()) here = net::interface_address(cfg_.ifname);
    else if (master) here = net::route_to(*master);
    else here = net::resolve("127.0.0.1", 0);
    here.set_port(0);
    auto [listener, at] = net::listen_on(here);
    cpu_set_t mine;
    if (sched_getaffinity(0, sizeof mine, &mine) != 0) CPU_ZERO(&mine);
    std::string mask;
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &mine)) mask += std::to_string(c) + ",";
    const std::string me_host = host_id();
    st->set(key("addr/" + std::to_string(rank_)), at.str() + " " + me_host + " " + mask);

    peers_.clear();
    peers_.resize(std::size_t(n_));
    // Addresses: of the lower ranks first, to connect to them; those of the higher ranks are
    // in the store by the time they have connected here (each publishes before it connects),
    // and tell which ranks share this host (and its cores).
    std::vector<net::address> addr(static_cast<std::size_t>(n_));
    std::vector<std::string> published(static_cast<std::size_t>(n_));
    auto fetch = [&](int q) {
      auto v = st->get(key("addr/" + std::to_string(q)), deadline);
      if (!v) {
        std::string missing;
        for (int x = 0; x < n_; ++x)
          if (x != rank_ && !st->get(key("addr/" + std::to_string(x)), net::clock::now()))
            missing += (missing.empty() ? "" : ", ") + std::to_string(x);
        throw error(errc::timeout, "tcp: rendezvous of job \"" + job_ + "\" timed out at rank " + std::to_string(rank_) +
                                       ": rank(s) " + missing + " never published an address in " + st->where() +
                                       " (not started, or started for another job or size?)");
      }
      const std::string& s = *v;
      const auto sp1 = s.find(' ');
      if (sp1 == std::string::npos || s.find(' ', sp1 + 1) == std::string::npos)
        throw error(errc::transport_error, "tcp: rank " + std::to_string(q) + " published a malformed address \"" + s + "\"");
      addr[std::size_t(q)] = net::parse_host_port(s.substr(0, sp1));
      peers_[std::size_t(q)].where = s.substr(0, sp1);
      published[std::size_t(q)] = s;
    };
    for (int q = 0; q < rank_; ++q) fetch(q);
    connect_mesh(listener, addr, tok, deadline);
    for (int q = rank_ + 1; q < n_; ++q) fetch(q);
    cpu_set_t host_cores;
    CPU_ZERO(&host_cores);
    CPU_OR(&host_cores, &host_cores, &mine);
    int on_host = 1;
    for (int q = 0; q < n_; ++q) {
      const std::string& s = published[std::size_t(q)];
      if (q == rank_) continue;
      const auto sp1 = s.find(' '), sp2 = s.find(' ', sp1 + 1);
      if (s.substr(sp1 + 1, sp2 - sp1 - 1) != me_host) continue;
      ++on_host;
      std::size_t i = sp2 + 1;
      while (i < s.size()) {
        const std::size_t j = s.find(',', i);
        if (j == std::string::npos) break;
        const int c = std::atoi(s.substr(i, j - i).c_str());
        if (c >= 0 && c < CPU_SETSIZE) CPU_SET(c, &host_cores);
        i = j + 1;
      }
    }
    crowded_ = on_host > std::max(1, CPU_COUNT(&host_cores));

    // Rank 0's store must outlive every rank's use of it: each counts itself done, and rank 0
    // waits for all of them before its server goes.
    st->set(key("ready/" + std::to_string(rank_)), "1");
    // The last rank to finish removes the job's keys (a file store would hand them to a later
    // job of the same name).
    if (st->add(key("ready"), 1) == n_) st->erase_prefix(job_ + "/");
    if (server) {
      while (st->add(key("ready"), 0) < n_) {
        if (net::clock::now() >= deadline) {
          std::string missing;
          for (int q = 0; q < n_; ++q)
            if (!st->get(key("ready/" + std::to_string(q)), net::clock::now())) missing += (missing.empty() ? "" : ", ") + std::to_string(q);
          throw error(errc::timeout, "tcp: rendezvous of job \"" + job_ + "\" timed out waiting for rank(s) " + missing +
                                         " to finish it (they stopped or died while connecting)");
        }
        ::usleep(1000);
      }
    }
    for (peer& p : peers_)
      if (p.s && cfg_.socket_buffer_bytes > 0) {
        setsockopt(p.s.get(), SOL_SOCKET, SO_SNDBUF, &cfg_.socket_buffer_bytes, sizeof cfg_.socket_buffer_bytes);
        setsockopt(p.s.get(), SOL_SOCKET, SO_RCVBUF, &cfg_.socket_buffer_bytes, sizeof cfg_.socket_buffer_bytes);
      }
    dead_ = false;
  }

  /// Connects to every lower rank and admits every higher one, concurrently.
  void connect_mesh(net::fd& listener, const std::vector<net::address>& addr, const std::array<std::byte, tcp_wire::kTokenBytes>& tok,
                    net::clock::time_point deadline) {
    struct outgoing { int peer; std::size_t got = 0; tcp_wire::verdict v; bool done = false; };
    struct incoming { net::fd s; std::string from; std::size_t got = 0; tcp_wire::hello h; net::clock::time_point until; };
    std::vector<outgoing> outs;
    for (int q = 0; q < rank_; ++q) {
      std::string why;
      net::fd s = net::connect_until(addr[std::size_t(q)], deadline, why);
      if (!s)
        throw error(errc::timeout, "tcp: rendezvous of job \"" + job_ + "\": rank " + std::to_string(rank_) + " could not connect to rank " +
                                       std::to_string(q) + " at " + addr[std::size_t(q)].str() + ": " + why);
      tcp_wire::hello h;
      h.rank = std::uint32_t(rank_);
      h.size = std::uint32_t(n_);
      std::memcpy(h.token, tok.data(), tok.size());
      if (net::write_all(s.get(), &h, sizeof h, deadline) != net::io::ok)
        throw error(errc::peer_lost, "tcp: rendezvous: rank " + std::to_string(q) + " at " + addr[std::size_t(q)].str() + " closed the connection");
      peers_[std::size_t(q)].s = std::move(s);
      outs.push_back(outgoing{q, 0, {}, false});
    }
    std::vector<incoming> ins;
    int admitted = 0, verdicts = 0;
    const int expect_in = n_ - 1 - rank_;
    std::vector<pollfd> pf;
    while (admitted < expect_in || verdicts < int(outs.size())) {
      const auto now = net::clock::now();
      if (now >= deadline) {
        std::string missing;
        for (int q = rank_ + 1; q < n_; ++q)
          if (!peers_[std::size_t(q)].s) missing += (missing.empty() ? "" : ", ") + std::to_string(q);
        std::string silent;
        for (const outgoing& o : outs)
          if (!o.done) silent += (silent.empty() ? "" : ", ") + std::to_string(o.peer);
        throw error(errc::timeout, "tcp: rendezvous of job \"" + job_ + "\" timed out at rank " + std::to_string(rank_) +
                                       (missing.empty() ? "" : ": no admitted connection from rank(s) " + missing) +
                                       (silent.empty() ? "" : ": no answer to its hello from rank(s) " + silent));
      }
      pf.clear();
      pf.push_back({listener.get(), POLLIN, 0});
      for (const incoming& in : ins) pf.push_back({in.s.get(), POLLIN, 0});
      for (const outgoing& o : outs) pf.push_back({peers_[std::size_t(o.peer)].s.get(), short(o.done ? 0 : POLLIN), 0});
      ::poll(pf.data(), pf.size(), net::ms_until(deadline));
      if (pf[0].revents & POLLIN)
        for (;;) {
          net::address a;
          a.len = sizeof a.ss;
          const int f = ::accept4(listener.get(), a.sa(), &a.len, SOCK_CLOEXEC | SOCK_NONBLOCK);
          if (f < 0) break;
          net::set_nodelay(f);
          // A stranger that connects and says nothing is dropped after a few seconds.
          ins.push_back({net::fd(f), a.str(), 0, {}, std::min(deadline, net::clock::now() + std::chrono::seconds(5))});
        }
      for (incoming& in : ins) {
        if (!in.s) continue;
        const ssize_t k = ::recv(in.s.get(), reinterpret_cast<char*>(&in.h) + in.got, sizeof in.h - in.got, MSG_DONTWAIT);
        if (k > 0) in.got += std::size_t(k);
        const bool eof = k == 0 || (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
        if (in.got < sizeof in.h) {
          if (eof || net::clock::now() >= in.until) {
            refuse(in.from, eof ? "closed before its hello" : "sent no hello in time");
            in.s.reset();
          }
          continue;
        }
        int who = -1;
        auto code = tcp_wire::check_hello(std::span<const std::byte, sizeof in.h>(reinterpret_cast<const std::byte*>(&in.h), sizeof in.h),
                                          rank_, n_, tok, who);
        if (code == tcp_wire::verdict_code::admitted && peers_[std::size_t(who)].s) code = tcp_wire::verdict_code::duplicate;
        tcp_wire::verdict v;
        v.code = std::uint32_t(code);
        const bool sent = net::write_all(in.s.get(), &v, sizeof v, net::clock::now() + std::chrono::seconds(1)) == net::io::ok;
        if (code == tcp_wire::verdict_code::admitted && sent) {
          peers_[std::size_t(who)].s = std::move(in.s);
          ++admitted;
        } else {
          refuse(in.from, tcp_wire::describe(code));
          in.s.reset();
        }
      }
      std::erase_if(ins, [](const incoming& in) { return !in.s; });
      for (outgoing& o : outs) {
        if (o.done) continue;
        peer& p = peers_[std::size_t(o.peer)];
        const ssize_t k = ::recv(p.s.get(), reinterpret_cast<char*>(&o.v) + o.got, sizeof o.v - o.got, MSG_DONTWAIT);
        if (k > 0) o.got += std::size_t(k);
        else if (k == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
          throw error(errc::peer_lost, "tcp: rendezvous: rank " + std::to_string(o.peer) + " at " + p.where + " closed the connection before admitting rank " +
                                           std::to_string(rank_));
        if (o.got < sizeof o.v) continue;
        const auto code = tcp_wire::parse_verdict(std::span<const std::byte, sizeof o.v>(reinterpret_cast<const std::byte*>(&o.v), sizeof o.v));
        if (!code) throw error(errc::transport_error, "tcp: rendezvous: garbage instead of a verdict from " + p.where + " (rank " + std::to_string(o.peer) + ")");
        if (*code != tcp_wire::verdict_code::admitted)
          throw error(errc::invalid_argument, "tcp: rank " + std::to_string(o.peer) + " at " + p.where + " refused rank " + std::to_string(rank_) +
                                                  ": " + tcp_wire::describe(*code) + " (do both ranks run the same job with the same COLLX_JOB_TOKEN?)");
        o.done = true;
        ++verdicts;
      }
    }
  }

  void refuse(const std::string& from, const char* why) const {
    std::fprintf(stderr, "collx tcp: job \"%s\" rank %d refused a connection from %s: %s\n", job_.c_str(), rank_, from.c_str(), why);
  }

  std::string job_;
  int rank_ = 0, n_ = 1;
  config cfg_;
  std::vector<peer> peers_;
  bool crowded_ = false;
  bool dead_ = true;
  std::string dead_why_;
  std::vector<send_state> ss_;
  std::vector<recv_state> rs_;
  std::vector<std::vector<std::byte>> rs_bounce_;
  std::vector<pollfd> pfd_;
  net::fd served_;  // launch_processes: the store's listening socket (rank 0), owned from the start
};

}  // namespace collx::transport
