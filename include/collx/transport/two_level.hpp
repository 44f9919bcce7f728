#pragma once
// transport::two_level<Intra, Inter>: one communicator over two transports, for jobs on several
// nodes. Ranks that share a node (core/topology.hpp: node_map) talk over `Intra` (shared memory:
// each node's ranks are a transport of their own, numbered 0..L-1 there); every other pair over
// `Inter` (tcp, mpi: one transport of all N ranks, numbered as here). It is a transport like any
// other: every collective and policy runs over it, and a step's messages each go the way their
// peer is reached. A two-level policy (algo/two_level.hpp) reads the node map and keeps most of
// the bytes on the node: only 1/L of the data crosses between nodes per rank.
//
//   auto t = collx::transport::two_level<shm, tcp>::from_env();   // torchrun, mpirun, srun
//   collx::communicator comm{std::move(t)};
//   collx::all_reduce(comm, std::span{grads}, collx::ops::sum{}, collx::algo::two_level{});
//
// A step whose peers are all on this node runs on Intra alone, one whose peers are all elsewhere
// on Inter alone (its messages as they are: Inter numbers ranks as here); a step with both (a
// flat ring across nodes) runs on both at once (engine.hpp, exchange_pair). Intra sees the call
// with its own numbering (call_info::up maps it back), so messages, the flight record and the
// desync report name ranks of this communicator.
//
// Which ranks share a node: from_env() gathers every rank's node key over Inter: COLLX_NODE
// where set (tests: several "nodes" on one machine), else the host name.
//
// Placement (connect): a rank its launcher did not pin is pinned to its NUMA domain, local rank
// l of L to domain l·D/L (core/machine.hpp; COLLX_PIN=0: none). COLLX_TOPO_DUMP=FILE: rank 0
// writes the job's topology there as JSON: the nodes, the ranks on each, each node's NUMA
// domains, CPUs and memory (from its local rank 0), and the transport of each level.
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "../core/call_info.hpp"
#include "../core/concepts.hpp"
#include "../core/error.hpp"
#include "../core/job_env.hpp"
#include "../core/machine.hpp"
#include "../core/options.hpp"
#include "../core/settings.hpp"
#include "../core/split_plan.hpp"
#include "../core/topology.hpp"
#include "engine.hpp"

namespace collx::transport {

namespace detail_two_level {
template <class T>
struct config_of {
  struct none {};
  using type = none;
};
template <class T>
  requires requires { typename T::config; }
struct config_of<T> {
  using type = typename T::config;
};
}  // namespace detail_two_level

template <class Intra, class Inter>
class two_level {
 public:
  using transport_concept = transport_tag;
  using memory_space = host_memory;
  static constexpr const char* name = "two_level";
  template <class T>
  using config_of = typename detail_two_level::config_of<T>::type;

  /// `in`: this node's ranks (its rank = nodes.local_of[rank]); `out`: every rank, numbered as here.
  two_level(Intra in, Inter out, node_map nodes) : in_(std::move(in)), out_(std::move(out)), nodes_(std::move(nodes)) {
    const int r = out_.rank();
    if (nodes_.size() != out_.size() || r < 0 || r >= nodes_.size())
      throw error(errc::invalid_argument, "two_level: the node map has " + std::to_string(nodes_.size()) + " ranks, the transport across nodes " +
                                              std::to_string(out_.size()));
    const auto& mine = nodes_.members[std::size_t(nodes_.node_of[std::size_t(r)])];
    if (in_.size() != int(mine.size()) || in_.rank() != nodes_.local_of[std::size_t(r)])
      throw error(errc::invalid_argument, "two_level: rank " + std::to_string(r) + " is local rank " +
                                              std::to_string(nodes_.local_of[std::size_t(r)]) + " of " + std::to_string(mine.size()) +
                                              " on its node, its node's transport says " + std::to_string(in_.rank()) + " of " +
                                              std::to_string(in_.size()));
  }
  two_level(two_level&&) noexcept = default;
  two_level& operator=(two_level&&) noexcept = default;

