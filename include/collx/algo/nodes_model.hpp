#pragma once
// The cost model on two levels (algo/model.hpp is the model of one): a communicator laid out on
// nodes (transport::two_level, core/topology.hpp's node_map) has two kinds of link, each with its
// own α, β, γ, δ: between ranks of one node (Intra's calibration: shared memory) and between
// nodes (Inter's: tcp, mpi). The flat policies and algo::two_level are charged from every rank's
// schedule, as the one-level model charges them, with the links told apart:
//
//   on the common timeline a step costs   max(node part, network part) + γ · reduced
//     node part     the most one rank moves to and from its node-mates in the step, at the
//                   node's α, β, δ (step_seconds);
//     network part  the most one node moves to and from the other nodes in the step, all of
//                   its ranks' messages together (they share the node's link), at the
//                   network's α, β, δ;
//     reduced       the most bytes one rank reduces in the step, at the node's γ;
//   and a step in which a rank waits on both levels at once pays one more α of the network's:
//   no one doorbell rings for both (engine::exchange_pair naps on each in turn), so a message on
//   one is seen a nap late (measured between namespaces: a pairwise all_gather of 32 B, one
//   step of messages to both levels, took 232 us, where two steps of one level each took 64).
//
// algo::automatic on such a communicator takes the least predicted time among the flat policies
// that have a schedule for the call and two_level (collectives/common.hpp), per call shape, as
// it does on one level. The walk builds every rank's schedule of every candidate: O(N · steps),
// once per shape (a decision is kept), only on communicators laid out on several nodes, and only
// up to kMaxRanksWalked ranks.
#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "../core/topology.hpp"
#include "model.hpp"
#include "two_level.hpp"

