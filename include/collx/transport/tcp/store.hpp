#pragma once
// Rendezvous stores: where the ranks of a job find each other before any socket between them
// exists. Two kinds, one interface (set, get-with-deadline, add):
//   - store_server + tcp_store: a small key-value server run by rank 0 at MASTER_ADDR:MASTER_PORT
//     (torchrun's env:// convention) and its client. When the job has a secret (tcp/secret.hpp)
//     a client must first prove that it holds it, and learns that the server does, by the
//     challenge-response of tcp/auth.hpp (auth_begin, auth): the secret never crosses the wire,
//     and a client that has not proven itself is refused anything else and dropped.
//   - file_store: files in a directory every rank can see (a shared file system), which only
//     the job's user may read (its owner and mode are checked).
// store_core is the server's logic without sockets (what the fuzz target drives).
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>

#include <atomic>
#include <cstdio>
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "auth.hpp"
#include "secret.hpp"
#include "socket.hpp"
#include "wire.hpp"

namespace collx::transport {

class store {
 public:
  virtual ~store() = default;
  virtual void set(const std::string& key, const std::string& value) = 0;
  /// The value of `key`, waiting until some rank sets it; nullopt when `deadline` passes first.
  virtual std::optional<std::string> get(const std::string& key, net::clock::time_point deadline) = 0;
  /// The value rank `setter` set at `key`: the same as get() where keys are the job's, not a
  /// rank's (a PMIx launcher's store keeps each rank's keys apart: tcp/pmix_store.hpp).
  virtual std::optional<std::string> get_from(int /*setter*/, const std::string& key, net::clock::time_point deadline) {
    return get(key, deadline);
  }
  /// Adds `delta` to the integer at `key` (0 when unset) and returns the new value.
  virtual std::int64_t add(const std::string& key, std::int64_t delta) = 0;
  /// Where the store is, for error messages.
  virtual std::string where() const = 0;
  /// Removes every key that starts with `prefix` (a finished job's keys; stores that vanish
  /// with their job need not).
  virtual void erase_prefix(const std::string&) {}
  /// Kept by the job's launcher for the job's processes alone (PMIx): it ends with the job, and
  /// no other process reads it, so it may carry the job's secret (tcp/secret.hpp).
  virtual bool launcher_kept() const { return false; }
};

// ---- the server's logic ------------------------------------------------------------------------

/// A client could not prove it holds the job's secret (the store said so).
class store_denied : public error {
 public:
  using error::error;
};

/// The key-value logic of store_server, one call per request, no I/O. A session starts
/// unauthenticated when the store has a secret; then only the login (auth_begin, auth) is
/// accepted.
class store_core {
 public:
  /// Keys a store holds at most: a client cannot grow the server without bound.
  static constexpr std::size_t kMaxKeys = 1 << 16;

  explicit store_core(std::string secret = {}) : token_(std::move(secret)) {}

  struct session {
    bool authed = false;
    bool challenged = false;  // auth_begin answered: nc and na hold the exchange's nonces
    std::array<std::byte, tcp_auth::kNonce> nc{}, na{};
    std::string in;  // bytes received, not yet a whole request (bounded by the parser's limits)
  };
  struct reply {
    std::string bytes;         // to send back now (may be empty: a get that waits)
    std::string waiting_for;   // the key a get waits for, when it has to wait
    bool drop = false;         // garbage or refused: close the connection
    std::string why;           // why it was dropped (logged by the server)
  };

  bool needs_auth() const noexcept { return !token_.empty(); }

  /// Handles every whole request in s.in; returns the replies in order. Stops at the first
  /// request that drops the session.
  std::vector<reply> feed(session& s) {
    std::vector<reply> out;
    for (;;) {
      tcp_wire::store_parse p = tcp_wire::parse_store_request({reinterpret_cast<const std::byte*>(s.in.data()), s.in.size()});
      if (p.st == tcp_wire::store_parse::status::need_more) break;
      if (p.st == tcp_wire::store_parse::status::bad) {
        out.push_back({{}, {}, true, p.why});
        break;
      }
      s.in.erase(0, p.consumed);
      out.push_back(handle(s, p.req));
      if (out.back().drop) break;
    }
    return out;
  }

