#pragma once
// The desync report over tcp: where the other ranks are, asked of them when a rank times out.
//
// tcp ranks share no memory, so no rank can read another's position (detail::position) as over
// threads and shm. Instead each communicator's listening socket (kept for shrink) answers
// queries: a rank that times out connects to every peer's listener, sends a query (the
// communicator's hash, and a MAC keyed with the job's secret), and the peer answers with its position on that
// communicator and where it is blocked on another, if it is. Every process with a tcp
// communicator has one answering thread (`answerer`), which sleeps in poll on every listener
// of its process (query_registry) and answers at any time, so a rank busy in its own code says
// where it last was ("rank 3 is done with all_reduce #41") as over threads and shm; a rank
// blocked in a collx call over tcp also serves the listeners in its poll loop. A stopped or hung
// process does not answer ("does not answer"), a dead one refuses the connection ("gone"). A
// shrink's hello whose MAC holds is left unread, set aside for shrink; anything else, and a
// connection silent for 5 s, is closed (strangers cannot fill what is set aside).
// Nothing of it is on the path of a call that does not wait: the listeners join a call's poll
// only once it sleeps.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "../../core/flight_record.hpp"
#include "auth.hpp"
#include "proofs.hpp"
#include "socket.hpp"
#include "wire.hpp"

namespace collx::transport::tcp_detail {

/// One communicator's listener, as this process answers position queries on it.
struct query_point {
  pid_t pid = ::getpid();  // the process it belongs to: a forked child does not serve its parent's
  int listener = -1;
  int rank = 0, size = 1;
  std::uint64_t job = 0;
  std::string name;    // the communicator's job name
  std::string secret;  // the job's (tcp/secret.hpp): a query carries a MAC keyed with it, never it
  const detail::position* own = nullptr;  // this rank's position on the communicator
  std::vector<int> parked;                // connections that were not queries (a shrink's hellos), for shrink
  struct pending_conn {
    int fd;
    net::clock::time_point since;
  };
  std::vector<pending_conn> pending;      // accepted, nothing read yet: looked at again as bytes come
  bool shrinking = false;                 // its shrink has begun: the shrink alone accepts on it now
  net::clock::time_point quiet_until{};   // accept failed (out of descriptors): left alone until then
  /// At most this many set aside: every peer's shrink hello fits, and past it connections stay
  /// in the listener's queue (never closed unread: a closed hello reads as a dead rank).
  std::size_t max_parked() const noexcept { return std::size_t(4 * size + 16); }
  /// How long an accepted connection may take to say what it is (a shrink writes its hello as
  /// soon as it is connected, a query likewise).
  static constexpr std::chrono::seconds kPendingFor{5};

