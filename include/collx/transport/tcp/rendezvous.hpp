#pragma once
// Rendezvous of transport::tcp: how the ranks of a job find each other and connect.
//
// Ranks meet through a store (store.hpp): rank 0 serves one at MASTER_ADDR:MASTER_PORT
// (torchrun's env:// convention), or they share a directory (COLLX_STORE_PATH). Each rank
// listens on an ephemeral port of the interface named by COLLX_SOCKET_IFNAME (else the one that
// routes to MASTER_ADDR, else loopback) and publishes "address host-id cores" under
// <job>/addr/<rank>. Rank r then connects to every rank below it and accepts every rank above
// it, all at once in one poll loop, so no order of arrival can deadlock. Rendezvous has its own
// deadline (config::rendezvous_timeout) and its errors name the ranks that did not show up.
//
// Admission. A connecting rank first sends a hello with the job's token (COLLX_JOB_TOKEN, or
// 64 hex digits drawn by rank 0 and handed out through the store); the accepting rank checks
// it, the rank number and that no connection from that rank exists yet, answers with a verdict,
// and drops anything else, logging the refused address to stderr. A stranger's connection
// never becomes part of a collective. With COLLX_JOB_TOKEN set, the store refuses clients that
// do not present it too; without it, anyone who can reach the store can read the token from it.
//
// A rerun. A file store outlives its job, so a job that crashed leaves its keys (its token,
// its ranks' addresses) for the next job of the same name: rank 0 removes them, and the other
// ranks read nothing until it has (file_store::claim). The TCP store lives in rank 0 and ends
// with it.
#include <sched.h>
#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "../../core/call_info.hpp"
#include "../../core/error.hpp"
#include "auth.hpp"
#include "config.hpp"
#include "proofs.hpp"
#include "socket.hpp"
#include "secret.hpp"
#include "store.hpp"
#include "tls.hpp"
#include "wire.hpp"

namespace collx::transport::tcp_detail {

/// One established connection to a peer, and where the peer is (for messages).
struct conn {
  net::fd s;
  std::string where;
  tls_link tls;  // its TLS end, when the job encrypts (tcp/tls.hpp)
};

/// With tcp_config::tls: every connection of `peers` (peer q's at [q]) becomes a TLS channel,
/// keyed with `secret`, bound to `what` (rendezvous, split or shrink), the communicator `job`
/// of `n` ranks, and the pair.
template <class Who>
void secure(std::vector<conn>& peers, int rank, int n, const std::string& secret, const std::string& what, const std::string& job,
            net::clock::time_point deadline, Who who) {
  std::vector<int> socks(peers.size(), -1);
  for (std::size_t q = 0; q < peers.size(); ++q)
    if (peers[q].s) socks[q] = peers[q].s.get();
  std::vector<tls_link> links;
  secure_all(
      socks, links, rank, secret,
      [&](int q) {
        return what + "\n" + job + "\n" + std::to_string(std::min(rank, q)) + "\n" + std::to_string(std::max(rank, q)) + "\n" +
               std::to_string(n);
      },
      who, deadline);
  for (std::size_t q = 0; q < peers.size(); ++q) peers[q].tls = std::move(links[q]);
}

/// Rank `rank` of `n` in job `job` meets its peers: after run(), peers()[q] is the connection to
/// rank q (none to itself) and crowded() says whether the job's ranks on this host outnumber
/// its cores.
class rendezvous {
 public:
  rendezvous(std::string job, int rank, int n, tcp_config cfg, net::fd served)
      : job_(std::move(job)), rank_(rank), n_(n), cfg_(std::move(cfg)), served_(std::move(served)) {}
  rendezvous(const rendezvous&) = delete;
  rendezvous& operator=(const rendezvous&) = delete;
  /// Every rank has read the secret's file by the time rank 0's rendezvous ends (each reads it
  /// before it connects to rank 0), or the job failed: it goes either way.
  ~rendezvous() {
    if (!host_file_.empty()) ::unlink(host_file_.c_str());
  }

  std::vector<conn>& peers() noexcept { return peers_; }
  /// The socket this rank accepted its peers on (after run() or run_split()): the transport
  /// keeps it, for a shrink (tcp/shrink.hpp).
  net::fd& listener() noexcept { return listener_; }
  /// Connections accepted on it that were not for the rendezvous but for the communicator it
  /// makes (a shrink's hello, a position query: connect_mesh), unread.
  std::vector<net::fd>& early() noexcept { return early_; }
  bool crowded() const noexcept { return crowded_; }