  reply handle(session& s, const tcp_wire::store_request& r) {
    using tcp_wire::encode_store_reply;
    using tcp_wire::store_op;
    using tcp_wire::store_status;
    if (r.op == store_op::auth_begin) {  // the client's nonce: the server's, and its proof
      if (s.challenged) return {encode_store_reply(store_status::bad_request, {}), {}, true, "a second login"};
      std::memcpy(s.nc.data(), r.value.data(), s.nc.size());
      s.na = tcp_auth::fresh_nonce();
      s.challenged = true;
      const tcp_auth::mac m = tcp_auth::accept_proof(token_, kContext, s.nc, s.na);
      std::string v(reinterpret_cast<const char*>(s.na.data()), s.na.size());
      v.append(reinterpret_cast<const char*>(m.data()), m.size());
      return {encode_store_reply(store_status::ok, v), {}, false, {}};
    }
    if (r.op == store_op::auth) {  // the client's proof
      if (!s.challenged) return {encode_store_reply(store_status::denied, {}), {}, true, "a proof without a challenge"};
      s.challenged = false;  // (one proof per challenge)
      s.authed = tcp_auth::same({reinterpret_cast<const std::byte*>(r.value.data()), r.value.size()},
                                tcp_auth::connect_proof(token_, kContext, s.nc, s.na));
      if (!s.authed) return {encode_store_reply(store_status::denied, {}), {}, true, "could not prove it holds the job's secret"};
      return {encode_store_reply(store_status::ok, {}), {}, false, {}};
    }
    if (needs_auth() && !s.authed)
      return {encode_store_reply(store_status::denied, {}), {}, true, "asked before proving it holds the job's secret"};
    switch (r.op) {
      case store_op::set:
        if (kv_.size() >= kMaxKeys && !kv_.count(r.key)) return {encode_store_reply(store_status::bad_request, {}), {}, true, "store full"};
        kv_[r.key] = r.value;
        return {encode_store_reply(store_status::ok, {}), {}, false, {}};
      case store_op::get: {
        auto it = kv_.find(r.key);
        if (it == kv_.end()) return {{}, r.key, false, {}};
        return {encode_store_reply(store_status::ok, it->second), {}, false, {}};
      }
      case store_op::add: {
        if (kv_.size() >= kMaxKeys && !kv_.count(r.key)) return {encode_store_reply(store_status::bad_request, {}), {}, true, "store full"};
        std::int64_t delta = 0;
        std::memcpy(&delta, r.value.data(), sizeof delta);
        std::string& v = kv_[r.key];
        std::int64_t cur = 0;
        if (v.size() == sizeof cur) std::memcpy(&cur, v.data(), sizeof cur);
        cur = std::int64_t(std::uint64_t(cur) + std::uint64_t(delta));  // wraps, never UB
        v.assign(reinterpret_cast<const char*>(&cur), sizeof cur);
        return {encode_store_reply(store_status::ok, v), {}, false, {}};
      }
      default: return {{}, {}, true, "unknown operation"};
    }
  }

  /// The value of a key, if set (for answering gets that waited).
  const std::string* find(const std::string& key) const {
    auto it = kv_.find(key);
    return it == kv_.end() ? nullptr : &it->second;
  }

  /// What a store login's proofs are bound to (tcp/auth.hpp).
  static constexpr const char* kContext = "store";

 private:
  std::string token_;
  std::map<std::string, std::string> kv_;
};

// ---- the server ----------------------------------------------------------------------------------

/// Serves a store_core on a listening socket from a thread of its own until destroyed.
/// Strangers (a wrong proof, none, garbage) are logged to stderr and disconnected. A flood of
/// them cannot keep a rank out: a client that has not proven itself within kLogin of its
/// connect is dropped (no byte it sends extends that); when kMaxClients are connected a new
/// connection takes the place of the oldest that has not proven itself (a rank's login takes
/// a round trip or two, far less than the flood needs to push it out again); and one address
/// may hold at most kPerAddress connections that have not.
class store_server {
 public:
  /// Clients served at once.
  static constexpr std::size_t kMaxClients = 1024;
  /// Connections of one address that have not proven themselves, at most.
  static constexpr std::size_t kPerAddress = 256;
  /// How long a client has from its connect to prove it holds the job's secret.
  static constexpr std::chrono::seconds kLogin{5};