  query_point() = default;
  query_point(const query_point&) = delete;
  query_point& operator=(const query_point&) = delete;
  /// Closes what it set aside and nobody took (take_parked).
  ~query_point() {
    for (int f : parked) ::close(f);
    for (const auto& c : pending) ::close(c.fd);
  }
};

inline void answer_loop();

/// Every query point of this process, and the thread that answers on them. Never destroyed (a
/// communicator may outlive statics).
struct query_registry {
  std::mutex mu;  // the points and what they hold
  std::vector<query_point*> all;
  // The answering thread: started with the process's first point, joined when its last goes
  // (under `life`, taken before `mu`; the thread takes only `mu`). A forked child inherits the
  // parent's record of a thread it does not have: `owner` says whose it is.
  std::mutex life;
  std::thread* answerer = nullptr;
  pid_t owner = 0;
  bool stop = false;   // under mu
  int wake_r = -1, wake_w = -1;
  static query_registry& get() {
    static query_registry* r = new query_registry;
    return *r;
  }
  std::size_t mine_locked() const {
    const pid_t me = ::getpid();
    return std::size_t(std::count_if(all.begin(), all.end(), [me](const query_point* p) { return p->pid == me; }));
  }
  /// Under life: the thread runs (started now if it did not).
  void start_locked() {
    if (answerer != nullptr && owner == ::getpid()) return;
    // A fork while the thread holds `mu` would leave it locked for good in the child (a
    // DataLoader's workers are forked): fork takes both locks first, and both sides let go.
    static const bool at_fork = [] {
      pthread_atfork([] {
        get().life.lock();
        get().mu.lock();
      }, [] {
        get().mu.unlock();
        get().life.unlock();
      }, [] {
        get().mu.unlock();
        get().life.unlock();
      });
      return true;
    }();
    (void)at_fork;
    answerer = nullptr;  // (a parent's, in a forked child: not ours to join)
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0) return;  // no thread: ranks answer while they wait
    {
      std::lock_guard g(mu);
      stop = false;
      wake_r = fds[0];
      wake_w = fds[1];
    }
    // The thread takes no signals (the application's handlers run on its own threads).
    sigset_t all_signals, was;
    sigfillset(&all_signals);
    pthread_sigmask(SIG_SETMASK, &all_signals, &was);
    try {
      answerer = new std::thread(answer_loop);
      owner = ::getpid();
    } catch (...) {
      ::close(fds[0]);
      ::close(fds[1]);
      wake_r = wake_w = -1;
    }
    pthread_sigmask(SIG_SETMASK, &was, nullptr);
  }
  /// Under life: the thread ends and is joined.
  void stop_locked() noexcept {
    if (answerer == nullptr || owner != ::getpid()) return;
    {
      std::lock_guard g(mu);
      stop = true;
    }
    wake();
    answerer->join();
    delete answerer;
    answerer = nullptr;
    ::close(wake_r);
    ::close(wake_w);
    wake_r = wake_w = -1;
  }
  void wake() noexcept {
    if (wake_w >= 0) (void)!::write(wake_w, "x", 1);
  }
};

/// A query point, listed for as long as it lives.
class query_listing {
 public:
  query_listing() = default;
  explicit query_listing(std::unique_ptr<query_point> p) : p_(std::move(p)) {
    auto& r = query_registry::get();
    std::lock_guard l(r.life);
    {
      std::lock_guard g(r.mu);
      r.all.push_back(p_.get());
    }
    r.start_locked();
    r.wake();  // a thread asleep in poll looks at its listeners again
  }
  query_listing(query_listing&& o) noexcept : p_(std::move(o.p_)) {}
  query_listing& operator=(query_listing&& o) noexcept {
    if (this != &o) {
      drop();
      p_ = std::move(o.p_);
    }
    return *this;
  }
  ~query_listing() { drop(); }
  explicit operator bool() const noexcept { return p_ != nullptr; }
  const query_point* get() const noexcept { return p_.get(); }

  /// The connections set aside for shrink (tcp/shrink.hpp reads their hellos); from now on no
  /// wait of this process accepts on this listener (the shrink does).
  std::vector<net::fd> take_parked() {
    std::vector<net::fd> out;
    if (!p_) return out;
    auto& r = query_registry::get();
    std::lock_guard g(r.mu);
    p_->shrinking = true;
    for (int f : p_->parked) out.emplace_back(f);
    for (const auto& c : p_->pending) out.emplace_back(c.fd);
    p_->parked.clear();
    p_->pending.clear();
    return out;
  }

 private:
  void drop() noexcept {
    if (!p_) return;
    {
      auto& r = query_registry::get();
      std::lock_guard l(r.life);
      bool last = false;
      {
        std::lock_guard g(r.mu);
        r.all.erase(std::remove(r.all.begin(), r.all.end(), p_.get()), r.all.end());
        last = r.mine_locked() == 0;
      }
      if (last) r.stop_locked();
      else r.wake();  // (its poll may hold the listener that is about to close)
    }
    p_.reset();  // (closing what it set aside)
  }
  std::unique_ptr<query_point> p_;
};