  int rank() const noexcept { return out_.rank(); }
  int size() const noexcept { return out_.size(); }
  const node_map& nodes() const noexcept { return nodes_; }
  /// The transports within a node and between nodes, by name (automatic's model of two levels
  /// takes each one's calibration: collectives/common.hpp).
  std::pair<const char*, const char*> level_kinds() const noexcept { return {Intra::name, Inter::name}; }
  Intra& intra() noexcept { return in_; }
  Inter& inter() noexcept { return out_; }
  const Intra& intra() const noexcept { return in_; }
  const Inter& inter() const noexcept { return out_; }
  /// The ranks here of this node's ranks (local rank l is node_ranks()[l]).
  const std::vector<int>& node_ranks() const noexcept { return nodes_.members[std::size_t(nodes_.node_of[std::size_t(rank())])]; }

  bool takes_pieces() const noexcept { return collx::detail::takes_pieces(in_) && collx::detail::takes_pieces(out_); }
  /// The desync report's board: Inter's, whose ranks are numbered as here.
  detail::position_board positions() const noexcept
    requires requires(const Inter& t) { t.positions(); }
  {
    return out_.positions();
  }

  void exchange(std::span<const send_desc> sends, std::span<const recv_desc> recvs, const exchange_context& ctx) {
    const call_info& call = *ctx.call;
    bool local = false, remote = false;
    for (const send_desc& s : sends) (nodes_.same_node(s.peer, call.rank) ? local : remote) = true;
    for (const recv_desc& r : recvs) (nodes_.same_node(r.peer, call.rank) ? local : remote) = true;
    if (!local) return out_.exchange(sends, recvs, ctx);
    ls_.clear();
    lr_.clear();
    os_.clear();
    or_.clear();
    auto place = [&](const auto& ops, auto& on_node, auto& across) {
      for (const auto& o : ops) {
        if (!nodes_.same_node(o.peer, call.rank)) {
          across.push_back(o);
          continue;
        }
        on_node.push_back(o);
        on_node.back().peer = nodes_.local_of[std::size_t(o.peer)];
      }
    };
    place(sends, ls_, os_);
    place(recvs, lr_, or_);
    // A receive that reduces into what an earlier receive writes waits for it (the order rule),
    // also when the two lie on different transports (engine::cross_order).
    bool chained = false;
    for (const recv_desc& r : recvs) chained = chained || r.with != nullptr || r.with_spread.of != nullptr;
    if (chained && !lr_.empty() && !or_.empty()) {
      side_.clear();
      index_.clear();
      std::uint32_t at[2] = {0, 0};
      for (const recv_desc& r : recvs) {
        const std::uint8_t x = nodes_.same_node(r.peer, call.rank) ? 0 : 1;
        side_.push_back(x);
        index_.push_back(at[x]++);
      }
      order_.build(recvs, side_, index_);
    } else {
      order_.clear();
    }
    call_info sub = on_node(call);
    const exchange_context lctx{&sub, ctx.comb, ctx.synchronous};
    struct keep_first_wait {  // the whole call's deadline counts from its first wait, on either
      const call_info& call;
      const call_info& sub;
      ~keep_first_wait() {
        if (call.first_wait == std::chrono::steady_clock::time_point{}) call.first_wait = sub.first_wait;
      }
    } keep{call, sub};
    if (!remote) return in_.exchange(ls_, lr_, lctx);
    in_.engage(sub, [&](auto& ca, auto& sa) {
      out_.engage(call, [&](auto& cb, auto& sb) { engine::exchange_pair(ca, sa, ls_, lr_, lctx, cb, sb, os_, or_, ctx, &order_); });
    });
  }