  store_server(net::fd listener, std::string token) : listener_(std::move(listener)), core_(std::move(token)) {
    int p[2];
    if (::pipe2(p, O_CLOEXEC | O_NONBLOCK) != 0) net::sys_fail("tcp store: pipe");
    wake_r_ = net::fd(p[0]);
    wake_w_ = net::fd(p[1]);
    thread_ = std::thread([this] { run(); });
  }
  store_server(const store_server&) = delete;
  store_server& operator=(const store_server&) = delete;
  ~store_server() {
    stop_.store(true);
    const char c = 0;
    [[maybe_unused]] auto k = ::write(wake_w_.get(), &c, 1);
    if (thread_.joinable()) thread_.join();
  }

 private:
  struct client {
    net::fd s;
    std::string peer;
    store_core::session st;
    std::string out;
    std::vector<std::string> waiting;  // keys of gets not yet answered, in order
    bool closing = false;
    net::clock::time_point last;       // its last request
    net::clock::time_point accepted;   // its connect
  };

  /// What one client may have outstanding: unsent replies and unanswered gets. Past either, the
  /// server stops reading from it until it catches up (a client that sends and never reads
  /// cannot grow the server).
  static constexpr std::size_t kMaxPendingOut = std::size_t(64) << 10;
  static constexpr std::size_t kMaxWaiting = 64;
  /// A client with nothing outstanding that says nothing for this long is dropped (the real
  /// ones reconnect: tcp_store), so idle strangers cannot fill kMaxClients.
  static constexpr std::chrono::seconds kIdle{10};

  static bool may_read(const client& c) {
    return !c.closing && c.out.size() < kMaxPendingOut && c.waiting.size() < kMaxWaiting;
  }

  void run() {
    std::vector<client> cs;
    std::vector<pollfd> pf;
    while (!stop_.load()) {
      pf.clear();
      pf.push_back({wake_r_.get(), POLLIN, 0});
      pf.push_back({listener_.get(), POLLIN, 0});
      for (const client& c : cs) pf.push_back({c.s.get(), short((may_read(c) ? POLLIN : 0) | (c.out.empty() ? 0 : POLLOUT)), 0});
      if (::poll(pf.data(), pf.size(), 1000) < 0 && errno != EINTR) break;
      const std::size_t polled = cs.size();  // clients accepted below were not in this poll
      for (std::size_t i = 0; i < polled; ++i) {
        const short ev = pf[i + 2].revents;
        if (ev != 0) serve(cs[i], ev);
      }
      if (pf[1].revents & POLLIN) accept_all(cs);
      answer_waiting(cs);
      const auto now = net::clock::now();
      for (client& c : cs) {
        if (c.closing) continue;
        if (core_.needs_auth() && !c.st.authed && now - c.accepted > kLogin) {
          refused(c.peer, "it did not prove it holds the job's secret within " + std::to_string(kLogin.count()) + " s of its connect");
          c.closing = true;
          c.out.clear();
        } else if (c.waiting.empty() && c.out.empty() && now - c.last > kIdle) {
          c.closing = true;
        }
      }
      std::erase_if(cs, [](const client& c) { return c.closing && c.out.empty(); });
    }
  }

  /// A client that has not proven it holds the job's secret (with no secret: one that has
  /// nothing outstanding, the nearest there is).
  bool unproven(const client& c) const {
    return core_.needs_auth() ? !c.st.authed : c.waiting.empty() && c.out.empty();
  }
  static std::string host_of(const std::string& peer) { return peer.substr(0, peer.rfind(':')); }

  /// Takes the place of the oldest unproven client among those `among` selects (closed now);
  /// false when there is none.
  template <class Among>
  bool evict_oldest(std::vector<client>& cs, Among among, const char* why) {
    client* oldest = nullptr;
    // (one whose login is under way goes only when no other will do: it is likely a rank)
    for (int pass = 0; pass < 2 && oldest == nullptr; ++pass)
      for (client& c : cs)
        if (!c.closing && unproven(c) && (pass == 1 || !c.st.challenged) && among(c) && (oldest == nullptr || c.accepted < oldest->accepted))
          oldest = &c;
    if (oldest == nullptr) return false;
    refused(oldest->peer, why);
    oldest->closing = true;
    oldest->out.clear();
    oldest->s.reset();
    return true;
  }