/// What `own` says, as an answer.
inline tcp_wire::position_answer answer_of(const detail::position& p) {
  tcp_wire::position_answer a;
  a.seq_state = p.seq_state.load(std::memory_order_relaxed);
  a.waiting_for = p.waiting_for.load(std::memory_order_relaxed);
  detail::position::get16(p.name, a.name);
  a.else_seq = p.else_seq.load(std::memory_order_relaxed);
  if (a.else_seq != 0) {
    detail::position::get16(p.else_comm, a.else_comm);
    detail::position::get16(p.else_call, a.else_call);
    a.else_waiting_job = p.else_waiting_job.load(std::memory_order_relaxed);
  }
  a.user = p.user.load(std::memory_order_relaxed);
  const std::int64_t now = detail::wall_ns(), since = p.user_since_ns.load(std::memory_order_relaxed);
  const bool outside = (a.seq_state & 3) != detail::position::kIn;  // (a call its callbacks made is in collx)
  const std::int64_t from = !outside                                          ? 0
                            : (a.user & detail::position::kInCallback) && since != 0 ? since
                                                                              : p.alive_ns.load(std::memory_order_relaxed);
  if (from > 0 && now > from) a.out_ms = std::uint32_t(std::min<std::int64_t>((now - from) / 1'000'000, 0xffffffff));
  return a;
}

/// Whether this process (`me`) serves p at all: its own (not a forked parent's), not being shrunk.
inline bool served_here(const query_point& p, pid_t me) { return !p.shrinking && p.pid == me; }

/// Whether p's listener is one a wait may accept on now.
inline bool servable(const query_point& p, net::clock::time_point now, pid_t me) {
  return p.listener >= 0 && served_here(p, me) && p.parked.size() + p.pending.size() < p.max_parked() && now >= p.quiet_until;
}

/// What became of a connection accepted on a listener (classify).
enum class conn_fate { answered, parked, closed, undecided };

/// A position query's MAC (tcp/proofs.hpp).
inline tcp_auth::mac query_mac(const query_point& p, const tcp_wire::position_query& q, int to) { return query_mac(p.secret, p.name, q, to); }

/// Looks at what connection `f` on p's listener has sent, without waiting: a query is answered
/// (5 ms at most for the answer) and closed; a shrink's hello whose MAC holds is set aside
/// unread (tcp/shrink.hpp reads it), anything else closed (a stranger cannot fill the places
/// set aside); too little yet is undecided (its peer may not have written all: the connection
/// waits in `pending` for its bytes, kPendingFor at most).
inline conn_fate classify(query_point& p, int f) {
  switch (peek_opening(f, p.secret, p.name, p.rank, p.size, p.job).what) {
    case opening::pending: return conn_fate::undecided;
    case opening::shrink: return conn_fate::parked;
    case opening::query: {
      tcp_wire::position_query q;
      (void)!::recv(f, &q, sizeof q, MSG_DONTWAIT);
      if (p.own != nullptr) {
        const tcp_wire::position_answer a = answer_of(*p.own);
        (void)net::write_all(f, &a, sizeof a, net::clock::now() + std::chrono::milliseconds(5));
      }
      return conn_fate::answered;
    }
    default: return conn_fate::closed;  // a stranger's, or one that claims to be either without proof
  }
}

/// Settles connection f of p by its fate: closes it, or sets it aside (parked or pending).
inline void settle(query_point& p, int f, conn_fate fate, net::clock::time_point now) {
  switch (fate) {
    case conn_fate::parked: p.parked.push_back(f); break;
    case conn_fate::undecided: p.pending.push_back({f, now}); break;
    default: ::close(f); break;
  }
}

/// Appends the listeners of this process that a wait may serve, and the connections accepted
/// on them that have sent nothing yet, to `pfd` (watched for POLLIN).
inline void add_listeners(std::vector<pollfd>& pfd) {
  auto& r = query_registry::get();
  std::lock_guard g(r.mu);
  const auto now = net::clock::now();
  const pid_t me = ::getpid();
  for (query_point* p : r.all) {
    if (!served_here(*p, me)) continue;
    // a connection that has not said what it is within kPendingFor is a stranger's: closed
    std::erase_if(p->pending, [&](const query_point::pending_conn& c) {
      if (now - c.since <= query_point::kPendingFor) return false;
      ::close(c.fd);
      return true;
    });
    if (servable(*p, now, me)) pfd.push_back({p->listener, POLLIN, 0});
    for (const auto& c : p->pending) pfd.push_back({c.fd, POLLIN, 0});
  }
}