  /// Receive from any source: the first of `peers` with a point-to-point message waiting.
  int probe(std::span<const int> peers, const call_info& call) {
    std::vector<int> local, remote;
    for (int p : peers) (nodes_.same_node(p, call.rank) ? local : remote).push_back(p);
    if (local.empty()) return out_.probe(peers, call);
    call_info sub = on_node(call);
    std::vector<int> mapped;
    for (int p : local) mapped.push_back(nodes_.local_of[std::size_t(p)]);
    if (remote.empty()) return local[std::size_t(index_of(mapped, in_.probe(mapped, sub)))];
    int k = -1;
    in_.engage(sub, [&](auto& ca, auto&) {
      out_.engage(call, [&](auto& cb, auto&) { k = engine::wait_any_pair(ca, std::span<const int>(mapped), sub, cb, std::span<const int>(remote), call); });
    });
    return std::size_t(k) < local.size() ? local[std::size_t(k)] : remote[std::size_t(k) - local.size()];
  }

  /// This rank failed: both transports' peers learn it.
  void abort(const std::string& why) noexcept {
    in_.abort(why);
    out_.abort(why);
  }

  /// Leaves the job normally, on both transports.
  void leave() noexcept {
    in_.leave();
    out_.leave();
  }

  /// Splits (core/split_plan.hpp): Inter splits as it does (its offer is the blob); the new
  /// communicator's ranks on this node get a node transport of their own, split from this
  /// node's (Intra needs no offer: shm, inproc).
  split_offer prepare_split()
    requires requires(Inter& t) { t.prepare_split(); }
  {
    return out_.prepare_split();
  }
  two_level split(const split_plan& p, split_offer&& offer) {
    Inter out = out_.split(p, std::move(offer));
    node_map nm = nodes_.restricted(p.members);
    const int j = nm.node_of[std::size_t(p.rank)];
    split_plan lp;
    lp.id = p.id + ".node" + std::to_string(nodes_.node_of[std::size_t(rank())]);
    lp.timeout = p.timeout;
    for (int m : nm.members[std::size_t(j)]) lp.members.push_back(nodes_.local_of[std::size_t(p.members[std::size_t(m)])]);
    lp.rank = nm.local_of[std::size_t(p.rank)];
    lp.size = int(lp.members.size());
    lp.offers.resize(lp.members.size());
    Intra in = in_.split(lp, in_.prepare_split());
    return two_level(std::move(in), std::move(out), std::move(nm));
  }

  /// communicator::shrink (core/split_plan.hpp): the survivors agree over Inter, which reaches
  /// every rank, on who goes on; then over Intra each node's survivors meet in a node transport
  /// of their own (its own shrink: a revoked shm segment makes no split). The two must name the
  /// same ranks on this node; they differ only when a rank dies between the two, and then this
  /// fails, naming both lists, as a shrink that loses a rank while it decides does.
  two_level shrink(const shrink_request& q, std::vector<int>& members)
    requires requires(Inter& t, Intra& i, std::vector<int>& m) {
      { t.shrink(q, m) } -> std::same_as<Inter>;
      { i.shrink(q, m) } -> std::same_as<Intra>;
    }
  {
    Inter out = out_.shrink(q, members);
    std::vector<int> on_node;
    Intra in = in_.shrink(q, on_node);
    node_map nm = nodes_.restricted(members);
    const int me = int(std::find(members.begin(), members.end(), rank()) - members.begin());
    std::vector<int> want;
    for (int m : nm.members[std::size_t(nm.node_of[std::size_t(me)])]) want.push_back(nodes_.local_of[std::size_t(members[std::size_t(m)])]);
    if (on_node != want) {
      auto list = [](const std::vector<int>& v) {
        std::string t;
        for (int x : v) t += (t.empty() ? "" : ", ") + std::to_string(x);
        return "{" + t + "}";
      };
      throw error(errc::peer_lost, q.what + ": this node's survivors, local ranks " + list(on_node) +
                                       ", are not the job's survivors on it, " + list(want) + " (a rank was lost while the shrink decided)");
    }
    return two_level(std::move(in), std::move(out), std::move(nm));
  }