namespace collx::model {

/// The two levels' parameters.
struct levels {
  params node;  // between ranks of one node
  params net;   // between nodes, per node (its ranks share its link)
};

/// Whether algo::two_level has a schedule for collective c with an op of this commutativity.
constexpr bool two_level_supports(collective c, bool commutative) {
  switch (c) {
    case collective::all_reduce:
    case collective::reduce_scatter:
    case collective::reduce: return commutative;
    case collective::all_gather:
    case collective::broadcast: return true;
    default: return false;
  }
}

/// Every rank's schedule of algo::two_level for pr over nm (empty where it has none), each rank's
/// problem as the one-level model builds it (algo/schedule_of.hpp).
inline std::vector<schedule> two_level_schedules(const problem& pr, const node_map& nm) {
  std::vector<schedule> v;
  if (!two_level_supports(pr.coll, pr.commutative)) return v;
  if (pr.count == 0) return std::vector<schedule>(std::size_t(pr.n));  // zero elements: nothing runs
  const algo::two_level a;
  auto build = [&](const auto& q) -> schedule {
    if constexpr (requires { a.all_reduce(q, nm); }) return a.all_reduce(q, nm);
    else if constexpr (requires { a.reduce_scatter(q, nm); }) return a.reduce_scatter(q, nm);
    else if constexpr (requires { a.all_gather(q, nm); }) return a.all_gather(q, nm);
    else if constexpr (requires { a.broadcast(q, nm); }) return a.broadcast(q, nm);
    else if constexpr (requires { a.reduce(q, nm); }) return a.reduce(q, nm);
    else return schedule{};
  };
  algo::visit_collective(pr.coll, [&]<collective C>() {
    for (int r = 0; r < pr.n; ++r) algo::schedule_of<C>::with_problem(r, pr.shape(), [&](const auto& q) { v.push_back(build(q)); });
  });
  return v;
}

/// Bytes each node sends to other nodes in the schedules `all` (elements of `elem` bytes).
inline std::vector<std::uint64_t> bytes_between_nodes(std::span<const schedule> all, const node_map& nm, std::size_t elem) {
  std::vector<std::uint64_t> by_node(std::size_t(nm.nodes()), 0);
  for (int r = 0; r < int(all.size()); ++r)
    for (const send_op& x : all[std::size_t(r)].sends())
      if (!nm.same_node(r, x.peer)) by_node[std::size_t(nm.node_of[std::size_t(r)])] += x.src.count * elem;
  return by_node;
}

/// The predicted time of the schedules `all` (every rank's) on nm (see the top). Memory: a few
/// numbers per step and node, never per step and rank.
inline double predict_on_nodes(std::span<const schedule> all, const node_map& nm, std::size_t elem, const levels& p) {
  const int T = timeline(all);
  if (T == 0) return 0;
  const std::size_t steps = static_cast<std::size_t>(T), M = std::size_t(nm.nodes());
  std::vector<double> node_part(steps, 0.0);             // the busiest rank's step on its node
  std::vector<std::uint64_t> reduced(steps, 0);          // the most bytes one rank reduces
  std::vector<char> both(steps, 0);                      // a rank waited on both levels
  std::vector<std::uint64_t> sent(steps * M, 0), received(steps * M, 0);  // per step and node, across
  auto seconds = [](const params& q, std::uint64_t out, std::uint64_t in) {
    return step_seconds(q, algo::step_load{1, std::max(out, in), std::min(out, in), 0, 1});
  };
  for (std::size_t r = 0; r < all.size(); ++r) {
    const schedule& s = all[r];
    const std::size_t j = std::size_t(nm.node_of[r]);
    for (const step& st : s.steps()) {
      if (st.time < 0 || st.time >= T) continue;
      const std::size_t t = std::size_t(st.time);
      std::uint64_t out = 0, in = 0, red = 0, far = 0;
      for (auto i = st.sends_begin; i < st.sends_end; ++i) {
        const send_op& x = s.sends()[i];
        (nm.same_node(int(r), x.peer) ? out : sent[t * M + j]) += x.src.count * elem;
        far += nm.same_node(int(r), x.peer) ? 0 : 1;
      }
      for (auto i = st.recvs_begin; i < st.recvs_end; ++i) {
        const recv_op& x = s.recvs()[i];
        (nm.same_node(int(r), x.peer) ? in : received[t * M + j]) += x.dst.count * elem;
        far += nm.same_node(int(r), x.peer) ? 0 : 1;
        if (x.how != combine::copy) red += x.dst.count * elem;
      }
      const bool near = (st.sends_end - st.sends_begin) + (st.recvs_end - st.recvs_begin) > far;
      if (near) node_part[t] = std::max(node_part[t], seconds(p.node, out, in));
      if (near && far > 0) both[t] = 1;
      reduced[t] = std::max(reduced[t], red);
    }
  }
  double total = 0;
  for (std::size_t t = 0; t < steps; ++t) {
    double net = 0;
    for (std::size_t j = 0; j < M; ++j)
      if (sent[t * M + j] + received[t * M + j] > 0) net = std::max(net, seconds(p.net, sent[t * M + j], received[t * M + j]));
    total += std::max(node_part[t], net) + (both[t] ? p.net.alpha : 0.0) + p.node.gamma * double(reduced[t]);
  }
  return total;
}

/// A candidate on nodes: a flat policy (its choice) or two_level (`two_level` true).
struct node_candidate {
  choice policy{};
  bool two_level = false;
  double seconds = 0;
  std::uint64_t between_nodes = 0;  // bytes the busiest node sends to other nodes
};

/// Every flat policy that can run pr, and two_level where it can, with predicted times on nm.
inline std::vector<node_candidate> evaluate_on_nodes(const problem& pr, const node_map& nm, const levels& p) {
  std::vector<node_candidate> v;
  auto add = [&](std::vector<schedule> all, node_candidate c) {
    if (all.empty()) return;
    c.seconds = predict_on_nodes(all, nm, pr.elem, p);
    for (std::uint64_t b : bytes_between_nodes(all, nm, pr.elem)) c.between_nodes = std::max(c.between_nodes, b);
    v.push_back(c);
  };
  for (choice q : all_policies)
    if (supports(q, pr.coll, pr.commutative)) add(schedules(q, pr), {q, false});
  add(two_level_schedules(pr, nm), {choice{}, true});
  return v;
}

/// Above this many ranks the walk (every rank's schedule of every candidate) is not made: two_level
/// runs where it has a schedule (it sends the fewest bytes between nodes), else the one-level
/// model's pick with the network's parameters.
inline constexpr int kMaxRanksWalked = 256;

/// The candidate with the least predicted time; two_level wins a tie (between namespaces, at
/// 32 KiB, recursive halving's all_gather dealt out round robin ties it in the model, with the
/// same bytes between nodes and the same steps, and took 295 us against its 139).
inline node_candidate best_on_nodes(const problem& pr, const node_map& nm, const levels& p) {
  if (pr.n > kMaxRanksWalked) {
    if (two_level_supports(pr.coll, pr.commutative)) return {choice{}, true};
    return {best(pr, p.net), false};
  }
  const auto v = evaluate_on_nodes(pr, nm, p);
  if (v.empty()) return {algo::choice_of<algo::pairwise>, false};
  const node_candidate* b = &v.back();  // two_level where it has a schedule (evaluate_on_nodes puts it last)
  for (const node_candidate& x : v)
    if (x.seconds < b->seconds * (1 - 1e-6)) b = &x;
  return *b;
}

}  // namespace collx::model
