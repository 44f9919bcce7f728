#pragma once
// algo::two_level — node-aware all-reduce: most bytes stay on the node.
//
// With M nodes of L ranks (core/topology.hpp: node_map), the buffer of D bytes is cut into S
// shards, S = the most ranks any node has; on node j, shard s belongs to local rank s mod L_j
// (one shard each when nodes are even: the local ranks own the shards in turn).
//
//   1. reduce-scatter on the node: every local rank sends each other one the shards it owns, and
//      sums the L-1 it receives into its own (one step, every pair at once: shared memory);
//   2. all-reduce of each shard across the nodes, among its owners, one per node (its "rail":
//      every local rank drives its own, so all of a node's links to the network are busy):
//      ring for a shard above 64 KiB, recursive doubling below;
//   3. all-gather on the node: each local rank sends its shards to the others (one step).
//
// A buffer above 2 MiB runs as a pipeline of up to 8 segments: segment k's step i runs in step
// k + i, so while one segment crosses between nodes the next is reduced on the node and the one
// before gathered (steps with peers on both levels: transport/two_level.hpp runs them on both).
//
// Bytes between nodes: each rank sends 2(M-1)/M · D/L on its rail, so a node sends
// 2(M-1)/M · D in all — the flat ring's N-rank cycle crosses between nodes on at least M links,
// each carrying 2(N-1)/N · D (and on every link when ranks are numbered round-robin over nodes).
// Steps: 1 + 2(M-1) + 1 (ring on the rail) or 1 + log2 M (+2 folding) + 1.
//   T ≈ 2·α_node + 2(M-1)·α_net + 2(L-1)/L·D·β_node + 2(M-1)/M·D/L·β_net + reductions.
//
// The sum of a shard is taken on the node in arrival order, then across nodes in ring order: a
// non-commutative op is refused at compile time. On one node (or one rank per node) it is the
// node's reduce-scatter and all-gather (or the rail's all-reduce) alone.
#include <algorithm>
#include <cstddef>
#include <optional>
#include <vector>

#include "../core/concepts.hpp"
#include "../core/topology.hpp"
#include "compose.hpp"
#include "problem.hpp"
#include "recursive_doubling.hpp"
#include "ring.hpp"

namespace collx::algo {

struct two_level {
  using algorithm_policy_concept = algorithm_policy_tag;
  static constexpr const char* name = "two_level";
  static constexpr bool keeps_rank_order = false;
  /// A shard of at most this many bytes crosses between nodes by recursive doubling (log2 M
  /// steps), a larger one by the ring (2(M-1) steps, bandwidth-optimal).
  static constexpr std::size_t doubling_bytes = 64 * 1024;

  /// A buffer of more than this many bytes is cut into segments (at most kMaxSegments, each at
  /// least this large) that run as a pipeline: while one segment crosses between nodes, the
  /// next is reduced on the node and the one before gathered on it (its steps share a step).
  static constexpr std::size_t segment_bytes = std::size_t(2) << 20;
  static constexpr int kMaxSegments = 8;

  schedule all_reduce(const ar_problem& p, const node_map& nm) const {
    const std::size_t bytes = p.count * p.elem_size;
    const int S = nm.widest();
    int K = int(std::min<std::size_t>(kMaxSegments, std::max<std::size_t>(1, bytes / segment_bytes)));
    // (only where every segment's shards cross by the ring: recursive doubling's scratch is one
    // for the whole call, and small shards gain nothing from a pipeline)
    if (bytes / std::size_t(K) / std::size_t(S) <= doubling_bytes) K = 1;
    if (bytes <= small_bytes) return small(p, nm);
    if (K == 1) return segment(p, nm, 0, p.count);
    const partition seg(p.count, K);
    std::vector<schedule> parts;
    for (int k = 0; k < K; ++k) parts.push_back(segment(p, nm, seg.offset(k), seg.count(k)));
    // Segment k's step i runs at time k + i: each step holds one step of several segments,
    // each in its own memory, in the same order on every rank.
    schedule s;
    std::vector<int> identity(static_cast<std::size_t>(p.size));
    for (int r = 0; r < p.size; ++r) identity[std::size_t(r)] = r;
    std::size_t tmp = 0;  // each segment's scratch apart from the others'
    for (const schedule& x : parts) tmp = std::max(tmp, x.tmp_elems());
    std::vector<part> ps;
    for (int k = 0; k < K; ++k) ps.push_back({&parts[std::size_t(k)], &identity, 0, std::size_t(k) * tmp, k});
    side_by_side(s, ps);
    return s;
  }