  /// Every rank's node key (COLLX_NODE, else the host name), gathered over `out`: the node map;
  /// and the job's name, `job` where given, else rank 0's (drawn there, see connect).
  struct setup_keys {
    node_map nodes;
    std::string job;
  };
  static setup_keys gather_nodes(Inter& out, const std::string& job = {}) {
    struct key {
      std::array<char, 64> node{};
      std::array<char, 64> job{};  // (rank 0's is everyone's)
    };
    key mine{};
    const std::string k = node_key();
    std::memcpy(mine.node.data(), k.data(), std::min(k.size(), mine.node.size() - 1));
    const int n = out.size(), r = out.rank();
    if (job.empty() && r == 0) {
      const std::string drawn = draw_job_name();
      std::memcpy(mine.job.data(), drawn.data(), std::min(drawn.size(), mine.job.size() - 1));
    }
    std::vector<key> all(static_cast<std::size_t>(n));
    all[std::size_t(r)] = mine;
    std::vector<send_desc> s;
    std::vector<recv_desc> v;
    for (int q = 0; q < n; ++q) {
      if (q == r) continue;
      s.push_back({q, reinterpret_cast<const std::byte*>(&mine), sizeof(key)});
      v.push_back({q, reinterpret_cast<std::byte*>(&all[std::size_t(q)]), sizeof(key), nullptr, combine::copy});
    }
    const call_info call = setup_call("node_map", sizeof(key), job, r);
    if (n > 1) out.exchange(s, v, exchange_context{&call, {}, false});
    return {node_map::from_keys(n, [&](int q) { return std::string(all[std::size_t(q)].node.data()); }),
            job.empty() ? std::string(all[0].job.data()) : job};
  }
  /// A job name no other job on these hosts has: the host, the process and 64 random bits.
  static std::string draw_job_name() {
    char h[64] = {};
    ::gethostname(h, sizeof h - 1);
    std::random_device rd;
    const unsigned long long bits = (static_cast<unsigned long long>(rd()) << 32) ^ rd();
    char name[64];
    std::snprintf(name, sizeof name, "tl-%.20s-%d-%016llx", h, int(::getpid()), bits);
    return name;
  }
  /// A message of the setup over Inter (the node map, the topology), `bytes` from each sender.
  static call_info setup_call(const char* what, std::size_t bytes, const std::string& job, int rank) {
    call_info call;
    detail::set_name(call.sig.collective, what);
    detail::set_name(call.sig.policy, "direct");
    call.sig.count = bytes;
    call.sig.elem_size = 1;
    call.sig.op_hash = detail::fnv1a(job);
    call.rank = rank;
    call.timeout = detail::default_timeout();
    return call;
  }
  /// This process's node: COLLX_NODE where set, else its host name.
  static std::string node_key() {
    if (std::string k = detail::env_string("COLLX_NODE"); !k.empty()) return k;
    char h[256] = {};
    ::gethostname(h, sizeof h - 1);
    return h;
  }

  /// Ranks from the launcher's variables (tcp's from_env: torchrun, mpirun, srun), the node map
  /// gathered over Inter, then each node's transport: Intra(job + ".node<j>", local rank, L).
  template <class InterConfig = config_of<Inter>, class IntraConfig = config_of<Intra>>
  static two_level from_env(InterConfig out_cfg = {}, IntraConfig in_cfg = {}) {
    const launch_info li = launch_info_from_env();
    return connect(Inter::from_env(std::move(out_cfg)), li.job, in_cfg);
  }
  /// The node map gathered over `out`, this rank placed on its NUMA domain (see the top), then
  /// each node's transport; COLLX_TOPO_DUMP written. `job` names what the ranks share (each
  /// node's segment: job + ".node<j>"); left empty, rank 0 draws a name and hands it out with
  /// the node map, as a job launched by MPICH's mpiexec needs (its environment names no job).
  template <class IntraConfig = config_of<Intra>>
  static two_level connect(Inter out, const std::string& job_given = {}, IntraConfig in_cfg = {}) {
    auto [nm, job] = gather_nodes(out, job_given);
    const int r = out.rank(), j = nm.node_of[std::size_t(r)], l = nm.local_of[std::size_t(r)];
    const int L = int(nm.members[std::size_t(j)].size());
    const machine here = read_machine();
    if (detail::env_int("COLLX_PIN", 0ll, 1ll, 1ll) == 1 && !here.pinned() && here.numa.size() > 1)
      pin_to_domain(here, here.domain_of(l, L));
    if (const std::string path = detail::env_string("COLLX_TOPO_DUMP"); !path.empty()) dump_topology(out, nm, here, path, job);
    Intra in(job + ".node" + std::to_string(j), l, L, in_cfg);
    return two_level(std::move(in), std::move(out), std::move(nm));
  }