  /// A bounded number of new connections a wake-up (the listener stays readable for the rest).
  void accept_all(std::vector<client>& cs) {
    for (int k = 0; k < 64; ++k) {
      net::address a;
      a.len = sizeof a.ss;
      const int f = ::accept4(listener_.get(), a.sa(), &a.len, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (f < 0) return;
      net::fd s(f);
      net::set_nodelay(f);
      const std::string peer = a.str(), host = host_of(peer);
      std::size_t open = 0, from_host = 0;
      for (const client& c : cs) {
        if (c.closing) continue;
        ++open;
        from_host += unproven(c) && host_of(c.peer) == host;
      }
      if (from_host >= kPerAddress)
        (void)evict_oldest(cs, [&](const client& c) { return host_of(c.peer) == host; }, "too many connections from its address that have not proven themselves");
      else if (open >= kMaxClients && !evict_oldest(cs, [](const client&) { return true; }, "the store is full: the oldest that had not proven itself made room")) {
        refused(peer, "the store is full of clients that proved themselves");
        continue;
      }
      const auto now = net::clock::now();
      cs.push_back({std::move(s), peer, {}, {}, {}, false, now, now});
    }
  }

  /// Logs a refused client (the first 32 of a server, then a count every 1024: a flood does not
  /// flood stderr).
  void refused(const std::string& peer, const std::string& why) {
    ++refusals_;
    if (refusals_ <= 32)
      std::fprintf(stderr, "collx tcp store: refused %s: %s\n", peer.c_str(), why.c_str());
    else if (refusals_ % 1024 == 0)
      std::fprintf(stderr, "collx tcp store: %llu clients refused so far (the first 32 named above)\n", (unsigned long long)refusals_);
  }

  /// One read per wake-up, so one busy client cannot keep the others waiting.
  void serve(client& c, short ev) {
    if ((ev & (POLLIN | POLLHUP | POLLERR)) && may_read(c)) {
      char buf[8192];
      const ssize_t k = ::recv(c.s.get(), buf, sizeof buf, MSG_DONTWAIT);
      if (k > 0) {
        c.last = net::clock::now();
        c.st.in.append(buf, std::size_t(k));
        for (store_core::reply& r : core_.feed(c.st)) {
          c.out += r.bytes;
          if (!r.waiting_for.empty()) c.waiting.push_back(r.waiting_for);
          if (r.drop) {
            refused(c.peer, r.why);
            c.closing = true;
            c.st.in.clear();
            c.waiting.clear();
          }
        }
      } else if (k == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
        c.closing = true;
        c.out.clear();
      }
    } else if (ev & (POLLHUP | POLLERR)) {
      c.closing = true;
      c.out.clear();
    }
    flush(c);
  }

  void flush(client& c) {
    while (!c.out.empty()) {
      const ssize_t k = ::send(c.s.get(), c.out.data(), c.out.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      if (k > 0) {
        c.out.erase(0, std::size_t(k));
        continue;
      }
      if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
      c.out.clear();  // the client is gone
      c.closing = true;
      return;
    }
  }

  void answer_waiting(std::vector<client>& cs) {
    for (client& c : cs) {
      // Replies go in request order: answer waiting gets from the front while their keys exist.
      std::size_t k = 0;
      while (k < c.waiting.size()) {
        const std::string* v = core_.find(c.waiting[k]);
        if (v == nullptr) break;
        c.out += tcp_wire::encode_store_reply(tcp_wire::store_status::ok, *v);
        ++k;
      }
      if (k != 0) {
        c.waiting.erase(c.waiting.begin(), c.waiting.begin() + std::ptrdiff_t(k));
        flush(c);
      }
    }
  }

  net::fd listener_, wake_r_, wake_w_;
  store_core core_;
  std::uint64_t refusals_ = 0;  // (the server's thread alone)
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// ---- the client ----------------------------------------------------------------------------------

class tcp_store final : public store {
 public:
  /// Connects to the server at `at`, retrying until `deadline` (rank 0 may start last), and
  /// logs in with `secret` when it is not empty (tcp/auth.hpp: throws store_denied when the
  /// server refuses the proof, errc::invalid_argument when the server cannot prove itself). Every request must finish by `deadline` (the
  /// rendezvous's). A connection the server dropped (idle, see store_server::kIdle) or that a
  /// get timed out on is made again for the next request.
  tcp_store(net::address at, std::string token, net::clock::time_point deadline)
      : at_(at), token_(std::move(token)), deadline_(deadline) {
    connect();
  }

  void set(const std::string& key, const std::string& value) override { request(tcp_wire::store_op::set, key, value, deadline_); }
  std::optional<std::string> get(const std::string& key, net::clock::time_point deadline) override {
    return request(tcp_wire::store_op::get, key, {}, std::min(deadline, deadline_), true);
  }
  std::int64_t add(const std::string& key, std::int64_t delta) override {
    const auto v = request(tcp_wire::store_op::add, key, std::string(reinterpret_cast<const char*>(&delta), sizeof delta), deadline_);
    std::int64_t x = 0;
    if (v && v->size() == sizeof x) std::memcpy(&x, v->data(), sizeof x);
    return x;
  }
  std::string where() const override { return "the store at " + at_.str(); }

 private:
  void connect() {
    std::string why;
    s_ = net::connect_until(at_, deadline_, why);
    if (!s_)
      throw error(errc::timeout, "tcp: no rendezvous store at " + at_.str() + " (MASTER_ADDR:MASTER_PORT): " + why +
                                     "; is rank 0 running?");
    if (!token_.empty()) login();
  }

  /// The challenge-response of tcp/auth.hpp: this client's nonce, the server's nonce and proof
  /// (checked: a stranger at MASTER_ADDR:MASTER_PORT learns nothing), this client's proof.
  void login() {
    const tcp_auth::nonce nc = tcp_auth::fresh_nonce();
    const auto ch = exchange(tcp_wire::store_op::auth_begin, "auth", std::string(reinterpret_cast<const char*>(nc.data()), nc.size()),
                             deadline_, false, false);
    tcp_auth::nonce na{};
    tcp_auth::mac their{};
    if (!ch || ch->size() != na.size() + their.size()) {
      s_.reset();
      throw error(errc::transport_error, "tcp: garbage instead of a login challenge from the rendezvous store at " + at_.str());
    }
    std::memcpy(na.data(), ch->data(), na.size());
    std::memcpy(their.data(), ch->data() + na.size(), their.size());
    if (!tcp_auth::same(their, tcp_auth::accept_proof(token_, store_core::kContext, nc, na))) {
      s_.reset();
      throw store_denied(errc::invalid_argument, "tcp: the rendezvous store at " + at_.str() +
                                              " could not prove it holds the job's secret (another job's store, or another "
                                              "secret: is MASTER_ADDR:MASTER_PORT right, and COLLX_JOB_TOKEN the same on every rank?)");
    }
    const tcp_auth::mac mine = tcp_auth::connect_proof(token_, store_core::kContext, nc, na);
    exchange(tcp_wire::store_op::auth, "auth", std::string(reinterpret_cast<const char*>(mine.data()), mine.size()), deadline_, false, false);
  }

  std::optional<std::string> request(tcp_wire::store_op op, const std::string& key, const std::string& value,
                                     net::clock::time_point deadline, bool may_wait = false) {
    if (key.empty() || key.size() > tcp_wire::kMaxKey || value.size() > tcp_wire::kMaxValue)
      throw error(errc::invalid_argument, "tcp store: key or value too long");
    if (!s_) connect();
    return exchange(op, key, value, deadline, may_wait, true);
  }

  /// One request and its reply. `retry`: when the server has closed the connection before
  /// answering (it drops idle clients; the request was then never served), connect again once.
  std::optional<std::string> exchange(tcp_wire::store_op op, const std::string& key, const std::string& value,
                                      net::clock::time_point deadline, bool may_wait, bool retry) {
    const std::string req = tcp_wire::encode_store_request(op, key, value);
    auto lost = [&](net::io r) -> std::optional<std::string> {
      s_.reset();  // a half-done exchange leaves the stream out of step: never reuse it
      if (r == net::io::timeout && may_wait) return std::nullopt;
      if (r == net::io::closed && retry) {
        connect();
        return exchange(op, key, value, deadline, may_wait, false);
      }
      throw error(r == net::io::timeout ? errc::timeout : errc::peer_lost,
                  "tcp: the rendezvous store at " + at_.str() +
                      (r == net::io::timeout ? " did not answer in time" : " closed the connection (refused, or rank 0 exited)"));
    };
    if (auto r = net::write_all(s_.get(), req.data(), req.size(), deadline); r != net::io::ok) return lost(r);
    tcp_wire::store_rep_header raw;
    if (auto r = net::read_exact(s_.get(), &raw, sizeof raw, deadline); r != net::io::ok) return lost(r);
    retry = false;  // the server has answered: from here on the request was served
    const auto h = tcp_wire::parse_store_reply(std::span<const std::byte, sizeof raw>(reinterpret_cast<const std::byte*>(&raw), sizeof raw));
    if (!h) {
      s_.reset();
      throw error(errc::transport_error, "tcp: garbage from the rendezvous store at " + at_.str());
    }
    std::string v(h->value_len, '\0');
    if (auto r = net::read_exact(s_.get(), v.data(), v.size(), deadline); r != net::io::ok) return lost(r);
    if (h->status == std::uint32_t(tcp_wire::store_status::denied)) {
      s_.reset();
      throw store_denied(errc::invalid_argument, "tcp: the rendezvous store at " + at_.str() +
                                                     " refused this rank: it could not prove it holds the job's secret "
                                                     "(is COLLX_JOB_TOKEN the same on every rank?)");
    }
    if (h->status != 0) {
      s_.reset();
      throw error(errc::transport_error, "tcp: the rendezvous store at " + at_.str() + " refused this rank's request");
    }
    return v;
  }

  net::address at_;
  std::string token_;
  net::clock::time_point deadline_;
  net::fd s_;
};

// ---- the file store --------------------------------------------------------------------------------

/// Keys are files in `dir`, a directory only this user may use (created 0700 if missing; an
/// existing one must be this user's and closed to group and others: the job's secret may be
/// kept in it, tcp/secret.hpp). Values are written whole into a new file (O_EXCL|O_NOFOLLOW,
/// mode 0600) and renamed into place, so a reader never sees half a value and no link planted
/// in the directory is followed. add() serialises through flock on a lock file, waiting no
/// longer than the rendezvous's deadline.
class file_store final : public store {
 public:
  explicit file_store(std::string dir, net::clock::time_point deadline = net::clock::time_point::max())
      : dir_(std::move(dir)), deadline_(deadline) {
    if (dir_.empty()) throw error(errc::invalid_argument, "tcp: the file store needs a directory");
    tcp_detail::ensure_private_dir(dir_, "give COLLX_STORE_PATH a directory of mode 0700 that only you own");
  }

  void set(const std::string& key, const std::string& value) override {
    const std::string f = file(key);
    const std::string tmp = f + ".tmp." + tcp_detail::random_secret().substr(0, 16);
    net::fd o(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
    if (!o) net::sys_fail("tcp: file store: cannot create " + tmp);
    std::size_t done = 0;
    while (done < value.size()) {
      const ssize_t k = ::write(o.get(), value.data() + done, value.size() - done);
      if (k < 0 && errno == EINTR) continue;
      if (k <= 0) {
        ::unlink(tmp.c_str());
        net::sys_fail("tcp: file store: cannot write " + tmp);
      }
      done += std::size_t(k);
    }
    if (std::rename(tmp.c_str(), f.c_str()) != 0) {
      const int e = errno;
      ::unlink(tmp.c_str());
      errno = e;
      net::sys_fail("tcp: file store rename " + tmp);
    }
  }

  std::optional<std::string> get(const std::string& key, net::clock::time_point deadline) override {
    const std::string f = file(key);
    for (;;) {
      net::fd i(::open(f.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
      if (i) {  // read at most one byte more than a value may have: a huge file is refused, not loaded
        std::string v(tcp_wire::kMaxValue + 1, '\0');
        std::size_t got = 0;
        for (;;) {
          const ssize_t k = ::read(i.get(), v.data() + got, v.size() - got);
          if (k < 0 && errno == EINTR) continue;
          if (k <= 0) break;
          got += std::size_t(k);
          if (got == v.size()) break;
        }
        v.resize(got);
        if (v.size() > tcp_wire::kMaxValue) throw error(errc::transport_error, "tcp: file store value " + f + " is too large");
        return v;
      }
      if (errno == ELOOP) throw error(errc::transport_error, "tcp: file store: " + f + " is a link (not followed)");
      if (net::clock::now() >= deadline) return std::nullopt;
      ::usleep(2000);
    }
  }

  std::int64_t add(const std::string& key, std::int64_t delta) override {
    net::fd lock = lock_file(".lock", "");
    take(lock, LOCK_EX, "the store's lock");
    std::int64_t cur = 0;
    if (auto v = get(key, net::clock::now()); v) cur = std::strtoll(v->c_str(), nullptr, 10);
    cur += delta;
    set(key, std::to_string(cur));
    return cur;  // the lock goes with `lock`
  }

  std::string where() const override { return "the file store in " + dir_; }

  /// Rank 0 of job `job`: makes sure no other live job of that name uses this directory (an
  /// exclusive lock), removes whatever keys a crashed run of it left, and then says so (a
  /// second lock, held from then on: the others wait for it in await_claim). Both locks are
  /// flock()s, which the kernel drops with the process, however it ends, and this store holds
  /// them until it is destroyed (the end of rendezvous).
  void claim(const std::string& job) {
    owner_ = lock_file(job, ".owner");
    if (::flock(owner_.get(), LOCK_EX | LOCK_NB) != 0) {
      if (errno == EWOULDBLOCK)
        throw error(errc::invalid_argument, "tcp: another job named \"" + job + "\" is meeting in " + where() +
                                                " (its rank 0 holds the job's lock): give each job its own COLLX_JOB or store");
      net::sys_fail("tcp: file store lock in " + dir_);
    }
    erase_prefix(job + "/");
    ready_ = lock_file(job, ".ready");
    take(ready_, LOCK_EX, "job \"" + job + "\"'s lock");
  }

  /// Ranks but 0: waits (until `deadline`) for rank 0 to have claimed the store for `job`.
  void await_claim(const std::string& job, net::clock::time_point deadline, int rank) {
    net::fd f = lock_file(job, ".ready");
    for (;;) {
      if (::flock(f.get(), LOCK_SH | LOCK_NB) != 0) {
        if (errno == EWOULDBLOCK) return;  // rank 0 holds it: its keys are this run's
        if (errno != EINTR) net::sys_fail("tcp: file store lock in " + dir_);
        continue;
      }
      ::flock(f.get(), LOCK_UN);
      if (net::clock::now() >= deadline)
        throw error(errc::timeout, "tcp: rendezvous of job \"" + job + "\" timed out at rank " + std::to_string(rank) +
                                       ": rank 0 never claimed " + where() + " (is rank 0 running in this job?)");
      ::usleep(2000);
    }
  }

  /// Removes the files of every key that starts with `prefix` (a job's keys, once all its
  /// ranks are done with them, so a later job of the same name does not read them).
  void erase_prefix(const std::string& prefix) override {
    const std::string start = name(prefix, false);
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(dir_, ec)) {
      const std::string n = e.path().filename().string();
      if (n.compare(0, start.size(), start) == 0) std::filesystem::remove(e.path(), ec);
    }
  }

 private:
  /// A key as a file name: "k" + the key in hex, so any key is a safe name; a key whose name
  /// would pass a file system's 255 bytes keeps 100 bytes of it and a hash of the whole.
  static std::string name(const std::string& key, bool whole = true) {
    static const char* hex = "0123456789abcdef";
    std::string f = "k";
    for (std::size_t i = 0; i < key.size() && i < 100; ++i) {
      const auto c = static_cast<unsigned char>(key[i]);
      f += hex[c >> 4];
      f += hex[c & 15];
    }
    if (whole && key.size() > 100) f += "-" + std::to_string(detail::fnv1a(key));
    return f;
  }
  std::string file(const std::string& key) const { return dir_ + "/" + name(key); }
  net::fd lock_file(const std::string& job, const char* suffix) const {
    const std::string f = job == ".lock" ? dir_ + "/.lock" : dir_ + "/l" + name(job).substr(1) + suffix;  // not a key's name ("k..."): kept
    net::fd l(::open(f.c_str(), O_CREAT | O_RDWR | O_CLOEXEC | O_NOFOLLOW, 0600));
    if (!l) net::sys_fail("tcp: file store lock " + f);
    return l;
  }
  /// flock(how) on f, waiting no longer than the store's deadline.
  void take(const net::fd& f, int how, const std::string& what) const {
    for (;;) {
      if (::flock(f.get(), how | LOCK_NB) == 0) return;
      if (errno != EWOULDBLOCK && errno != EINTR) net::sys_fail("tcp: file store lock in " + dir_);
      if (net::clock::now() >= deadline_)
        throw error(errc::timeout, "tcp: " + where() + ": " + what + " was held past the rendezvous's deadline (another process holds it)");
      ::usleep(1000);
    }
  }
  std::string dir_;
  net::clock::time_point deadline_;
  net::fd owner_, ready_;  // claim(): held by rank 0 while the store is in use
};

}  // namespace collx::transport