  /// A buffer of at most this many bytes: the whole buffer reduced on the node by recursive
  /// doubling, then across the nodes by recursive doubling among the ranks of each rail:
  /// log2 L + log2 M steps, no gather on the node after (a wakeup saved: the latency that
  /// counts at this size).
  static constexpr std::size_t small_bytes = 4096;

  schedule small(const ar_problem& p, const node_map& nm) const {
    schedule s;
    const int me = p.rank, j = nm.node_of[std::size_t(me)], l = nm.local_of[std::size_t(me)];
    const std::vector<int>& node = nm.members[std::size_t(j)];
    const int L = int(node.size()), S = nm.widest(), M = nm.nodes();
    const region out{buf::out, 0, p.count};
    // 1. The node's sum by recursive doubling among its ranks (one step for two ranks; every
    //    rank of the node then holds the same bits).
    const schedule x = recursive_doubling{}.all_reduce(ar_problem{l, L, p.count, p.elem_size, p.commutative, p.src});
    for (std::size_t i = 0; i < x.steps().size(); ++i) {
      s.next_step();
      append_step(s, x, i, node, 0, 0);
    }
    s.need_tmp(x.tmp_elems());
    // 2. Across the nodes: recursive doubling on each rail this rank is on (rail i: the local
    //    rank i mod L of each node, i < S), side by side.
    if (M > 1) {
      std::vector<schedule> rails;
      std::vector<std::vector<int>> ranks;
      std::size_t steps = 0;
      for (int i = 0; i < S; ++i) {
        if (i % L != l) continue;
        std::vector<int> rail = rail_of(nm, i);
        rails.push_back(recursive_doubling{}.all_reduce(ar_problem{j, M, p.count, p.elem_size, p.commutative, buf::out}));
        ranks.push_back(std::move(rail));
        steps = std::max(steps, rails.back().steps().size());
      }
      // A rank on several rails (a node narrower than the widest) reduces into `out` on the
      // first; each other one runs on a copy of the node's sum in scratch, for its partners.
      const std::size_t t = rails.front().tmp_elems() + p.count, t0 = x.tmp_elems();
      s.need_tmp(t0 + rails.size() * t);
      for (std::size_t i = 0; i < steps; ++i) {
        s.next_step();
        for (std::size_t m = 0; m < rails.size(); ++m) {
          const std::size_t base = t0 + m * t;  // rail m's scratch: its copy (m > 0), then its RD's
          if (i == 0 && m > 0) s.copy({buf::tmp, base, p.count}, out);
          if (i < rails[m].steps().size())
            append_step(s, rails[m], i, ranks[m], 0, base + p.count, m > 0 ? std::optional<std::size_t>(base) : std::nullopt);
        }
      }
    }
    return s;
  }

  /// The three phases over elements [off, off + count) of the buffer.
  schedule segment(const ar_problem& p, const node_map& nm, std::size_t off, std::size_t count) const {
    schedule s;
    const int me = p.rank, j = nm.node_of[std::size_t(me)], l = nm.local_of[std::size_t(me)];
    const std::vector<int>& node = nm.members[std::size_t(j)];
    const int L = int(node.size()), S = nm.widest(), M = nm.nodes();
    const partition shards(count, S);
    auto mine = [&](int sh) { return sh % L == l; };
    auto shard = [&](buf b, int sh) { return region{b, off + shards.offset(sh), shards.count(sh)}; };

    // 1. Reduce-scatter on the node.
    s.next_step();
    for (int q = 0; q < L; ++q)
      for (int sh = 0; sh < S; ++sh)
        if (q != l && sh % L == q && shards.count(sh) != 0) s.send(node[std::size_t(q)], shard(p.src, sh));
    for (int sh = 0; sh < S; ++sh) {
      if (!mine(sh) || shards.count(sh) == 0) continue;
      bool first = true;
      for (int q = 0; q < L; ++q) {
        if (q == l) continue;
        s.recv(node[std::size_t(q)], shard(buf::out, sh), shard(first ? p.src : buf::out, sh), combine::received_left);
        first = false;
      }
      if (first) s.copy(shard(buf::out, sh), shard(p.src, sh));
    }

    // 2. All-reduce of each shard this rank owns, across the nodes, among its owners: a rank
    //    that owns several (a node narrower than the widest) runs their rails side by side,
    //    step i of each in one step, so every rank's phase has the same steps (a pipeline's
    //    segments then meet each peer in the same order on both sides).
    if (M > 1) {
      std::vector<schedule> rails;
      std::vector<std::vector<int>> ranks;
      std::vector<std::size_t> at;
      for (int sh = 0; sh < S; ++sh) {
        if (!mine(sh) || shards.count(sh) == 0) continue;
        std::vector<int> rail = rail_of(nm, sh);
        const ar_problem q{j, M, shards.count(sh), p.elem_size, p.commutative, buf::out};
        rails.push_back(shards.count(sh) * p.elem_size <= doubling_bytes ? recursive_doubling{}.all_reduce(q)
                                                                         : composed_segment(ring{}, q));
        ranks.push_back(std::move(rail));
        at.push_back(off + shards.offset(sh));
      }
      std::size_t tmp = 0;  // each rail's scratch apart from the others'
      std::vector<part> ps;
      for (std::size_t m = 0; m < rails.size(); ++m) {
        ps.push_back({&rails[m], &ranks[m], at[m], tmp, 0});
        tmp += rails[m].tmp_elems();
      }
      s.next_step();  // (the rails start after the node's step)
      side_by_side(s, ps);
    }

    // 3. All-gather on the node.
    s.next_step();
    for (int q = 0; q < L; ++q) {
      if (q == l) continue;
      for (int sh = 0; sh < S; ++sh)
        if (mine(sh) && shards.count(sh) != 0) s.send(node[std::size_t(q)], shard(buf::out, sh));
      for (int sh = 0; sh < S; ++sh)
        if (sh % L == q && shards.count(sh) != 0) s.recv(node[std::size_t(q)], shard(buf::out, sh));
    }
    return s;
  }