  /// COLLX_TOPO_DUMP: every node's local rank 0 sends its machine (JSON, at most 16 KiB) to
  /// rank 0 over `out`, which writes the job's topology to `path`.
  static void dump_topology(Inter& out, const node_map& nm, const machine& here, const std::string& path, const std::string& job) {
    using block = std::array<char, 16384>;
    const int r = out.rank(), M = nm.nodes();
    std::vector<block> got(static_cast<std::size_t>(M));
    block mine{};
    const std::string js = to_json(here);
    std::memcpy(mine.data(), js.data(), std::min(js.size(), mine.size() - 1));
    std::vector<send_desc> s;
    std::vector<recv_desc> v;
    for (int k = 0; k < M; ++k) {
      const int lead = nm.members[std::size_t(k)].front();
      if (lead == r && r == 0) got[std::size_t(k)] = mine;
      else if (lead == r) s.push_back({0, reinterpret_cast<const std::byte*>(mine.data()), sizeof(block)});
      else if (r == 0) v.push_back({lead, reinterpret_cast<std::byte*>(got[std::size_t(k)].data()), sizeof(block), nullptr, combine::copy});
    }
    const call_info call = setup_call("topology", sizeof(block), job, r);
    if (!s.empty() || !v.empty()) out.exchange(s, v, exchange_context{&call, {}, false});
    if (r != 0) return;
    std::ofstream f(path);
    if (!f) throw error(errc::invalid_argument, "COLLX_TOPO_DUMP: cannot write " + path);
    f << "{\"ranks\": " << nm.size() << ", \"within\": \"" << Intra::name << "\", \"between\": \"" << Inter::name
      << "\", \"nodes\": [";
    for (int k = 0; k < M; ++k) {
      f << (k ? ", " : "") << "{\"node\": " << k << ", \"ranks\": [";
      for (std::size_t i = 0; i < nm.members[std::size_t(k)].size(); ++i) f << (i ? ", " : "") << nm.members[std::size_t(k)][i];
      f << "], \"machine\": " << got[std::size_t(k)].data() << "}";
    }
    f << "]}\n";
  }

 private:
  static int index_of(const std::vector<int>& v, int x) {
    for (std::size_t i = 0; i < v.size(); ++i)
      if (v[i] == x) return int(i);
    return 0;
  }
  /// The call as this node's transport sees it: ranks numbered on the node, named as here.
  call_info on_node(const call_info& c) const {
    call_info s;
    s.sig = c.sig;
    s.rank = nodes_.local_of[std::size_t(c.rank)];
    s.comm = c.comm;
    s.timeout = c.timeout;
    s.call_timeout = c.call_timeout;
    s.first_wait = c.first_wait;
    s.synchronous = c.synchronous;
    s.rec = c.rec;
    s.board = c.board;
    s.up = node_ranks().data();
    return s;
  }

  Intra in_;
  Inter out_;
  node_map nodes_;
  std::vector<send_desc> ls_, os_;  // a mixed step's sends on the node and across (reused)
  std::vector<recv_desc> lr_, or_;
  std::vector<std::uint8_t> side_;   // each receive's side (0: on the node) and index there,
  std::vector<std::uint32_t> index_;  // to build order_ from
  engine::cross_order order_;
};

}  // namespace collx::transport
