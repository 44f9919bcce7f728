#pragma once
// transport::tcp — ranks on any hosts, one TCP connection per pair of ranks.
//
// Three parts, each in its own file:
//   tcp/rendezvous.hpp  how ranks find each other (a store at MASTER_ADDR:MASTER_PORT, a shared
//                       directory, or a PMIx launcher's: tcp/pmix_store.hpp, in programs built
//                       with collx::pmix), admit each other (the job's token) and connect;
//   tcp/stream.hpp      the data path: frames on each connection and the loop that moves a step's
//                       sends and receives together, synchronous sends for point to point, faults;
//   tcp/wire.hpp        what goes on the wire, and the parsers every byte read passes through;
//   tcp/shrink.hpp      after a failure, the survivors' new communicator (communicator::shrink),
//                       found through the socket each rank keeps listening on.
// Every socket is owned (net::fd) and closed on every path.
#include <algorithm>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <utility>

#include <sys/socket.h>

#include "../core/concepts.hpp"
#include "../core/job_env.hpp"
#include "../core/error.hpp"
#include "../core/split_plan.hpp"
#include "tcp/config.hpp"
#include "tcp/desync.hpp"
#include "tcp/rendezvous.hpp"
#include "tcp/shrink.hpp"
#include "tcp/socket.hpp"
#include "tcp/store.hpp"
#include "tcp/stream.hpp"
#include "tcp/wire.hpp"
#if defined(COLLX_WITH_PMIX)
#include "tcp/pmix_store.hpp"
#endif

namespace collx::transport {

class tcp {
 public:
  using transport_concept = transport_tag;
  using memory_space = host_memory;
  static constexpr const char* name = "tcp";
  using config = tcp_config;

  /// Rank `rank` of `size` in job `job`, meeting through cfg's store (cfg.store_path, or the
  /// TCP store at cfg.master_addr:cfg.master_port served by rank 0).
  tcp(std::string job, int rank, int size, config cfg = {}) : rank_(rank), n_(size), job_(job), cfg_(cfg) {
    if (size < 1 || rank < 0 || rank >= size)
      throw error(errc::invalid_argument, "tcp: rank " + std::to_string(rank) + " is out of range for " + std::to_string(size) + " ranks");
    if (job.empty() || job.size() > 128) throw error(errc::invalid_argument, "tcp: the job name must have 1..128 characters");
    cfg_.serve_store_fd = -1;
    net::fd served(std::exchange(cfg.serve_store_fd, -1));
    tcp_detail::rendezvous r(std::move(job), rank, size, std::move(cfg), std::move(served));
    r.run();
    token_ = r.token();
    session_ = r.session();
    crowded_ = r.crowded();
    listener_ = std::move(r.listener());
    net_ = tcp_detail::streams(std::move(r.peers()), r.crowded());
    observe_positions(std::move(r.early()));
  }

  /// Before a split (core/split_plan.hpp): a socket the new communicator's peers connect to, on the
  /// address this rank's connections use; the offer carries it as "host:port".
  split_offer prepare_split() {
    split_offer o;
    if (n_ == 1) return o;
    net::address here;
    here.len = sizeof here.ss;
    const int s = net_.socket_of(rank_ == 0 ? 1 : 0);
    if (getsockname(s, here.sa(), &here.len) != 0)
      throw error(errc::transport_error, "tcp: rank " + std::to_string(rank_) + ": split: getsockname failed");
    here.set_port(0);
    auto [listener, at] = net::listen_on(here);
    const std::string where = at.str();
    if (where.size() >= o.blob.size()) throw error(errc::transport_error, "tcp: split: address " + where + " is too long");
    std::memcpy(o.blob.data(), where.data(), where.size());
    o.keep = std::make_shared<net::fd>(std::move(listener));
    return o;
  }

