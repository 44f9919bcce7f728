#pragma once
// communicator::shrink over transport::tcp (core/split_plan.hpp): the survivors of a failure find
// each other and agree on who they are, with nothing but what each rank keeps for it: the
// socket it listens on (every communicator keeps its own, and its peers know where it is), and
// the job's secret.
//
// Finding. Each survivor connects to every other rank's listener and sends a shrink hello
// (its rank, the epoch, the communicator's job hash, a MAC keyed with the secret: never the
// secret). A rank whose process is gone
// has no listener: the connection is refused (or reset, if it died with the connection
// queued), and the rank is dead. A live rank that has not called shrink yet leaves the
// connection in its listener's queue (or, waiting in a call, sets it aside unread:
// tcp/desync.hpp), and answers (a verdict) once it does. So after this
// phase a survivor has heard every other rank answer, or knows it dead, or has reached its
// deadline (a rank that stopped, or never calls shrink: counted lost; a rank that said hello
// but never answered went on without this one, which then fails). Of the two connections
// between a pair, the higher rank's stays: the new communicator's, as at the job's start the
// higher rank connects to the lower.
//
// Agreeing. In rounds, each survivor sends every rank it counts alive its view (one flag per
// rank, and the address of the listener its new communicator keeps) and reads theirs; a
// connection that fails drops its rank. The next view is the intersection of what it read.
// When a round brings back its own view from every rank in it, the view is the new
// communicator: every survivor ends in the same round with the same view, unless a rank dies
// in that very round (then its peers' next call on the new communicator reports it, and they
// shrink again). Views go to the ranks a view dropped too, so a rank the others count lost
// learns it and fails with errc::peer_lost; a live rank silent past the deadline fails the
// shrink (errc::timeout) rather than being dropped by some and not others.
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "../../core/error.hpp"
#include "../../core/split_plan.hpp"
#include "auth.hpp"
#include "config.hpp"
#include "proofs.hpp"
#include "rendezvous.hpp"
#include "socket.hpp"
#include "wire.hpp"

namespace collx::transport::tcp_detail {

/// What a shrink over tcp ends with.
struct shrunk {
  std::vector<int> members;  // the survivors: ranks of the old communicator, ascending
  std::vector<conn> peers;   // the connection to each, by new rank (none to itself)
  net::fd listener;          // the new communicator's: its own later shrink finds it there
};

class shrinker {
 public:
  /// Rank `rank` of `n` of the communicator named `job` (its peers listen at where[q]; this rank
  /// at `listener`), for shrink request q.
  shrinker(int rank, int n, const std::string& job, const std::string& token, std::vector<std::string> where, int listener,
           const shrink_request& q, const tcp_config& cfg, std::vector<net::fd> parked = {})
      : me_(rank), n_(n), job_(job), job_hash_(detail::fnv1a(job)), secret_(token), where_(std::move(where)),
        listener_(listener), q_(q), cfg_(cfg), out_(std::size_t(n)), link_(std::size_t(n)), dead_(std::size_t(n), 0),
        in_ok_(std::size_t(n), 0), parked_(std::move(parked)) {}

  shrunk run() {
    find();
    return agree();
  }

 private:
  enum class out_phase : std::uint8_t { connecting, verdict, done };
  struct answer {  // a verdict and the answering rank's proof (tcp/proofs.hpp, shrink_answer_mac)
    tcp_wire::verdict v;
    std::byte mac[tcp_wire::kMac];
  };
  struct out_conn {
    net::fd s;
    out_phase ph = out_phase::connecting;
    std::size_t got = 0;
    tcp_wire::shrink_hello sent;  // this rank's hello to it: the answer's proof covers it
    answer a;
  };
  struct in_conn {
    net::fd s;
    std::size_t got = 0;
    tcp_wire::shrink_hello h;
    net::clock::time_point until;
  };

  [[noreturn]] void fail(errc c, const std::string& what) const { throw error(c, q_.what + ": " + what); }

  /// A shrink hello's MAC (tcp/proofs.hpp). (A hello replayed in its own shrink meets the real
  /// one, a duplicate; in any other, another epoch or communicator.)
  tcp_auth::mac hello_mac(const tcp_wire::shrink_hello& h, int to) const { return shrink_mac(secret_, job_, h, to); }