  std::string key(const std::string& what) const { return job_ + "/" + what; }

  /// 64 hex digits from the kernel's random source (a job's name or secret).
  static std::string random_token() { return random_secret(); }

  std::string tls_needs_secret() const {
    return "tcp: TLS (COLLX_TCP_TLS=1) keys every connection with the job's secret, and job \"" + job_ +
           "\" has none: set COLLX_JOB_TOKEN or COLLX_JOB_TOKEN_FILE";
  }

  /// A store that is not the job's own (torch's, which any client may read) never holds the
  /// secret. On one host rank 0 writes it into a file of this user's private directory under a
  /// name drawn for the job, and publishes only that name and the secret's fingerprint: a rank
  /// reads the file (this user's alone: a stranger who rewrites the name can point it only at
  /// another of this user's files) and checks the fingerprint.
  std::string host_secret_published(store& st, net::clock::time_point deadline) {
    const std::string dir = private_dir();
    if (rank_ == 0) {
      const std::string secret = random_secret();
      const std::string name = "tcp-" + random_secret().substr(0, 32) + ".secret";
      write_private_file(dir + "/" + name, secret);
      host_file_ = dir + "/" + name;
      st.set(key("secret-file"), name + " " + tcp_auth::fingerprint(secret));
      return secret;
    }
    for (;;) {
      const auto v = st.get(key("secret-file"), deadline);
      if (!v) throw error(errc::timeout, "tcp: rendezvous timed out at rank " + std::to_string(rank_) + ": rank 0 never published where the job's secret is in " +
                                             st.where() + " (is rank 0 running in job \"" + job_ + "\"?)");
      const auto sp = v->find(' ');
      const std::string name = v->substr(0, sp);
      const bool plain = !name.empty() && name.size() < 80 && name.find('/') == std::string::npos && name[0] != '.';
      if (sp != std::string::npos && plain) {
        if (auto t = read_private_file(dir + "/" + name, "remove it: collx writes it anew"); t && tcp_auth::fingerprint(*t) == v->substr(sp + 1))
          return *t;
      }
      if (net::clock::now() >= deadline)
        throw error(errc::timeout, "tcp: rendezvous of job \"" + job_ + "\" timed out at rank " + std::to_string(rank_) +
                                       ": no file in " + dir + " holds the secret rank 0 published (\"" + *v +
                                       "\"): is rank 0 on this host, with the same /tmp? Ranks on several hosts: set COLLX_JOB_TOKEN");
      ::usleep(5000);
    }
  }