  /// The new communicator's connections: each member connects to the members below it and
  /// admits those above it with the job's token, as at the job's start.
  tcp split(const split_plan& p, split_offer&& o) const {
    tcp t;
    t.rank_ = p.rank;
    t.n_ = p.size;
    t.job_ = job_ + "." + p.id;
    t.cfg_ = cfg_;
    t.token_ = token_;
    t.session_ = session_;
    t.crowded_ = crowded_;
    std::vector<net::fd> early;
    if (p.size > 1) {
      std::vector<std::string> where(std::size_t(p.size));
      for (int q = 0; q < p.size; ++q) where[std::size_t(q)] = std::string(p.offers[std::size_t(q)].data(), strnlen(p.offers[std::size_t(q)].data(), split_offer::kBlob));
      net::fd listener = std::move(*std::static_pointer_cast<net::fd>(o.keep));
      tcp_detail::rendezvous r(t.job_, p.rank, p.size, cfg_, net::fd{});
      std::vector<int> watch(std::size_t(p.size), -1);  // this rank's connections to the members here
      for (int q = 0; q < p.size; ++q)
        if (q != p.rank) watch[std::size_t(q)] = net_.socket_of(p.members[std::size_t(q)]);
      r.run_split(std::move(listener), where, token_, session_, crowded_, net::clock::now() + cfg_.rendezvous_timeout, p.members, std::move(watch));
      t.listener_ = std::move(r.listener());
      t.net_ = tcp_detail::streams(std::move(r.peers()), crowded_);
      early = std::move(r.early());
    }
    t.observe_positions(std::move(early));
    return t;
  }

  /// communicator::shrink (core/split_plan.hpp): the survivors meet through the sockets each rank
  /// keeps listening on and agree on who they are (tcp/shrink.hpp); their connections there
  /// become the new communicator's.
  tcp shrink(const shrink_request& q, std::vector<int>& members) {
    tcp t;
    t.job_ = job_ + "." + q.id;
    t.cfg_ = cfg_;
    t.token_ = token_;
    t.session_ = session_;
    t.crowded_ = crowded_;
    if (n_ == 1) {
      members = {0};
      t.observe_positions();
      return t;
    }
    if (moved_from_ || !listener_)
      throw error(errc::invalid_argument, q.what + ": this rank's tcp transport keeps no listener (it was moved from)");
    std::vector<std::string> where(static_cast<std::size_t>(n_));
    for (int p = 0; p < n_; ++p)
      if (p != rank_) where[std::size_t(p)] = net_.where(p);
    tcp_detail::shrunk s =
        tcp_detail::shrinker(rank_, n_, proven_name(), token_, std::move(where), listener_.get(), q, cfg_, net_.take_parked()).run();
    members = s.members;
    t.rank_ = int(std::find(members.begin(), members.end(), rank_) - members.begin());
    t.n_ = int(members.size());
    if (cfg_.tls)
      tcp_detail::secure(s.peers, t.rank_, t.n_, token_, "shrink", t.job_, net::clock::now() + cfg_.rendezvous_timeout,
                         [&](int m) { return q.what + ": rank " + std::to_string(m) + " of the shrunk communicator"; });
    t.listener_ = std::move(s.listener);
    t.net_ = tcp_detail::streams(std::move(s.peers), crowded_);
    t.observe_positions();
    return t;
  }

  /// Rank, size, job and the rendezvous from the launcher's environment (core/job_env.hpp):
  /// MASTER_ADDR/MASTER_PORT, else COLLX_STORE_PATH, else the PMIx launcher's store (mpirun,
  /// srun --mpi=pmix; programs built with collx::pmix: tcp/pmix_store.hpp).
  static tcp from_env(config cfg = {}) {
    const launch_info li = launch_info_from_env();
    if (cfg.master_addr.empty()) cfg.master_addr = li.master_addr;
    if (cfg.master_port == 0) cfg.master_port = li.master_port;
    if (cfg.store_path.empty() && !cfg.external_store && (cfg.master_addr.empty() || cfg.master_port == 0)) {
      const bool pmix = pmix_launched();
#if defined(COLLX_WITH_PMIX)
      if (pmix) {
        cfg.external_store = std::make_shared<pmix_store>(li.rank);
        cfg.master_addr = launcher_route_address();  // only picks the interface (tcp_config::external_store)
        cfg.master_port = 0;
        return tcp(li.job, li.rank, li.size, std::move(cfg));
      }
#endif
      std::string hint;
      if (pmix) hint = ", or build the program with collx::pmix (its launcher serves PMIx, and this program has no PMIx)";
#if defined(COLLX_WITH_PMIX)
      else if (li.launcher == "srun") hint = ", or start the job with srun --mpi=pmix (this srun served no PMIx: its --mpi is none or pmi2)";
#endif
      throw error(errc::invalid_argument, "tcp: found " + li.launcher + "'s rank and size but no rendezvous: set MASTER_ADDR and MASTER_PORT (rank 0 serves the "
                                          "store there), or COLLX_STORE_PATH (a shared directory)" + hint);
    }
    return tcp(li.job, li.rank, li.size, std::move(cfg));
  }