/// After poll: serves the listeners and pending connections among pfd[from..] that are
/// readable, a few new connections per listener (the caller is in a wait: serving must not hold
/// it up). A pending connection silent for query_point::kPendingFor is closed.
inline void serve_listeners(const std::vector<pollfd>& pfd, std::size_t from) {
  constexpr int kPerPass = 4;
  bool any = false;
  for (std::size_t i = from; i < pfd.size(); ++i) any = any || pfd[i].revents != 0;
  if (!any) return;
  auto& r = query_registry::get();
  std::lock_guard g(r.mu);
  const auto now = net::clock::now();
  const pid_t me = ::getpid();
  for (std::size_t i = from; i < pfd.size(); ++i) {
    if (pfd[i].revents == 0) continue;
    const int fd = pfd[i].fd;
    for (query_point* pp : r.all) {
      query_point& p = *pp;
      if (!served_here(p, me)) continue;
      if (p.listener == fd) {
        for (int k = 0; k < kPerPass && servable(p, now, me); ++k) {
          const int f = ::accept4(fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
          if (f < 0) {
            // Out of descriptors (or the like): the listener stays readable; leave it a while
            // rather than spin on it.
            if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) p.quiet_until = now + std::chrono::milliseconds(100);
            break;
          }
          net::set_nodelay(f);  // a shrink's connection may become a stream of the new communicator
          settle(p, f, classify(p, f), now);
        }
        break;
      }
      const auto c = std::find_if(p.pending.begin(), p.pending.end(), [&](const query_point::pending_conn& x) { return x.fd == fd; });
      if (c == p.pending.end()) continue;
      const auto since = c->since;
      p.pending.erase(c);
      conn_fate fate = classify(p, fd);
      if (fate == conn_fate::undecided && now - since > query_point::kPendingFor) fate = conn_fate::closed;
      if (fate == conn_fate::undecided) p.pending.push_back({fd, since});
      else settle(p, fd, fate, now);
      break;
    }
  }
}

/// The answering thread: sleeps in poll on every listener of the process (and their pending
/// connections) and serves them, until the process's last tcp communicator goes. It looks at the
/// registry again when woken (a communicator came or goes) and every 250 ms.
inline void answer_loop() {
  auto& r = query_registry::get();
  std::vector<pollfd> pfd;
  for (;;) {
    pfd.clear();
    {
      std::lock_guard g(r.mu);
      if (r.stop) return;
      pfd.push_back({r.wake_r, POLLIN, 0});
    }
    add_listeners(pfd);
    if (::poll(pfd.data(), nfds_t(pfd.size()), 250) < 0 && errno != EINTR) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    if (pfd[0].revents != 0) {
      char b[64];
      while (::read(pfd[0].fd, b, sizeof b) > 0) {
      }
    }
    serve_listeners(pfd, 1);
  }
}