  /// A store only the job's user (a file store's private directory) or only the job's
  /// processes (a PMIx launcher's) can read: rank 0 draws the secret and keeps it there, the
  /// others read it from rank 0 (tcp/secret.hpp, 3).
  std::string secret_in_private_store(store& st, net::clock::time_point deadline) {
    if (rank_ == 0) {
      std::string secret = random_secret();
      st.set(key("secret"), secret);
      return secret;
    }
    auto t = st.get_from(0, key("secret"), deadline);
    if (!t) throw error(errc::timeout, "tcp: rendezvous of job \"" + job_ + "\" timed out at rank " + std::to_string(rank_) +
                                           ": rank 0 never put the job's secret in " + st.where() + " (is rank 0 running in this job?)");
    return *t;
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

  void run() {
    const auto deadline = net::clock::now() + cfg_.rendezvous_timeout;
    if (cfg_.token.size() > tcp_wire::kTokenBytes)
      throw error(errc::invalid_argument, "tcp: COLLX_JOB_TOKEN has " + std::to_string(cfg_.token.size()) + " characters (at most " +
                                              std::to_string(tcp_wire::kTokenBytes) + ")");
    // The secret, where the job was given one (tcp/secret.hpp: 1 and 2).
    std::string secret = cfg_.token;
    if (secret.empty() && !cfg_.token_file.empty()) {
      auto t = read_private_file(cfg_.token_file, "COLLX_JOB_TOKEN_FILE must name a file of mode 0600 that only you own");
      if (!t) throw error(errc::invalid_argument, "tcp: COLLX_JOB_TOKEN_FILE names " + cfg_.token_file + ", which does not exist");
      secret = *t;
    }
    // The store: rank 0 serves it (TCP), or a shared directory.
    std::unique_ptr<store_server> server;
    std::shared_ptr<store> st;  // the caller's (external_store), or one of the job's
    std::optional<net::address> master;
    if (!cfg_.master_addr.empty() && cfg_.master_port != 0) master = net::resolve(cfg_.master_addr, cfg_.master_port);
    else if (cfg_.external_store && !cfg_.master_addr.empty()) master = net::resolve(cfg_.master_addr, 1);  // a route, not a store
    const bool launcher_kept = cfg_.external_store && cfg_.external_store->launcher_kept();
    const bool one_host = secret.empty() && !launcher_kept && (job_on_one_host(cfg_.master_addr) || (master && master->is_loopback()));
    // (5) none (a job across hosts, no store directory): said once, by rank 0; an error where
    // the site asks for one.
    if (secret.empty() && !one_host && !launcher_kept && cfg_.store_path.empty()) {
      if (cfg_.tls) throw error(errc::invalid_argument, tls_needs_secret());
      if (secret_required()) throw error(errc::invalid_argument, no_secret_warning(job_) + " [rank " + std::to_string(rank_) + "]");
      if (rank_ == 0) std::fprintf(stderr, "collx %s\n", no_secret_warning(job_).c_str());
    }
    if (cfg_.external_store) {
      st = cfg_.external_store;
      if (secret.empty() && launcher_kept) secret = secret_in_private_store(*st, deadline);
      else if (secret.empty() && one_host) secret = host_secret_published(*st, deadline);
    } else if (!cfg_.store_path.empty()) {
      auto fs = std::make_unique<file_store>(cfg_.store_path, deadline);
      // A crashed run of this job may have left its keys: rank 0 removes them before it
      // publishes anything, and the others read the store only once rank 0 has (file_store::claim).
      if (rank_ == 0) fs->claim(job_);
      else fs->await_claim(job_, deadline, rank_);
      // (3) its directory is this user's alone (file_store checks): the secret may be kept there
      if (secret.empty()) secret = secret_in_private_store(*fs, deadline);
      st = std::move(fs);
    } else {
      if (!master && !served_)
        throw error(errc::invalid_argument, "tcp: no rendezvous: give master_addr and master_port, or store_path");
      // (4) one host: rank 0 keeps the secret in a file of this user's private directory, named
      // after the store's address (one job at a time serves there), before its store serves.
      const std::string host_file =
          one_host && master ? private_dir() + "/tcp-" + tcp_auth::fingerprint(job_ + "\n" + cfg_.master_addr + ":" + std::to_string(cfg_.master_port)) + ".secret"
                             : std::string();
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
        if (!host_file.empty()) {
          secret = random_secret();
          write_private_file(host_file, secret);
          host_file_ = host_file;
        }
        server = std::make_unique<store_server>(std::move(l), secret);
      } else if (!master) {
        throw error(errc::invalid_argument, "tcp: no rendezvous address for rank " + std::to_string(rank_));
      }
      if (rank_ != 0 && !host_file.empty()) {
        // The file may be a crashed run's until rank 0 has written this run's: a secret the
        // store refuses is read again, until the deadline.
        for (;;) {
          auto t = read_private_file(host_file, "remove it: collx writes it anew");
          if (t) {
            try {
              st = std::make_unique<tcp_store>(*master, *t, deadline);
              secret = *t;
              break;
            } catch (const store_denied&) {
              if (net::clock::now() >= deadline) throw;
            }
          } else if (net::clock::now() >= deadline) {
            throw error(errc::timeout, "tcp: rendezvous of job \"" + job_ + "\" timed out at rank " + std::to_string(rank_) +
                                           ": rank 0 never wrote the job's secret into " + host_file +
                                           " (is rank 0 running on this host, with the same /tmp? Ranks on several hosts: set "
                                           "COLLX_JOB_TOKEN)");
          }
          ::usleep(5000);
        }
      } else {
        st = std::make_unique<tcp_store>(*master, secret, deadline);
      }
    }
    token_ = secret;
    if (cfg_.tls && secret.empty()) throw error(errc::invalid_argument, tls_needs_secret());
    // This run's name, drawn by rank 0: what a shrink's hello and a position query prove is
    // bound to it, so neither replays into a later run of the same job and secret.
    if (rank_ == 0) {
      session_ = random_secret().substr(0, 16);
      st->set(key("session"), session_);
    } else if (auto v = st->get_from(0, key("session"), deadline)) {
      session_ = *v;
    } else {
      throw error(errc::timeout, "tcp: rendezvous of job \"" + job_ + "\" timed out at rank " + std::to_string(rank_) +
                                     ": rank 0 never published the run's name in " + st->where());
    }
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
      auto v = st->get_from(q, key("addr/" + std::to_string(q)), deadline);
      if (!v) {
        std::string missing;
        for (int x = 0; x < n_; ++x)
          if (x != rank_ && !st->get_from(x, key("addr/" + std::to_string(x)), net::clock::now()))
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
    connect_mesh(listener, addr, deadline);
    if (cfg_.tls) secure(peers_, rank_, n_, token_, "rendezvous", job_, deadline, [&](int q) { return who(q); });
    listener_ = std::move(listener);
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
    // waits for all of them before its server goes. (A launcher's store ends with the job.)
    if (!st->launcher_kept()) {
      st->set(key("ready/" + std::to_string(rank_)), "1");
      // The last rank to finish removes the job's keys (a file store would hand them to a later
      // job of the same name).
      if (st->add(key("ready"), 1) == n_) st->erase_prefix(job_ + "/");
    }
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
    size_buffers();
  }

  /// The job's token (after run()): a communicator split from this one admits its peers with it.
  const std::string& token() const noexcept { return token_; }
  /// This run's name (after run()): its communicators' shrinks and queries are bound to it.
  const std::string& session() const noexcept { return session_; }

  /// A communicator split from a connected one (core/split_plan.hpp): no store, the members'
  /// addresses came in the split's all_gather, and `listener` is the socket this rank offered.
  /// `parent`: the members' ranks in the communicator split from (messages name both).
  /// `watch`: this rank's connection to each member in the communicator split from (-1: none):
  /// a member whose connection there hangs up while this rank waits to connect to it or for its
  /// hello is gone (its process died), and the split fails at once naming it, not at the
  /// deadline (its peers then fail late, and miss the survivors' shrink).
  void run_split(net::fd listener, const std::vector<std::string>& where, const std::string& token, const std::string& session,
                 bool crowded, net::clock::time_point deadline, std::vector<int> parent = {}, std::vector<int> watch = {}) {
    parent_ = std::move(parent);
    watch_ = std::move(watch);
    token_ = token;
    session_ = session;
    crowded_ = crowded;
    peers_.clear();
    peers_.resize(std::size_t(n_));
    std::vector<net::address> addr(static_cast<std::size_t>(n_));
    for (int q = 0; q < n_; ++q) {
      if (q == rank_) continue;
      addr[std::size_t(q)] = net::parse_host_port(where[std::size_t(q)]);
      peers_[std::size_t(q)].where = where[std::size_t(q)];
    }
    connect_mesh(listener, addr, deadline);
    if (cfg_.tls) secure(peers_, rank_, n_, token_, "split", job_, deadline, [&](int q) { return who(q); });
    listener_ = std::move(listener);
    size_buffers();
  }

  /// Rank q as messages name it: in a split, with its rank in the communicator split from (a
  /// member that died before the split's connections were made is known to the reader by that).
  std::string tag(int q) const {
    std::string s = std::to_string(q);
    if (q >= 0 && std::size_t(q) < parent_.size())
      s += " (rank " + std::to_string(parent_[std::size_t(q)]) + " of the communicator split from)";
    return s;
  }
  std::string who(int q) const { return "rank " + tag(q); }
  /// The connection to split member q in the communicator split from (-1: none).
  int watched(int q) const { return q >= 0 && std::size_t(q) < watch_.size() ? watch_[std::size_t(q)] : -1; }
  /// A member that failed (rather than died) said why on that connection before it closed: its
  /// reason names the rank whose loss made it fail (chaos, tcp: a member that failed in the
  /// split's exchange of addresses, once a rank of the other part was killed).
  [[noreturn]] void member_gone(int q, const char* waiting) const {
    const std::string failed = member_failure(q, std::chrono::milliseconds(0));
    throw error(errc::peer_lost, "tcp: rendezvous of job \"" + job_ + "\": " + who(q) + " is gone while " + who(rank_) + " waited " + waiting +
                                     (!failed.empty() ? failed
                                                      : std::string(": its connection in the communicator split from closed (the process died, or failed and left)")));
  }
  /// ": it failed: <its reason>" when split member q said why it failed on its connection in
  /// the communicator split from, looked for there for up to `wait` (a member that fails in the
  /// split closes its connections here first, and says why there when it revokes that
  /// communicator, in a shrink); empty when it did not, or when that connection hung up
  /// without a reason.
  std::string member_failure(int q, std::chrono::milliseconds wait) const {
    const int f = watched(q);
    if (f < 0) return {};
    const auto until = net::clock::now() + wait;
    for (;;) {
      const bool up = net::hung_up(f);  // first: an abort frame comes before the hang-up
      if (const auto r = tcp_wire::peek_abort(f)) return ": it failed: " + *r;
      if (up || net::clock::now() >= until) return {};
      pollfd p{f, POLLRDHUP, 0};  // woken by the hang-up; the frame's bytes, looked at every 10 ms
      ::poll(&p, 1, std::clamp(net::ms_until(until), 1, 10));
    }
  }

  /// config::socket_buffer_bytes on every connection.
  void size_buffers() {
    for (conn& p : peers_)
      if (p.s && cfg_.socket_buffer_bytes > 0) {
        setsockopt(p.s.get(), SOL_SOCKET, SO_SNDBUF, &cfg_.socket_buffer_bytes, sizeof cfg_.socket_buffer_bytes);
        setsockopt(p.s.get(), SOL_SOCKET, SO_RCVBUF, &cfg_.socket_buffer_bytes, sizeof cfg_.socket_buffer_bytes);
      }
  }

  /// What the two ends of a connection from rank `from` to rank `to` prove they are for (the
  /// MACs of tcp/auth.hpp cover it): this job, these two ranks.
  static std::string context(const std::string& job, int from, int to, int n) {
    return "rendezvous\n" + job + "\n" + std::to_string(from) + "\n" + std::to_string(to) + "\n" + std::to_string(n);
  }
  std::string context(int from, int to) const { return context(job_, from, to, n_); }

  /// Connects to every lower rank and admits every higher one, concurrently. Each connection is
  /// admitted by the exchange of tcp/auth.hpp: hello (the connector's nonce), challenge (the
  /// acceptor's nonce and proof), proof (the connector's), verdict. The secret never crosses.
  void connect_mesh(net::fd& listener, const std::vector<net::address>& addr, net::clock::time_point deadline) {
    struct outgoing {
      int peer;
      tcp_wire::hello h;     // as sent: the proofs cover it
      std::size_t got = 0;   // of the challenge (or of the verdict once proven)
      tcp_wire::challenge c;
      tcp_wire::verdict v;
      bool proven = false;   // the acceptor's proof checked, this rank's sent: the verdict comes
      bool done = false;
    };
    struct incoming {
      net::fd s;
      std::string from;
      std::size_t got = 0;   // of the hello, then of the proof
      tcp_wire::hello h;
      tcp_wire::proof pr;
      tcp_auth::nonce na{};
      int peer = -1;         // once its hello is heard out: the rank it says it is
      net::clock::time_point until;  // from accept: a stranger's bytes never extend it
      bool short_word = false;  // part of its first message came, unread: not watched (they keep it readable), looked at every 10 ms
    };
    std::vector<outgoing> outs;
    for (int q = 0; q < rank_; ++q) {
      std::string why;
      bool gone = false;
      net::fd s = net::connect_until(addr[std::size_t(q)], deadline, why, watched(q), &gone);
      if (gone) member_gone(q, "to connect to it");
      if (!s)
        throw error(errc::timeout, "tcp: rendezvous of job \"" + job_ + "\": " + who(rank_) + " could not connect to " + who(q) + " at " + addr[std::size_t(q)].str() + ": " + why);
      outgoing o{q, {}, 0, {}, {}, false, false};
      o.h.rank = std::uint32_t(rank_);
      o.h.size = std::uint32_t(n_);
      const tcp_auth::nonce nc = tcp_auth::fresh_nonce();
      std::memcpy(o.h.nonce, nc.data(), nc.size());
      if (net::write_all(s.get(), &o.h, sizeof o.h, deadline) != net::io::ok)
        throw error(errc::peer_lost, "tcp: rendezvous: " + who(q) + " at " + addr[std::size_t(q)].str() + " closed the connection" +
                                         member_failure(q, kFailureWait));
      peers_[std::size_t(q)].s = std::move(s);
      outs.push_back(o);
    }
    auto bytes = [](const auto& x) { return std::span<const std::byte>(reinterpret_cast<const std::byte*>(&x), sizeof x); };
    std::vector<incoming> ins;
    int admitted = 0, verdicts = 0;
    const int expect_in = n_ - 1 - rank_;
    std::vector<pollfd> pf;
    while (admitted < expect_in || verdicts < int(outs.size())) {
      const auto now = net::clock::now();
      if (now >= deadline) {
        std::string missing;
        for (int q = rank_ + 1; q < n_; ++q)
          if (!peers_[std::size_t(q)].s) missing += (missing.empty() ? "" : ", ") + tag(q);
        std::string silent;
        for (const outgoing& o : outs)
          if (!o.done) silent += (silent.empty() ? "" : ", ") + tag(o.peer);
        throw error(errc::timeout, "tcp: rendezvous of job \"" + job_ + "\" timed out at " + who(rank_) +
                                       (missing.empty() ? "" : ": no admitted connection from rank(s) " + missing) +
                                       (silent.empty() ? "" : ": no answer to its hello from rank(s) " + silent));
      }
      pf.clear();
      pf.push_back({listener.get(), POLLIN, 0});
      bool any_short = false;
      for (const incoming& in : ins) {
        pf.push_back({in.s.get(), short(in.short_word ? 0 : POLLIN), 0});
        any_short = any_short || in.short_word;
      }
      for (const outgoing& o : outs) pf.push_back({peers_[std::size_t(o.peer)].s.get(), short(o.done ? 0 : POLLIN), 0});
      const std::size_t watch_at = pf.size();
      for (int q = rank_ + 1; q < n_; ++q)  // members yet to connect: their connections in the communicator split from
        pf.push_back({peers_[std::size_t(q)].s ? -1 : watched(q), POLLRDHUP, 0});
      // (a stranger's login deadline is looked at at least every 100 ms)
      const int wait_ms = std::min(ins.empty() ? net::ms_until(deadline) : 100, net::ms_until(deadline));
      ::poll(pf.data(), pf.size(), any_short ? std::min(10, wait_ms) : wait_ms);
      for (int q = rank_ + 1; q < n_; ++q)
        if ((pf[watch_at + std::size_t(q - rank_ - 1)].revents & net::kHangUp) != 0 && !peers_[std::size_t(q)].s)
          member_gone(q, "for its connection");
      if (pf[0].revents & POLLIN)
        for (int k = 0; k < kAcceptPerPass; ++k) {  // (bounded: the rest wait for the next pass)
          net::address a;
          a.len = sizeof a.ss;
          const int f = ::accept4(listener.get(), a.sa(), &a.len, SOCK_CLOEXEC | SOCK_NONBLOCK);
          if (f < 0) break;
          net::set_nodelay(f);
          // A flood of strangers: the oldest connection not admitted yet makes room (a rank's
          // exchange takes a round trip or two; the flood would have to outpace that).
          if (ins.size() >= kMaxUnproven) {
            // (one that said a hello, likely a rank, goes only when no silent one is left)
            auto older = [](const incoming& x, const incoming& y) { return x.until < y.until; };
            auto oldest = ins.end();
            for (auto it = ins.begin(); it != ins.end(); ++it)
              if (it->peer < 0 && (oldest == ins.end() || older(*it, *oldest))) oldest = it;
            if (oldest == ins.end()) oldest = std::min_element(ins.begin(), ins.end(), older);
            refuse(oldest->from, "too many connections that have not proven themselves: the oldest made room");
            ins.erase(oldest);
          }
          // A stranger that connects and does not prove itself is dropped a few seconds after
          // its connect (no byte it sends extends that).
          ins.push_back({net::fd(f), a.str(), 0, {}, {}, {}, -1, std::min(deadline, net::clock::now() + kLogin), false});
        }
      for (incoming& in : ins) {
        if (!in.s) continue;
        if (in.got == 0 && in.peer < 0) {
          // A peer already past its rendezvous may reach this rank still in its own: its shrink's
          // hello, or its query of this rank's position (a timeout's desync report). Neither is
          // for the rendezvous, which would refuse it as a stranger (and fail that peer's shrink):
          // it is kept unread for the communicator's listener (early(): the query point and the
          // shrink read it).
          // (Only one whose MAC holds, for this communicator and this run; at most as many as the
          // communicator's listener sets aside: past that, strangers.)
          const opened o = peek_opening(in.s.get(), token_, job_ + "#" + session_, rank_, n_, detail::fnv1a(job_));
          in.short_word = o.what == opening::pending && o.got > 0;
          if ((o.what == opening::shrink || o.what == opening::query) && early_.size() < max_early()) {
            early_.push_back(std::move(in.s));
            continue;
          }
          if (o.what == opening::forged) {
            refuse(in.from, "a shrink's hello or a position query without proof that its sender holds the job's secret");
            in.s.reset();
            continue;
          }
          if (in.short_word && net::clock::now() < in.until) continue;  // the rest of its first message comes
        }
        char* into = in.peer < 0 ? reinterpret_cast<char*>(&in.h) : reinterpret_cast<char*>(&in.pr);
        const std::size_t want = in.peer < 0 ? sizeof in.h : sizeof in.pr;
        const ssize_t k = ::recv(in.s.get(), into + in.got, want - in.got, MSG_DONTWAIT);
        if (k > 0) in.got += std::size_t(k);
        const bool eof = k == 0 || (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
        if (in.got < want) {
          if (eof || net::clock::now() >= in.until) {
            refuse(in.from, eof ? (in.peer < 0 ? "closed before its hello" : "closed before its proof")
                                : (in.peer < 0 ? "sent no hello in time" : "sent no proof in time"));
            in.s.reset();
          }
          continue;
        }
        auto answer = [&](tcp_wire::verdict_code code) {
          tcp_wire::verdict v;
          v.code = std::uint32_t(code);
          return net::write_all(in.s.get(), &v, sizeof v, net::clock::now() + std::chrono::seconds(1)) == net::io::ok;
        };
        if (in.peer < 0) {  // its hello: refused outright, or challenged
          int who = -1;
          const auto code = tcp_wire::check_hello(std::span<const std::byte, sizeof in.h>(reinterpret_cast<const std::byte*>(&in.h), sizeof in.h),
                                                  rank_, n_, who);
          if (code != tcp_wire::verdict_code::admitted) {
            answer(code);
            refuse(in.from, tcp_wire::describe(code));
            in.s.reset();
            continue;
          }
          tcp_wire::challenge c;
          in.na = tcp_auth::fresh_nonce();
          std::memcpy(c.nonce, in.na.data(), in.na.size());
          const tcp_auth::mac m = tcp_auth::accept_proof(token_, context(who, rank_), bytes(in.h), in.na);
          std::memcpy(c.mac, m.data(), m.size());
          if (net::write_all(in.s.get(), &c, sizeof c, net::clock::now() + std::chrono::seconds(1)) != net::io::ok) {
            refuse(in.from, "closed before its challenge");
            in.s.reset();
            continue;
          }
          in.peer = who;
          in.got = 0;
          continue;
        }
        // its proof
        const tcp_auth::mac m = tcp_auth::connect_proof(token_, context(in.peer, rank_), bytes(in.h), in.na);
        auto code = in.pr.magic == tcp_wire::kProofMagic && tcp_auth::same({in.pr.mac, tcp_wire::kMac}, m)
                        ? tcp_wire::verdict_code::admitted
                        : tcp_wire::verdict_code::bad_token;
        if (code == tcp_wire::verdict_code::admitted && peers_[std::size_t(in.peer)].s) code = tcp_wire::verdict_code::duplicate;
        const bool sent = answer(code);
        if (code == tcp_wire::verdict_code::admitted && sent) {
          peers_[std::size_t(in.peer)].s = std::move(in.s);
          ++admitted;
        } else {
          refuse(in.from, tcp_wire::describe(code));
          in.s.reset();
        }
      }
      std::erase_if(ins, [](const incoming& in) { return !in.s; });
      for (outgoing& o : outs) {
        if (o.done) continue;
        conn& p = peers_[std::size_t(o.peer)];
        // Before its proof is checked the acceptor sends a challenge (or a verdict refusing the
        // hello outright: its first 8 bytes say which); after, the verdict.
        char* into = o.proven ? reinterpret_cast<char*>(&o.v) : reinterpret_cast<char*>(&o.c);
        std::size_t want = o.proven ? sizeof o.v : sizeof o.c;
        if (!o.proven && o.got >= sizeof o.v) {
          std::uint32_t magic = 0;
          std::memcpy(&magic, &o.c, sizeof magic);
          if (magic == tcp_wire::kVerdictMagic) want = sizeof o.v;
        }
        const ssize_t k = o.got < want ? ::recv(p.s.get(), into + o.got, want - o.got, MSG_DONTWAIT) : 0;
        if (k > 0) o.got += std::size_t(k);
        else if (o.got < want && (k == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)))
          throw error(errc::peer_lost, "tcp: rendezvous: " + who(o.peer) + " at " + p.where + " closed the connection before admitting " +
                                           who(rank_) + member_failure(o.peer, kFailureWait));
        if (!o.proven && o.got >= sizeof o.v) {
          std::uint32_t magic = 0;
          std::memcpy(&magic, &o.c, sizeof magic);
          if (magic == tcp_wire::kVerdictMagic) {  // refused before any proof
            std::memcpy(static_cast<void*>(&o.v), static_cast<const void*>(&o.c), sizeof o.v);
            o.proven = true;
            want = sizeof o.v;
          } else if (magic != tcp_wire::kChallengeMagic) {
            throw error(errc::transport_error, "tcp: rendezvous: garbage instead of a challenge from " + p.where + " (" + who(o.peer) + ")");
          }
        }
        if (o.got < want) continue;
        if (!o.proven) {
          tcp_auth::nonce na;
          std::memcpy(na.data(), o.c.nonce, na.size());
          const std::string ctx = context(rank_, o.peer);
          if (!tcp_auth::same({o.c.mac, tcp_wire::kMac}, tcp_auth::accept_proof(token_, ctx, bytes(o.h), na)))
            throw error(errc::invalid_argument, "tcp: " + who(o.peer) + "'s address " + p.where + " answered " + who(rank_) +
                                                    " without proof that it holds the job's secret (another job or another "
                                                    "secret there: do both ranks run job \"" + job_ + "\" with the same "
                                                    "COLLX_JOB_TOKEN?)");
          tcp_wire::proof pr;
          const tcp_auth::mac m = tcp_auth::connect_proof(token_, ctx, bytes(o.h), na);
          std::memcpy(pr.mac, m.data(), m.size());
          if (net::write_all(p.s.get(), &pr, sizeof pr, deadline) != net::io::ok)
            throw error(errc::peer_lost, "tcp: rendezvous: " + who(o.peer) + " at " + p.where + " closed the connection before admitting " +
                                             who(rank_) + member_failure(o.peer, kFailureWait));
          o.proven = true;
          o.got = 0;
          continue;
        }
        const auto code = tcp_wire::parse_verdict(std::span<const std::byte, sizeof o.v>(reinterpret_cast<const std::byte*>(&o.v), sizeof o.v));
        if (!code) throw error(errc::transport_error, "tcp: rendezvous: garbage instead of a verdict from " + p.where + " (" + who(o.peer) + ")");
        if (*code != tcp_wire::verdict_code::admitted)
          throw error(errc::invalid_argument, "tcp: " + who(o.peer) + " at " + p.where + " refused " + who(rank_) +
                                                  ": " + tcp_wire::describe(*code) + " (do both ranks run the same job with the same COLLX_JOB_TOKEN?)");
        o.done = true;
        ++verdicts;
      }
    }
    // What is accepted and has said nothing yet may be a peer's shrink or query whose bytes are
    // on their way (a shrink connects, and writes its hello once the connection is up): kept
    // for the communicator's listener too, never closed unread (a closed hello reads as a dead
    // rank). A stranger's is dropped there.
    for (incoming& in : ins)
      if (in.s && in.got == 0 && in.peer < 0 && early_.size() < max_early()) early_.push_back(std::move(in.s));
  }
  /// How long a member that closed its connection here is given to say why on its connection
  /// in the communicator split from (member_failure).
  static constexpr std::chrono::milliseconds kFailureWait{200};
  /// As many as the communicator's listener sets aside (tcp/desync.hpp, max_parked).
  std::size_t max_early() const noexcept { return std::size_t(4 * n_ + 16); }
  /// New connections taken a pass of the loop; connections held that have not proven
  /// themselves, at most; the time one has, from its connect, to do so.
  static constexpr int kAcceptPerPass = 64;
  static constexpr std::size_t kMaxUnproven = 256;
  static constexpr std::chrono::seconds kLogin{5};

  /// Logs a refused connection (the first 32 of a rendezvous, then a count every 1024: a flood
  /// does not flood stderr).
  void refuse(const std::string& from, const char* why) {
    ++refusals_;
    if (refusals_ <= 32)
      std::fprintf(stderr, "collx tcp: job \"%s\" rank %d refused a connection from %s: %s\n", job_.c_str(), rank_, from.c_str(), why);
    else if (refusals_ % 1024 == 0)
      std::fprintf(stderr, "collx tcp: job \"%s\" rank %d: %llu connections refused so far (the first 32 named above)\n", job_.c_str(), rank_,
                   (unsigned long long)refusals_);
  }

  std::string job_;
  int rank_ = 0, n_ = 1;
  tcp_config cfg_;
  net::fd served_;  // launch_processes: the store's listening socket (rank 0), owned from the start
  net::fd listener_;
  std::vector<net::fd> early_;
  std::vector<conn> peers_;
  bool crowded_ = false;
  std::string token_;      // the job's secret (empty: none, tcp/secret.hpp)
  std::string session_;    // this run's name (run())
  std::string host_file_;  // the file rank 0 kept it in for the other ranks of this host: removed with the rendezvous
  std::uint64_t refusals_ = 0;
  std::vector<int> parent_;  // of a split: the members' ranks in the communicator split from
  std::vector<int> watch_;   // of a split: this rank's connections to them there (-1: none)
};

}  // namespace collx::transport::tcp_detail