  /// A schedule x of ranks 0..k-1 to run beside others: its rank r is ranks[r] here, its in and
  /// out regions `offset` elements on, its scratch `tmp_offset` on, its step i in step shift + i.
  struct part {
    const schedule* x;
    const std::vector<int>* ranks;
    std::size_t offset, tmp_offset;
    int shift;
  };
  /// Appends the parts side by side after s: step t holds step t - shift of each part, the parts
  /// in their order (every rank lists its parts alike, so each pair of ranks meets in one order).
  static void side_by_side(schedule& s, const std::vector<part>& parts) {
    int end = 0;
    std::size_t tmp = 0;
    for (const part& q : parts) {
      end = std::max(end, q.shift + int(q.x->steps().size()));
      tmp = std::max(tmp, q.tmp_offset + q.x->tmp_elems());
    }
    s.need_tmp(tmp);
    for (int t = 0; t < end; ++t) {
      if (t > 0) s.next_step();
      for (const part& q : parts)
        if (const int i = t - q.shift; i >= 0 && i < int(q.x->steps().size()))
          append_step(s, *q.x, std::size_t(i), *q.ranks, q.offset, q.tmp_offset);
    }
  }

  /// Shard sh's rail: its owner on each node (the local rank sh mod L there), in node order.
  static std::vector<int> rail_of(const node_map& nm, int sh) {
    std::vector<int> rail;
    for (const auto& there : nm.members) rail.push_back(there[std::size_t(sh) % there.size()]);
    return rail;
  }

  /// Adds step i of schedule x (of ranks 0..k-1) to the last step of s, its rank r being
  /// ranks[r] here, its in and out regions moved `offset` elements on and its scratch `tmp_offset`.
  /// With `out_at`, x's output is scratch from there on instead.
  static void append_step(schedule& s, const schedule& x, std::size_t i, const std::vector<int>& ranks, std::size_t offset,
                          std::size_t tmp_offset, std::optional<std::size_t> out_at = std::nullopt) {
    auto at = [&](region r) {
      if (r.b == buf::out && out_at) r = {buf::tmp, r.offset + *out_at, r.count};
      else if (r.b == buf::in || r.b == buf::out) r.offset += offset;
      else if (r.b == buf::tmp) r.offset += tmp_offset;
      return r;
    };
    const step& st = x.steps()[i];
    for (auto c = st.copies_begin; c < st.copies_end; ++c) s.copy(at(x.copies()[c].dst), at(x.copies()[c].src));
    for (auto c = st.sends_begin; c < st.sends_end; ++c) s.send(ranks[std::size_t(x.sends()[c].peer)], at(x.sends()[c].src));
    for (auto c = st.recvs_begin; c < st.recvs_end; ++c) {
      const recv_op& r = x.recvs()[c];
      s.recv(ranks[std::size_t(r.peer)], at(r.dst), r.how == combine::copy ? r.with : at(r.with), r.how);
    }
  }
};

}  // namespace collx::algo