  tcp(tcp&& o) noexcept
      : rank_(o.rank_), n_(o.n_), job_(std::move(o.job_)), cfg_(std::move(o.cfg_)), token_(std::move(o.token_)),
        session_(std::move(o.session_)), crowded_(o.crowded_), listener_(std::move(o.listener_)), board_(std::move(o.board_)), net_(std::move(o.net_)),
        moved_from_(false) {
    o.moved_from_ = true;
  }
  tcp& operator=(tcp&& o) noexcept {
    if (this != &o) {
      leave();
      rank_ = o.rank_;
      n_ = o.n_;
      job_ = std::move(o.job_);
      cfg_ = std::move(o.cfg_);
      token_ = std::move(o.token_);
      session_ = std::move(o.session_);
      crowded_ = o.crowded_;
      // net_ first: its query point (on this listener, pointing into this board) is unlisted
      // before either goes
      net_ = std::move(o.net_);
      board_ = std::move(o.board_);
      listener_ = std::move(o.listener_);
      moved_from_ = false;
      o.moved_from_ = true;
    }
    return *this;
  }
  tcp(const tcp&) = delete;
  tcp& operator=(const tcp&) = delete;
  ~tcp() { leave(); }

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return n_; }
  /// Buffers spread over pieces (core/concepts.hpp) are read and written through core/deliver.hpp.
  bool takes_pieces() const noexcept { return true; }
  /// Where peer p is (host:port), for messages and tests.
  std::string peer_address(int p) const { return net_.where(p); }
  /// The desync report's board (core/call_info.hpp, call_info::positions): this rank's position,
  /// and its peers' once a timeout has asked them (tcp/desync.hpp).
  detail::position_board positions() const noexcept {
    return board_ ? detail::position_board{board_.get(), sizeof(detail::position), n_} : detail::position_board{};
  }

  void exchange(std::span<const send_desc> sends, std::span<const recv_desc> recvs, const exchange_context& ctx) {
    net_.exchange(sends, recvs, ctx);
  }
  /// The engine's view (tcp_detail::streams::engage).
  template <class F>
  void engage(const call_info& call, F&& f) {
    net_.engage(call, std::forward<F>(f));
  }
  /// Receive from any source: tcp_detail::streams::probe.
  int probe(std::span<const int> peers, const call_info& call) { return net_.probe(peers, call); }
  /// This rank failed: peers learn why, then see the connections close (errc::peer_lost).
  void abort(const std::string& why) noexcept {
    if (!moved_from_) net_.abort(why);
  }
  /// Leaves the job normally: peers still waiting for this rank learn that it has left.
  void leave() noexcept {
    if (!moved_from_) net_.leave();
  }

 private:
  tcp() = default;
  /// What a shrink's hello and a position query on this communicator prove they are for: its
  /// name and the run's (tcp/proofs.hpp).
  std::string proven_name() const { return job_ + "#" + session_; }
  /// The board, and this communicator's query point on its listener (tcp/desync.hpp).
  void observe_positions(std::vector<net::fd> early = {}) {
    board_ = std::make_unique<detail::position[]>(std::size_t(n_));
    if (!listener_) return;
    auto qp = std::make_unique<tcp_detail::query_point>();
    // What reached the listener during the rendezvous for this communicator: looked at as any
    // connection a wait accepts (a query answered, a shrink's hello set aside for the shrink).
    for (net::fd& f : early) qp->pending.push_back({f.release(), net::clock::now()});
    qp->listener = listener_.get();
    qp->rank = rank_;
    qp->size = n_;
    qp->job = detail::fnv1a(job_);
    qp->name = proven_name();
    qp->secret = token_;
    qp->own = &board_[std::size_t(rank_)];
    net_.observe(tcp_detail::query_listing(std::move(qp)), board_.get());
  }
  int rank_ = 0, n_ = 1;
  std::string job_;
  config cfg_;
  std::string token_;
  std::string session_;  // the run's name (rendezvous.hpp, session())
  bool crowded_ = false;
  net::fd listener_;  // where this rank accepted its peers: a shrink finds it there, a timeout's query too
  std::unique_ptr<detail::position[]> board_;  // positions(); before net_, which points into it
  tcp_detail::streams net_;
  bool moved_from_ = false;
};

}  // namespace collx::transport