  void mark_dead(int q) {
    dead_[std::size_t(q)] = 1;
    out_[std::size_t(q)].s.reset();
    link_[std::size_t(q)].reset();
  }
  bool resolved(int q) const {
    return q == me_ || dead_[std::size_t(q)] != 0 || (out_[std::size_t(q)].ph == out_phase::done && in_ok_[std::size_t(q)] != 0);
  }

  void send_hello(int q) {
    tcp_wire::shrink_hello h;
    h.rank = std::uint32_t(me_);
    h.size = std::uint32_t(n_);
    h.epoch = q_.epoch;
    h.job = job_hash_;
    const tcp_auth::nonce n = tcp_auth::fresh_nonce();
    std::memcpy(h.nonce, n.data(), n.size());
    const tcp_auth::mac m = hello_mac(h, q);
    std::memcpy(h.mac, m.data(), m.size());
    out_[std::size_t(q)].sent = h;
    if (net::write_all(out_[std::size_t(q)].s.get(), &h, sizeof h, net::clock::now() + std::chrono::seconds(1)) != net::io::ok)
      return mark_dead(q);  // its connection closed as this rank said hello: the process died
    out_[std::size_t(q)].ph = out_phase::verdict;
  }

  void start_connect(int q) {
    net::address a;
    try {
      a = net::parse_host_port(where_[std::size_t(q)]);
    } catch (const std::exception& e) {
      fail(errc::transport_error, "rank " + std::to_string(q) + "'s address " + where_[std::size_t(q)] + " does not parse: " + e.what());
    }
    bool connected = false;
    net::fd s = net::connect_start(a, connected);
    if (!s) return mark_dead(q);  // its listener refused a connection: the process is gone
    out_[std::size_t(q)].s = std::move(s);
    if (connected) send_hello(q);
  }