/// Asks every peer of `me`'s communicator (listening at where[q]) where it is, within `budget`
/// for all, answering queries meanwhile (a peer that times out at the same moment asks this
/// rank), and writes what each says into board[q]; one that refuses the connection is marked
/// detail::position::kGone, one that does not answer kSilent (in waiting_for).
inline void ask_positions(const query_point& me, const std::vector<std::string>& where, detail::position* board,
                          std::chrono::milliseconds budget) {
  struct asking {
    int q;
    net::fd s;
    bool sent = false;
    std::size_t got = 0;
    tcp_wire::position_answer a;
  };
  const auto until = net::clock::now() + budget;
  std::vector<asking> ask;
  auto mark = [&](int q, std::int32_t how) {
    board[q].seq_state.store(0, std::memory_order_relaxed);
    board[q].else_seq.store(0, std::memory_order_relaxed);
    board[q].user.store(0, std::memory_order_relaxed);
    board[q].waiting_for.store(how, std::memory_order_relaxed);
  };
  for (int q = 0; q < me.size; ++q) {
    if (q == me.rank) continue;
    mark(q, detail::position::kSilent);
    net::address a;
    try {
      a = net::parse_host_port(where[std::size_t(q)]);
    } catch (const std::exception&) {
      continue;
    }
    bool connected = false;  // (either way: poll says it is writable)
    net::fd s;
    try {
      s = net::connect_start(a, connected);
    } catch (const std::exception&) {
      continue;  // no socket to be had (out of descriptors): it stays "did not answer"
    }
    if (!s) {
      mark(q, detail::position::kGone);
      continue;
    }
    ask.push_back(asking{q, std::move(s), false, 0, {}});
  }
  tcp_wire::position_query query;
  query.rank = std::uint32_t(me.rank);
  query.size = std::uint32_t(me.size);
  query.job = me.job;
  const tcp_auth::nonce nonce = tcp_auth::fresh_nonce();
  std::memcpy(query.nonce, nonce.data(), nonce.size());
  std::vector<pollfd> pf;
  std::vector<int> answered;
  std::vector<std::uint32_t> out_ms(std::size_t(me.size), 0);
  while (!ask.empty() && net::clock::now() < until) {
    pf.clear();
    for (const asking& k : ask) pf.push_back({k.s.get(), short(k.sent ? POLLIN : POLLOUT), 0});
    const std::size_t from = pf.size();
    add_listeners(pf);
    ::poll(pf.data(), pf.size(), net::ms_until(until));
    serve_listeners(pf, from);
    for (std::size_t i = 0; i < from; ++i) {
      asking& k = ask[i];
      if (pf[i].revents == 0) continue;
      if (!k.sent) {
        int err = 0;
        socklen_t el = sizeof err;
        getsockopt(k.s.get(), SOL_SOCKET, SO_ERROR, &err, &el);
        const tcp_auth::mac m = query_mac(me, query, k.q);
        std::memcpy(query.mac, m.data(), m.size());
        if (err != 0 || net::write_all(k.s.get(), &query, sizeof query, net::clock::now() + std::chrono::milliseconds(50)) != net::io::ok) {
          if (err != 0) mark(k.q, detail::position::kGone);
          k.s.reset();
          continue;
        }
        k.sent = true;
        continue;
      }
      const ssize_t r = ::recv(k.s.get(), reinterpret_cast<char*>(&k.a) + k.got, sizeof k.a - k.got, MSG_DONTWAIT);
      if (r > 0) k.got += std::size_t(r);
      else if (r == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) k.s.reset();
      if (k.got < sizeof k.a) continue;
      const auto a = tcp_wire::parse_answer(std::span<const std::byte, sizeof k.a>(reinterpret_cast<const std::byte*>(&k.a), sizeof k.a), me.size);
      k.s.reset();
      if (!a) continue;
      detail::position& p = board[k.q];
      detail::position::put16(p.name, a->name);
      detail::position::put16(p.else_comm, a->else_comm);
      detail::position::put16(p.else_call, a->else_call);
      p.else_waiting_job.store(a->else_waiting_job, std::memory_order_relaxed);
      p.else_seq.store(a->else_seq, std::memory_order_relaxed);
      p.waiting_for.store(a->waiting_for, std::memory_order_relaxed);
      p.seq_state.store(a->seq_state, std::memory_order_relaxed);
      p.user.store(a->user, std::memory_order_relaxed);
      out_ms[std::size_t(k.q)] = a->out_ms;
      answered.push_back(k.q);
    }
    std::erase_if(ask, [](const asking& k) { return !k.s; });
  }
  // It answered: alive (as of now, not of the answer: the report reads this after the wait
  // for the others, which must not make it look silent).
  // One in its callbacks, or done and out of collx, says for how long (a duration: the hosts'
  // clocks differ).
  const std::int64_t now = detail::wall_ns();
  for (int q : answered) {
    detail::position& p = board[q];
    const std::int64_t out = std::int64_t(out_ms[std::size_t(q)]) * 1'000'000;
    const bool in_callback = p.user.load(std::memory_order_relaxed) & detail::position::kInCallback;
    p.user_since_ns.store(in_callback ? now - out : 0, std::memory_order_relaxed);
    const bool outside = (p.seq_state.load(std::memory_order_relaxed) & 3) != detail::position::kIn;
    p.alive_ns.store(outside && !in_callback && out > 0 ? now - out : now, std::memory_order_relaxed);
  }
}

}  // namespace collx::transport::tcp_detail
