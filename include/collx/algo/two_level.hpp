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
#include <utility>
#include <vector>

#include "../core/concepts.hpp"
#include "../core/topology.hpp"
#include "compose.hpp"
#include "problem.hpp"
#include "recursive_doubling.hpp"
#include "ring.hpp"
#include "tree.hpp"

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
    for (int k = 0; k < K; ++k) ps.push_back({&parts[std::size_t(k)], &identity, placement::shifted(0, std::size_t(k) * tmp), k});
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
    const int L = int(node.size()), M = nm.nodes();
    const region out{buf::out, 0, p.count};
    // 1. The node's sum by recursive doubling among its ranks (one step for two ranks; every
    //    rank of the node then holds the same bits).
    const schedule x = recursive_doubling{}.all_reduce(ar_problem{l, L, p.count, p.elem_size, p.commutative, p.src});
    beside(s, {x}, {node}, {placement{}});
    // 2. Across the nodes: recursive doubling on each rail this rank is on (rail i: the local
    //    rank i mod L of each node, i < S), side by side.
    if (M > 1) {
      std::vector<schedule> rails;
      std::vector<std::vector<int>> ranks;
      std::vector<placement> where;
      // A rank on several rails (a node narrower than the widest) reduces into `out` on the
      // first; each other one runs on a copy of the node's sum in scratch, for its partners.
      s.next_step();  // (the copies come after the node's sum, in the rails' first step)
      std::size_t base = x.tmp_elems();
      for (int i : rails_of(nm, me)) {
        rails.push_back(recursive_doubling{}.all_reduce(ar_problem{j, M, p.count, p.elem_size, p.commutative, buf::out}));
        ranks.push_back(rail_of(nm, i));
        if (where.empty()) {
          where.push_back(placement{});
        } else {
          s.copy({buf::tmp, base, p.count}, out);
          where.push_back({buf::in, buf::tmp, 0, base, 0});
          base += p.count;
        }
      }
      beside(s, rails, ranks, where, base);  // (its next step is this one: a step of copies alone merges)
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
      std::vector<placement> where;
      for (int sh = 0; sh < S; ++sh) {
        if (!mine(sh) || shards.count(sh) == 0) continue;
        const ar_problem q{j, M, shards.count(sh), p.elem_size, p.commutative, buf::out};
        rails.push_back(shards.count(sh) * p.elem_size <= doubling_bytes ? recursive_doubling{}.all_reduce(q)
                                                                         : composed_segment(ring{}, q));
        ranks.push_back(rail_of(nm, sh));
        where.push_back(placement::shifted(off + shards.offset(sh)));
      }
      beside(s, rails, ranks, where);  // (after the node's step)
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

  // ---- reduce_scatter, all_gather, broadcast, reduce ----------------------------------------
  //
  // Rank b's block is carried on node j by the local rank (l_b mod L_j), l_b being b's place on
  // its own node: on b's node that is b itself. Rail i (i < the widest node) is the local rank
  // (i mod L_j) of each node j, and carries the blocks of the ranks whose place is i.

  /// Reduce-scatter: the node's partial sum of every block gathered at its carrier (one step on
  /// the node), then a ring reduce-scatter on each rail (M-1 steps) leaves each block's sum at
  /// its owner. Bytes between nodes: (M-1)/M · D per node (D: the whole input), the flat ring's
  /// (N-1)/N · D on each link it crosses.
  schedule reduce_scatter(const rs_problem& p, const node_map& nm) const {
    schedule s;
    const int N = p.size, me = p.rank, j = nm.node_of[std::size_t(me)], l = nm.local_of[std::size_t(me)];
    const std::vector<int>& node = nm.members[std::size_t(j)];
    const int L = int(node.size()), M = nm.nodes();
    auto carrier = [&](int b) { return nm.local_of[std::size_t(b)] % L; };  // on this node
    auto count = [&](int b) { return p.blocks.count(b); };
    // Where each block this rank carries is summed: its own at the result, the others in the
    // work buffer's layout or in scratch; `val` is where each block's value is now.
    std::vector<region> store(static_cast<std::size_t>(N)), val(static_cast<std::size_t>(N));
    std::size_t tmp = 0;
    for (int b = 0; b < N; ++b) {
      val[std::size_t(b)] = p.block(p.src, b);
      if (carrier(b) != l) continue;
      if (b == me) store[std::size_t(b)] = p.result();
      else if (p.work != buf::none) store[std::size_t(b)] = p.block(p.work, b);
      else store[std::size_t(b)] = {buf::tmp, std::exchange(tmp, tmp + count(b)), count(b)};
    }
    s.need_tmp(tmp);
    // 1. On the node: each block to its carrier, summed there.
    if (L > 1) {
      s.next_step();
      for (int q = 0; q < L; ++q)
        for (int b = 0; b < N && q != l; ++b)
          if (carrier(b) == q && count(b) != 0) s.send(node[std::size_t(q)], p.block(p.src, b));
      for (int b = 0; b < N; ++b) {
        if (carrier(b) != l || count(b) == 0) continue;
        for (int q = 0; q < L; ++q)
          if (q != l) {
            s.recv(node[std::size_t(q)], store[std::size_t(b)], val[std::size_t(b)], combine::received_left);
            val[std::size_t(b)] = store[std::size_t(b)];
          }
      }
    }
    // 2. Across the nodes: a ring reduce-scatter on each rail of this rank, side by side (step st
    //    sends the partial of the block of node j-1-st's rank on the rail, and sums that of node
    //    j-2-st's into its own; the last step's is this rank's own block).
    const std::vector<int> rails = rails_of(nm, me);
    for (int st = 0; st + 1 < M; ++st) {
      s.next_step();
      for (int i : rails) {
        const std::vector<int> rail = rail_of(nm, i);
        const int sb = on_rail(nm, i, mod(j - 1 - st, M)), rb = on_rail(nm, i, mod(j - 2 - st, M));
        if (sb >= 0 && count(sb) != 0) s.send(rail[std::size_t(mod(j + 1, M))], val[std::size_t(sb)]);
        if (rb >= 0 && count(rb) != 0) {
          s.recv(rail[std::size_t(mod(j - 1, M))], store[std::size_t(rb)], val[std::size_t(rb)], combine::received_left);
          val[std::size_t(rb)] = store[std::size_t(rb)];
        }
      }
    }
    s.copy(p.result(), val[std::size_t(me)]);  // (one rank in all: its block as it is)
    return s;
  }

  /// All-gather: a ring all-gather on each rail (M-1 steps: every rail member then holds the
  /// blocks of the rail's ranks), then each local rank gives its node-mates the blocks it
  /// carries (one step). Bytes between nodes: (M-1)/M · D per node.
  schedule all_gather(const ag_problem& p, const node_map& nm) const {
    schedule s;
    const int N = p.size, me = p.actual(p.rank), j = nm.node_of[std::size_t(me)], l = nm.local_of[std::size_t(me)];
    const std::vector<int>& node = nm.members[std::size_t(j)];
    const int L = int(node.size()), M = nm.nodes();
    auto block = [&](int b) { return p.block(mod(b - p.base, N)); };  // rank b's block in out
    auto carrier = [&](int b) { return nm.local_of[std::size_t(b)] % L; };
    if (!p.in_place) s.copy(block(me), p.own());
    // 1. Across the nodes: a ring all-gather on each rail of this rank, side by side.
    const std::vector<int> rails = rails_of(nm, me);
    for (int st = 0; st + 1 < M; ++st) {
      s.next_step();
      for (int i : rails) {
        const std::vector<int> rail = rail_of(nm, i);
        const int sb = on_rail(nm, i, mod(j - st, M)), rb = on_rail(nm, i, mod(j - st - 1, M));
        if (sb >= 0 && block(sb).count != 0) s.send(rail[std::size_t(mod(j + 1, M))], sb == me ? p.own() : block(sb));
        if (rb >= 0 && block(rb).count != 0) s.recv(rail[std::size_t(mod(j - 1, M))], block(rb));
      }
    }
    // 2. On the node: each local rank's blocks to the others.
    if (L > 1) {
      s.next_step();
      for (int q = 0; q < L; ++q) {
        if (q == l) continue;
        for (int b = 0; b < N; ++b)
          if (carrier(b) == l && block(b).count != 0) s.send(node[std::size_t(q)], block(b));
        for (int b = 0; b < N; ++b)
          if (carrier(b) == q && block(b).count != 0) s.recv(node[std::size_t(q)], block(b));
      }
    }
    return s;
  }

  /// Broadcast. Small (at most small_bytes): a binomial tree among the root's rail, then one
  /// step on each node from its member of that rail. Larger: the root scatters the buffer's S
  /// shards on its node (one step), each shard crosses the nodes on its own rail (a binomial
  /// tree for a shard of at most doubling_bytes, else the pipelined chain), and each node's
  /// ranks exchange their shards (one step). Bytes into each node: D.
  schedule broadcast(const bcast_problem& p, const node_map& nm) const {
    schedule s;
    const int me = p.rank, j = nm.node_of[std::size_t(me)], l = nm.local_of[std::size_t(me)];
    const int j0 = nm.node_of[std::size_t(p.root)], l0 = nm.local_of[std::size_t(p.root)];
    const std::vector<int>& node = nm.members[std::size_t(j)];
    const int L = int(node.size()), S = nm.widest(), M = nm.nodes();
    if (p.count * p.elem_size <= small_bytes) {
      const int c = l0 % L;  // this node's rank on the root's rail
      if (l == c && M > 1) beside(s, {tree{}.broadcast(bcast_problem{j, M, j0, p.count, p.elem_size})}, {rail_of(nm, l0)}, {placement{}});
      if (L > 1) {
        s.next_step();
        for (int q = 0; q < L; ++q)
          if (l == c && q != c) s.send(node[std::size_t(q)], {buf::out, 0, p.count});
        if (l != c) s.recv(node[std::size_t(c)], {buf::out, 0, p.count});
      }
      return s;
    }
    const partition shards(p.count, S);
    auto shard = [&](int sh) { return region{buf::out, shards.offset(sh), shards.count(sh)}; };
    // 1. On the root's node: each shard to its carrier there.
    if (j == j0 && L > 1) {
      s.next_step();
      for (int sh = 0; sh < S; ++sh)
        if (shards.count(sh) != 0 && sh % L != l0) {
          if (me == p.root) s.send(node[std::size_t(sh % L)], shard(sh));
          else if (sh % L == l) s.recv(p.root, shard(sh));
        }
    }
    // 2. Each shard across the nodes on its rail, from its carrier on the root's node.
    std::vector<schedule> xs;
    std::vector<std::vector<int>> ranks;
    std::vector<placement> where;
    for (int sh = 0; sh < S && M > 1; ++sh) {
      if (sh % L != l || shards.count(sh) == 0) continue;
      const bcast_problem q{j, M, j0, shards.count(sh), p.elem_size};
      xs.push_back(shards.count(sh) * p.elem_size <= doubling_bytes ? tree{}.broadcast(q) : ring{}.broadcast(q));
      ranks.push_back(rail_of(nm, sh));
      where.push_back(placement::shifted(shards.offset(sh)));
    }
    beside(s, xs, ranks, where);
    // 3. On each node: each rank's shards to the others (the root has them all already).
    if (L > 1) {
      s.next_step();
      for (int q = 0; q < L; ++q) {
        if (q == l) continue;
        for (int sh = 0; sh < S; ++sh) {
          if (shards.count(sh) == 0) continue;
          if (sh % L == l && node[std::size_t(q)] != p.root) s.send(node[std::size_t(q)], shard(sh));
          if (sh % L == q && me != p.root) s.recv(node[std::size_t(q)], shard(sh));
        }
      }
    }
    return s;
  }

  /// Reduce. Small: each node's sum at its rank on the root's rail (one step), then a binomial
  /// tree on that rail to the root. Larger: a reduce-scatter of the buffer's S shards on each
  /// node (one step), each shard reduced across the nodes on its rail to its carrier on the
  /// root's node (binomial tree or pipelined chain), and those sent to the root (one step).
  schedule reduce(const reduce_problem& p, const node_map& nm) const {
    schedule s;
    const int me = p.rank, j = nm.node_of[std::size_t(me)], l = nm.local_of[std::size_t(me)];
    const int j0 = nm.node_of[std::size_t(p.root)], l0 = nm.local_of[std::size_t(p.root)];
    const std::vector<int>& node = nm.members[std::size_t(j)];
    const int L = int(node.size()), S = nm.widest(), M = nm.nodes();
    if (p.count * p.elem_size <= small_bytes) {
      const int c = l0 % L;
      // The node's sum: in scratch at its rail member (its input itself where it is alone).
      const region acc = L > 1 ? region{buf::tmp, 0, p.count} : region{buf::in, 0, p.count};
      if (L > 1) {
        s.need_tmp(p.count);
        s.next_step();
        if (l != c) s.send(node[std::size_t(c)], {buf::in, 0, p.count});
        bool first = true;
        for (int q = 0; q < L && l == c; ++q)
          if (q != c) {
            s.recv(node[std::size_t(q)], acc, first ? region{buf::in, 0, p.count} : acc, combine::received_left);
            first = false;
          }
      }
      if (l == c) {
        beside(s, {tree{}.reduce(reduce_problem{j, M, j0, p.count, p.elem_size, p.commutative})}, {rail_of(nm, l0)},
               {placement{acc.b, buf::out}}, L > 1 ? p.count : 0);
      }
      return s;
    }
    const partition shards(p.count, S);
    auto shard = [&](buf b, int sh) { return region{b, shards.offset(sh), shards.count(sh)}; };
    // Scratch: the node's sum of each shard this rank carries at acc, and (on the root's node,
    // but not at the root) the shard's total at res; then the rails' own.
    const bool root_node = j == j0, relay = root_node && me != p.root;
    std::size_t tmp = 0;
    std::vector<std::size_t> acc(static_cast<std::size_t>(S)), res(static_cast<std::size_t>(S));
    for (int sh = 0; sh < S; ++sh) {
      if (sh % L != l) continue;
      if (L > 1) acc[std::size_t(sh)] = std::exchange(tmp, tmp + shards.count(sh));
      if (relay) res[std::size_t(sh)] = std::exchange(tmp, tmp + shards.count(sh));
    }
    // 1. On the node: each shard to its carrier, summed there.
    if (L > 1) {
      s.next_step();
      for (int sh = 0; sh < S; ++sh) {
        if (shards.count(sh) == 0) continue;
        if (sh % L != l) {
          s.send(node[std::size_t(sh % L)], shard(buf::in, sh));
          continue;
        }
        bool first = true;
        const region a{buf::tmp, acc[std::size_t(sh)], shards.count(sh)};
        for (int q = 0; q < L; ++q)
          if (q != l) {
            s.recv(node[std::size_t(q)], a, first ? shard(buf::in, sh) : a, combine::received_left);
            first = false;
          }
      }
    }
    // 2. Each shard across the nodes on its rail, to its carrier on the root's node.
    std::vector<schedule> xs;
    std::vector<std::vector<int>> ranks;
    std::vector<placement> where;
    for (int sh = 0; sh < S; ++sh) {
      if (sh % L != l || shards.count(sh) == 0) continue;
      const reduce_problem q{j, M, j0, shards.count(sh), p.elem_size, p.commutative};
      xs.push_back(shards.count(sh) * p.elem_size <= doubling_bytes ? tree{}.reduce(q) : ring{}.reduce(q));
      ranks.push_back(rail_of(nm, sh));
      placement pl{L > 1 ? buf::tmp : buf::in, relay ? buf::tmp : buf::out, L > 1 ? acc[std::size_t(sh)] : shards.offset(sh),
                   relay ? res[std::size_t(sh)] : shards.offset(sh), 0};
      where.push_back(pl);
    }
    s.need_tmp(tmp);
    beside(s, xs, ranks, where, tmp);
    // 3. On the root's node: each shard's total to the root.
    if (root_node && L > 1) {
      s.next_step();
      for (int sh = 0; sh < S; ++sh) {
        if (shards.count(sh) == 0 || sh % L == l0) continue;
        if (relay && sh % L == l) s.send(p.root, {buf::tmp, res[std::size_t(sh)], shards.count(sh)});
        if (me == p.root) s.recv(node[std::size_t(sh % L)], shard(buf::out, sh));
      }
    }
    return s;
  }

  /// The rails rank r is on: i < the widest node with i mod L = r's place (L: its node's size).
  static std::vector<int> rails_of(const node_map& nm, int r) {
    std::vector<int> v;
    const int L = int(nm.members[std::size_t(nm.node_of[std::size_t(r)])].size()), l = nm.local_of[std::size_t(r)];
    for (int i = l; i < nm.widest(); i += L) v.push_back(i);
    return v;
  }
  /// The rank on rail i whose block the rail carries from node m: the local rank i there, if
  /// node m has one (-1 if not).
  static int on_rail(const node_map& nm, int i, int m) {
    const auto& there = nm.members[std::size_t(m)];
    return i < int(there.size()) ? there[std::size_t(i)] : -1;
  }

  /// Where a part's buffers lie here: its in and out regions in buffers `in` and `out` from
  /// `in_at` and `out_at` on, its scratch from `tmp_at` on.
  struct placement {
    buf in = buf::in, out = buf::out;
    std::size_t in_at = 0, out_at = 0, tmp_at = 0;

    /// A segment of the buffer `off` elements on, its scratch `tmp` on.
    static placement shifted(std::size_t off, std::size_t tmp = 0) { return {buf::in, buf::out, off, off, tmp}; }
    region operator()(region r) const {
      if (r.b == buf::in) return {in, r.offset + in_at, r.count};
      if (r.b == buf::out) return {out, r.offset + out_at, r.count};
      if (r.b == buf::tmp) return {buf::tmp, r.offset + tmp_at, r.count};
      return r;
    }
  };

  /// A schedule x of ranks 0..k-1 to run beside others: its rank r is ranks[r] here, its in and
  /// out regions `offset` elements on, its scratch `tmp_offset` on, its step i in step shift + i.
  struct part {
    const schedule* x;
    const std::vector<int>* ranks;
    placement at;
    int shift;
  };
  /// Appends the parts side by side after s: step t holds step t - shift of each part, the parts
  /// in their order (every rank lists its parts alike, so each pair of ranks meets in one order).
  static void side_by_side(schedule& s, const std::vector<part>& parts) {
    int end = 0;
    std::size_t tmp = 0;
    for (const part& q : parts) {
      end = std::max(end, q.shift + int(q.x->steps().size()));
      tmp = std::max(tmp, q.at.tmp_at + q.x->tmp_elems());
    }
    s.need_tmp(tmp);
    for (int t = 0; t < end; ++t) {
      if (t > 0) s.next_step();
      for (const part& q : parts)
        if (const int i = t - q.shift; i >= 0 && i < int(q.x->steps().size()))
          append_step(s, *q.x, std::size_t(i), *q.ranks, q.at);
    }
  }

  /// Schedules xs (xs[k] of ranks[k], its buffers where where[k] puts them) side by side, from
  /// the next step of s on; their scratch one after another from `tmp` on.
  static void beside(schedule& s, const std::vector<schedule>& xs, const std::vector<std::vector<int>>& ranks,
                     std::vector<placement> where, std::size_t tmp = 0) {
    std::vector<part> ps;
    for (std::size_t m = 0; m < xs.size(); ++m) {
      where[m].tmp_at = tmp;
      tmp += xs[m].tmp_elems();
      ps.push_back({&xs[m], &ranks[m], where[m], 0});
    }
    s.next_step();
    side_by_side(s, ps);
  }

  /// Shard sh's rail: its owner on each node (the local rank sh mod L there), in node order.
  static std::vector<int> rail_of(const node_map& nm, int sh) {
    std::vector<int> rail;
    for (const auto& there : nm.members) rail.push_back(there[std::size_t(sh) % there.size()]);
    return rail;
  }

  /// Adds step i of schedule x (of ranks 0..k-1) to the last step of s, its rank r being
  /// ranks[r] here and its buffers where `at` puts them.
  static void append_step(schedule& s, const schedule& x, std::size_t i, const std::vector<int>& ranks, const placement& at) {
    const step& st = x.steps()[i];
    for (auto c = st.copies_begin; c < st.copies_end; ++c) s.copy(at(x.copies()[c].dst), at(x.copies()[c].src));
    for (auto c = st.folds_begin; c < st.folds_end; ++c) {
      std::vector<region> srcs;
      for (const region& r : x.srcs_of(x.folds()[c])) srcs.push_back(at(r));
      s.fold(at(x.folds()[c].dst), srcs, x.folds()[c].complete);
    }
    for (auto c = st.sends_begin; c < st.sends_end; ++c) s.send(ranks[std::size_t(x.sends()[c].peer)], at(x.sends()[c].src));
    for (auto c = st.recvs_begin; c < st.recvs_end; ++c) {
      const recv_op& r = x.recvs()[c];
      s.recv(ranks[std::size_t(r.peer)], at(r.dst), r.how == combine::copy ? r.with : at(r.with), r.how);
    }
  }
};

}  // namespace collx::algo