  /// Phase 1 (see the top): connect to everyone, answer everyone, until every rank has
  /// answered, is dead, or the deadline has passed.
  void find() {
    const auto deadline = net::clock::now() + q_.timeout;
    for (int q = 0; q < n_; ++q)
      if (q != me_) start_connect(q);
    std::vector<in_conn> ins;
    // Connections a wait of this rank accepted while it answered position queries, unread.
    for (net::fd& f : parked_) ins.push_back({std::move(f), 0, {}, std::min(deadline, net::clock::now() + std::chrono::seconds(5))});
    parked_.clear();
    std::vector<pollfd> pf;
    std::vector<int> who;  // what pf[i] is: -1 the listener, q < n_ out_[q], n_ + q link_[q], 2 n_ + k ins[k]
    std::vector<char> quiet(std::size_t(n_), 0);  // a link with data already (a peer in the next phase): not watched
    for (bool first = true;; first = false) {
      bool all = true;
      for (int q = 0; q < n_ && all; ++q) all = resolved(q);
      // (not before one look at what waits in the listener's queue: the hellos of ranks that
      // went on without this one, which say so, even once they have gone)
      if (all && !first) return;
      if (net::clock::now() >= deadline) {
        for (int q = 0; q < n_; ++q) {
          if (resolved(q)) continue;
          // It said hello in this shrink, and lives (its listener took this rank's connection),
          // but never answered: it went on without this rank, which came after its deadline.
          if (in_ok_[std::size_t(q)] != 0)
            fail(errc::peer_lost, "rank " + std::to_string(q) + " joined this shrink but never answered this rank: the survivors "
                                  "went on without it (it joined after their deadline)");
          // Its hello went unanswered: say after it that this rank goes on without q, which
          // reads both if it comes late, even once this rank has gone (they wait in its queue).
          if (out_[std::size_t(q)].ph == out_phase::verdict && out_[std::size_t(q)].s) {
            tcp_wire::verdict v;
            v.code = std::uint32_t(tcp_wire::verdict_code::excluded);
            (void)net::write_all(out_[std::size_t(q)].s.get(), &v, sizeof v, net::clock::now() + std::chrono::milliseconds(50));
          }
          mark_dead(q);  // no sign of life before the deadline: stopped, or not calling shrink
        }
        return;
      }
      pf.clear();
      who.clear();
      pf.push_back({listener_, POLLIN, 0});
      who.push_back(-1);
      for (int q = 0; q < n_; ++q) {
        const out_conn& o = out_[std::size_t(q)];
        if (o.s && o.ph != out_phase::done) {
          pf.push_back({o.s.get(), short(o.ph == out_phase::connecting ? POLLOUT : POLLIN), 0});
          who.push_back(q);
        }
        if (link_[std::size_t(q)] && quiet[std::size_t(q)] == 0) {
          pf.push_back({link_[std::size_t(q)].get(), POLLIN, 0});
          who.push_back(n_ + q);
        }
      }
      for (std::size_t k = 0; k < ins.size(); ++k) {
        pf.push_back({ins[k].s.get(), POLLIN, 0});
        who.push_back(2 * n_ + int(k));
      }
      ::poll(pf.data(), pf.size(), all ? 0 : net::ms_until(deadline));
      for (std::size_t i = 0; i < pf.size(); ++i) {
        if (pf[i].revents == 0) continue;
        const int w = who[i];
        if (w < 0) {
          for (int k = 0; k < rendezvous::kAcceptPerPass; ++k) {  // (bounded, as a rendezvous's)
            net::address a;
            a.len = sizeof a.ss;
            const int f = ::accept4(listener_, a.sa(), &a.len, SOCK_CLOEXEC | SOCK_NONBLOCK);
            if (f < 0) break;
            net::set_nodelay(f);
            // a flood: the oldest not yet heard out makes room (closed here, removed after the pass)
            if (std::count_if(ins.begin(), ins.end(), [](const in_conn& x) { return bool(x.s); }) >= std::ptrdiff_t(rendezvous::kMaxUnproven)) {
              in_conn* oldest = nullptr;
              for (in_conn& x : ins)
                if (x.s && (oldest == nullptr || x.until < oldest->until)) oldest = &x;
              oldest->s.reset();
            }
            ins.push_back({net::fd(f), 0, {}, std::min(deadline, net::clock::now() + rendezvous::kLogin)});
          }
        } else if (w < n_) {
          on_out(w);
        } else if (w < 2 * n_) {
          const int q = w - n_;
          char c;
          const ssize_t r = ::recv(link_[std::size_t(q)].get(), &c, 1, MSG_PEEK | MSG_DONTWAIT);
          if (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
            mark_dead(q);  // its connection closed during the shrink: the process died
          else if (r > 0)
            quiet[std::size_t(q)] = 1;
        }
      }
      for (in_conn& in : ins) on_in(in);
      std::erase_if(ins, [](const in_conn& in) { return !in.s; });
    }
  }

  /// This rank's connection to q: connected (say hello), or its verdict arrived.
  void on_out(int q) {
    out_conn& o = out_[std::size_t(q)];
    if (o.ph == out_phase::connecting) {
      int err = 0;
      socklen_t el = sizeof err;
      getsockopt(o.s.get(), SOL_SOCKET, SO_ERROR, &err, &el);
      if (err != 0) return mark_dead(q);  // its listener refused the connection: the process is gone
      return send_hello(q);
    }
    const ssize_t k = ::recv(o.s.get(), reinterpret_cast<char*>(&o.a) + o.got, sizeof o.a - o.got, MSG_DONTWAIT);
    if (k > 0) o.got += std::size_t(k);
    else if (k == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
      return mark_dead(q);  // its connection closed before it answered this rank's hello: the process died
    if (o.got < sizeof o.a) return;
    const auto code = tcp_wire::parse_verdict(std::span<const std::byte, sizeof o.a.v>(reinterpret_cast<const std::byte*>(&o.a.v), sizeof o.a.v));
    if (!code) fail(errc::transport_error, "garbage instead of a verdict from rank " + std::to_string(q) + " at " + where_[std::size_t(q)]);
    if (!tcp_auth::same({o.a.mac, tcp_wire::kMac}, shrink_answer_mac(secret_, job_, o.sent, q, o.a.v.code)))
      fail(errc::invalid_argument, "the answer from rank " + std::to_string(q) + "'s address " + where_[std::size_t(q)] +
                                       " does not prove it holds the job's secret (another process holds that address now?)");
    if (*code != tcp_wire::verdict_code::admitted)
      fail(errc::invalid_argument, "rank " + std::to_string(q) + " refused this rank's shrink hello: " + tcp_wire::describe(*code));
    o.ph = out_phase::done;
    if (q < me_) link_[std::size_t(q)] = std::move(o.s);  // the higher rank's connection stays
    else o.s.reset();
  }

  /// A connection to this rank's listener: its hello, checked and answered.
  void on_in(in_conn& in) {
    if (!in.s) return;
    const ssize_t k = ::recv(in.s.get(), reinterpret_cast<char*>(&in.h) + in.got, sizeof in.h - in.got, MSG_DONTWAIT);
    if (k > 0) in.got += std::size_t(k);
    const bool eof = k == 0 || (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
    if (in.got < sizeof in.h) {
      // A connection queued before this shrink (a split's or a stranger's) or one that says
      // nothing is dropped.
      if (eof || net::clock::now() >= in.until) in.s.reset();
      return;
    }
    int peer = -1;
    auto code = tcp_wire::check_shrink_hello(std::span<const std::byte, sizeof in.h>(reinterpret_cast<const std::byte*>(&in.h), sizeof in.h),
                                             me_, n_, q_.epoch, job_hash_, tcp_auth::same({in.h.mac, tcp_wire::kMac}, hello_mac(in.h, me_)), peer);
    if (code == tcp_wire::verdict_code::admitted) {
      // Its sender's deadline passed before this rank came: it said so after its hello.
      tcp_wire::verdict after;
      if (::recv(in.s.get(), &after, sizeof after, MSG_PEEK | MSG_DONTWAIT) == ssize_t(sizeof after)) {
        const auto c = tcp_wire::parse_verdict(std::span<const std::byte, sizeof after>(reinterpret_cast<const std::byte*>(&after), sizeof after));
        if (c && *c == tcp_wire::verdict_code::excluded)
          fail(errc::peer_lost, "rank " + std::to_string(peer) + " went on without this rank: " + tcp_wire::describe(*c));
      }
    }
    if (code == tcp_wire::verdict_code::admitted && in_ok_[std::size_t(peer)] != 0) code = tcp_wire::verdict_code::duplicate;
    answer a;
    a.v.code = std::uint32_t(code);
    const tcp_auth::mac m = shrink_answer_mac(secret_, job_, in.h, me_, a.v.code);
    std::memcpy(a.mac, m.data(), m.size());
    const bool sent = net::write_all(in.s.get(), &a, sizeof a, net::clock::now() + std::chrono::seconds(1)) == net::io::ok;
    if (code != tcp_wire::verdict_code::admitted || !sent) {
      in.s.reset();
      return;
    }
    in_ok_[std::size_t(peer)] = 1;
    if (dead_[std::size_t(peer)] != 0) {  // counted dead already (it answered after this rank's deadline)
      in.s.reset();
      return;
    }
    if (peer > me_) link_[std::size_t(peer)] = std::move(in.s);
    else in.s.reset();
  }

  /// Phase 2 (see the top): rounds of views until one comes back unchanged from everyone.
  shrunk agree() {
    const auto deadline = net::clock::now() + q_.timeout;
    shrunk out;
    if (n_ > 1) {
      net::address here;
      here.len = sizeof here.ss;
      if (getsockname(listener_, here.sa(), &here.len) != 0) net::sys_fail("tcp: shrink: getsockname");
      here.set_port(0);
      auto [l, at] = net::listen_on(here);
      out.listener = std::move(l);
      mine_where_ = at.str();
      if (mine_where_.size() >= tcp_wire::kShrinkWhere) fail(errc::transport_error, "address " + mine_where_ + " is too long");
    }
    std::vector<char> view(static_cast<std::size_t>(n_));
    for (int r = 0; r < n_; ++r) view[std::size_t(r)] = r == me_ || dead_[std::size_t(r)] == 0;
    std::vector<std::string> peer_where(static_cast<std::size_t>(n_));
    const std::size_t bytes = tcp_wire::shrink_view_bytes(n_);
    std::vector<std::byte> frame(bytes), in(bytes);
    std::vector<char> theirs;
    for (std::uint32_t round = 0;; ++round) {
      if (round > std::uint32_t(n_) + 2) fail(errc::transport_error, "the survivors' views did not settle in " + std::to_string(round) + " rounds");
      tcp_wire::shrink_view_head h;
      h.epoch = q_.epoch;
      h.round = round;
      h.n = std::uint32_t(n_);
      std::memcpy(frame.data(), &h, sizeof h);
      for (int r = 0; r < n_; ++r) frame[sizeof h + std::size_t(r)] = std::byte(view[std::size_t(r)]);
      std::memset(frame.data() + sizeof h + std::size_t(n_), 0, tcp_wire::kShrinkWhere);
      std::memcpy(frame.data() + sizeof h + std::size_t(n_), mine_where_.data(), mine_where_.size());
      std::vector<char> next = view;
      bool same = true;
      // To every rank this one still has a connection to: those its view dropped (others
      // counted them dead) learn from it that they are left out, rather than wait.
      for (int q = 0; q < n_; ++q)
        if (q != me_ && link_[std::size_t(q)] &&
            net::write_all(link_[std::size_t(q)].get(), frame.data(), bytes, deadline) != net::io::ok && view[std::size_t(q)] != 0)
          lose(q, next, same);  // its connection failed as this rank sent its view
      for (int q = 0; q < n_; ++q) {
        if (q == me_ || view[std::size_t(q)] == 0 || !link_[std::size_t(q)]) continue;
        const net::io r = net::read_exact(link_[std::size_t(q)].get(), in.data(), bytes, deadline);
        if (r == net::io::timeout)  // alive (its connection stands) but silent: not a death to agree on
          fail(errc::timeout, "rank " + std::to_string(q) + " sent no view of round " + std::to_string(round) + " before the deadline");
        if (r != net::io::ok) {
          lose(q, next, same);  // the connection closed: the process died
          continue;
        }
        std::string where, why;
        if (!tcp_wire::parse_shrink_view(in, q_.epoch, round, n_, theirs, where, why))
          fail(errc::transport_error, "garbage instead of a view from rank " + std::to_string(q) + ": " + why);
        if (theirs[std::size_t(me_)] == 0)
          fail(errc::peer_lost, "rank " + std::to_string(q) + " counts this rank lost: the survivors went on without it (it joined after their deadline)");
        if (theirs != view) same = false;
        for (int r = 0; r < n_; ++r) next[std::size_t(r)] = char(next[std::size_t(r)] & theirs[std::size_t(r)]);
        peer_where[std::size_t(q)] = where;
      }
      if (same && next == view) break;
      view = std::move(next);
    }
    for (int r = 0; r < n_; ++r)
      if (view[std::size_t(r)] != 0) out.members.push_back(r);
    out.peers.resize(out.members.size());
    for (std::size_t k = 0; k < out.members.size(); ++k) {
      const int r = out.members[k];
      if (r == me_) continue;
      out.peers[k].s = std::move(link_[std::size_t(r)]);
      out.peers[k].where = peer_where[std::size_t(r)];
      if (cfg_.socket_buffer_bytes > 0) {
        setsockopt(out.peers[k].s.get(), SOL_SOCKET, SO_SNDBUF, &cfg_.socket_buffer_bytes, sizeof cfg_.socket_buffer_bytes);
        setsockopt(out.peers[k].s.get(), SOL_SOCKET, SO_RCVBUF, &cfg_.socket_buffer_bytes, sizeof cfg_.socket_buffer_bytes);
      }
    }
    // Links to ranks the view dropped: their last frame from this rank (they are left out) is
    // read before the close, which must not be a reset that could discard it.
    for (net::fd& l : link_) {
      if (!l) continue;
      ::shutdown(l.get(), SHUT_WR);
      char sink[4096];
      for (int k = 0; k < 64 && ::recv(l.get(), sink, sizeof sink, MSG_DONTWAIT) > 0; ++k) {}
      l.reset();
    }
    return out;
  }

  void lose(int q, std::vector<char>& next, bool& same) {
    mark_dead(q);
    next[std::size_t(q)] = 0;
    same = false;
  }

  int me_, n_;
  std::string job_;
  std::uint64_t job_hash_;
  std::string secret_;
  std::vector<std::string> where_;
  int listener_;
  const shrink_request& q_;
  const tcp_config& cfg_;
  std::vector<out_conn> out_;
  std::vector<net::fd> link_;  // the connection to each rank that stays (see the top)
  std::vector<char> dead_, in_ok_;
  std::vector<net::fd> parked_;
  std::string mine_where_;
};

}  // namespace collx::transport::tcp_detail
