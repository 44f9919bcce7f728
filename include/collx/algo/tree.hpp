#pragma once
// algo::tree — the latency-optimised policy.
//
// Broadcast and reduce use a binomial tree (binomial.hpp): ceil(log2 N) steps, but the root
// sends (or receives) the whole buffer ceil(log2 N) times: T = ceil(log2 N)·(α + D·β [+ D·γ]).
//
// All-reduce uses a double binary tree, as NCCL does. A binary tree already halves the binomial
// tree's depth problem for bandwidth — each rank has at most two children — but half the ranks
// are leaves that only ever send D bytes up and receive D bytes down, while interior ranks move
// 3·D. The double tree builds two trees over the same ranks such that a rank that is interior in
// one is a leaf in the other, and gives each tree half of the buffer; every rank then sends and
// receives about D bytes in total and the two halves flow at once.
//
// Tree A is an in-order binary tree (NCCL's btree): the root is 0, the children of v are v ± b/2
// where b is v's lowest set bit, so a subtree is a contiguous range of ranks with its root in
// the middle. Tree B is A shifted by one rank (N odd) or mirrored (N even). Each half is cut into
// chunks; chunk c moves up the tree (reduce: a rank at height h sends it at step h+c) and then down
// (broadcast: at depth d it arrives at step H+c+d-1, H the root's height), so chunks pipeline:
//   steps 2·H + C - 1, where H = ceil(log2 N) is the height of the in-order tree (rank 0 sits
//   above a complete tree of the rest), so one chunk takes 2·ceil(log2 N) steps;
//   bytes sent per rank: D/2 up in each tree where it is not the root, plus D/2 per child in the
//   tree where it is interior: between D and 2·D; all ranks together 2(N-1)·D.
// This is a reduce followed by a broadcast, not reduce-scatter + all-gather: the tree's natural
// all-reduce, supplied by the policy (docs/algorithms.md says why).
//
// Rank order: an in-order subtree is (left subtree) ⊕ v ⊕ (right subtree), all contiguous, so
// tree A honours a non-commutative op; for such ops all of the buffer goes through tree A.
// reduce_scatter is reduce to rank 0 + binomial scatter; all_gather is binomial gather + broadcast.
#include <algorithm>
#include <cstddef>
#include <vector>

#include "../core/concepts.hpp"
#include "binomial.hpp"
#include "problem.hpp"
#include "profile.hpp"
#include "tuning.hpp"
#include "textbook.hpp"

namespace collx::algo {

/// One rank's links in a binary tree: parent and up to two children (-1 where absent).
struct tree_links {
  int parent = -1;
  int child[2] = {-1, -1};
};

/// NCCL's in-order binary tree over n ranks rooted at 0 (see above).
inline tree_links btree(int n, int v) {
  tree_links l;
  int bit = 1;
  while (bit < n && (bit & v) == 0) bit <<= 1;
  if (v == 0) {
    if (n > 1) l.child[1] = bit >> 1;  // the root's only child; every other rank is greater
    return l;
  }
  int up = (v ^ bit) | (bit << 1);
  if (up >= n) up = v ^ bit;
  l.parent = up;
  int low = bit >> 1;
  if (low != 0) {
    l.child[0] = v - low;
    int c1 = v + low;
    while (low != 0 && c1 >= n) {
      low >>= 1;
      c1 = v + low;
    }
    l.child[1] = low != 0 ? c1 : -1;
  }
  return l;
}

/// Tree `which` (0 = A, 1 = B) of the double binary tree, for actual rank r.
inline tree_links dtree(int n, int r, int which) {
  if (which == 0) return btree(n, r);
  const bool odd = n % 2 == 1;
  auto to_v = [&](int a) { return odd ? mod(a - 1, n) : n - 1 - a; };
  auto to_a = [&](int v) { return v < 0 ? -1 : odd ? mod(v + 1, n) : n - 1 - v; };
  tree_links l = btree(n, to_v(r));
  return {to_a(l.parent), {to_a(l.child[0]), to_a(l.child[1])}};
}

struct tree {
  using algorithm_policy_concept = algorithm_policy_tag;
  static constexpr const char* name = "tree";
  static constexpr bool keeps_rank_order = true;

  /// Pipeline chunk of the double binary tree.
  std::size_t chunk_bytes = tuning::pipeline_chunk_bytes;

  schedule broadcast(const bcast_problem& p) const {
    schedule s;
    binomial::broadcast(s, 0, p.rank, p.size, p.root, {buf::out, 0, p.count});
    return s;
  }

  schedule reduce(const reduce_problem& p) const {
    schedule s;
    if (p.rank != p.root || !p.commutative) s.need_tmp(p.count);
    binomial::reduce(s, 0, p.rank, p.size, p.root, {buf::in, 0, p.count}, {buf::out, 0, p.count},
                     {buf::tmp, 0, p.count}, !p.commutative);
    return s;
  }

  schedule reduce_scatter(const rs_problem& p) const {
    schedule s;
    const std::size_t total = p.blocks.total;
    // The full reduction lands at rank 0 in the work buffer (scratch when the output is compact).
    const buf full = p.work == buf::none ? buf::tmp : p.work;
    if (full == buf::tmp || p.rank != 0) s.need_tmp(total);
    const int t = binomial::reduce(s, 0, p.rank, p.size, 0, {p.src, 0, total}, {full, 0, total}, {buf::tmp, 0, total},
                                   true);
    binomial::scatter(s, t, p.rank, p.size, 0, p.blocks, full, buf::tmp, p.result());
    return s;
  }

  schedule all_gather(const ag_problem& p) const {
    schedule s;
    if (!p.in_place) s.copy(p.block(p.rank), {buf::in, 0, p.blocks.count(p.rank)});
    if (p.size == 1) return s;
    const int t = binomial::gather(s, 0, p.rank, p.size, 0, p.blocks, buf::out);
    binomial::broadcast(s, t, p.rank, p.size, 0, {buf::out, 0, p.blocks.total});
    return s;
  }

  /// The double binary tree of an all_reduce: every rank's links, heights and depths in both
  /// trees and the chunking, computed once (O(N)) and shared by the schedule of one rank and
  /// the loads of all.
  struct dbt_plan {
    int n = 1, ntrees = 1, nchunks = 1;
    partition halves;
    std::vector<tree_links> links[2];
    std::vector<int> height[2], depth[2];
    int H[2] = {0, 0};
  };

  dbt_plan plan(const ar_problem& p) const {
    dbt_plan d;
    const int n = d.n = p.size;
    d.ntrees = p.commutative ? 2 : 1;
    d.halves = partition(p.count, d.ntrees);
    std::size_t largest = 0;
    for (int t = 0; t < d.ntrees; ++t) largest = std::max(largest, d.halves.count(t));
    d.nchunks = chunks(largest, p.elem_size, chunk_bytes).parts;
    for (int t = 0; t < d.ntrees; ++t) {
      auto& links = d.links[t];
      links.resize(std::size_t(n));
      for (int a = 0; a < n; ++a) links[std::size_t(a)] = dtree(n, a, t);
      auto& height = d.height[t];
      auto& depth = d.depth[t];
      height.assign(std::size_t(n), -1);
      depth.assign(std::size_t(n), 0);
      int root = 0;
      for (int a = 0; a < n; ++a)
        if (links[std::size_t(a)].parent < 0) root = a;
      std::vector<int> order_bfs{root};
      for (std::size_t i = 0; i < order_bfs.size(); ++i)
        for (int c : links[std::size_t(order_bfs[i])].child)
          if (c >= 0) {
            depth[std::size_t(c)] = depth[std::size_t(order_bfs[i])] + 1;
            order_bfs.push_back(c);
          }
      for (auto it = order_bfs.rbegin(); it != order_bfs.rend(); ++it) {
        int h = 0;
        for (int c : links[std::size_t(*it)].child)
          if (c >= 0) h = std::max(h, height[std::size_t(c)] + 1);
        height[std::size_t(*it)] = h;
      }
      d.H[t] = height[std::size_t(root)];
    }
    return d;
  }

  struct dbt_event {
    int time, order;
    bool is_send;
    int peer;
    region a, with;
    combine how;
  };

  /// Rank r's sends and receives in the double binary tree, in the order the schedule lists them
  /// (emit(event) for each); a root of a tree without children copies (copy(dst, src)).
  template <class Emit, class Copy>
  static void dbt_rank(const dbt_plan& d, int r, buf src, Emit&& emit, Copy&& copy) {
    int order = 0;
    for (int t = 0; t < d.ntrees; ++t) {
      const auto& height = d.height[t];
      const tree_links& me = d.links[t][std::size_t(r)];
      const partition ch(d.halves.count(t), d.nchunks);
      for (int c = 0; c < d.nchunks; ++c) {
        const std::size_t off = d.halves.offset(t) + ch.offset(c), cnt = ch.count(c);
        const region out_c{buf::out, off, cnt}, src_c{src, off, cnt};
        // Reduce: receive each child's subtree sum when it is sent (at its height + c); the first
        // one combines with this rank's input, later ones with the running sum. The left child's
        // ranks are below this rank, the right child's above: that fixes the operand order.
        int kids[2] = {me.child[0], me.child[1]};
        if (kids[0] >= 0 && kids[1] >= 0 && height[std::size_t(kids[1])] < height[std::size_t(kids[0])]) std::swap(kids[0], kids[1]);
        bool have_sum = false;
        for (int k : kids) {
          if (k < 0) continue;
          const bool left_of_me = (t == 0) ? k < r : false;  // only tree A is used for rank order
          emit(dbt_event{height[std::size_t(k)] + c, order++, false, k, out_c, have_sum ? out_c : src_c,
                         left_of_me ? combine::received_left : combine::received_right});
          have_sum = true;
        }
        if (me.parent >= 0) emit(dbt_event{height[std::size_t(r)] + c, order++, true, me.parent, have_sum ? out_c : src_c, {}, combine::copy});
        else if (!have_sum) copy(out_c, src_c);
        // Broadcast down: the root sends at H + c; a rank at depth d receives at H + c + d - 1 and
        // forwards at H + c + d.
        const int dep = d.depth[t][std::size_t(r)];
        if (me.parent >= 0) emit(dbt_event{d.H[t] + c + dep - 1, order++, false, me.parent, out_c, {}, combine::copy});
        for (int k : me.child)
          if (k >= 0) emit(dbt_event{d.H[t] + c + dep, order++, true, k, out_c, {}, combine::copy});
      }
    }
  }

  schedule all_reduce(const ar_problem& p) const {
    schedule s;
    const int n = p.size, r = p.rank;
    if (n == 1) {
      s.copy({buf::out, 0, p.count}, {p.src, 0, p.count});
      return s;
    }
    const dbt_plan d = plan(p);
    std::vector<dbt_event> ev;
    dbt_rank(d, r, p.src, [&](const dbt_event& e) { ev.push_back(e); }, [&](region dst, region from) { s.copy(dst, from); });
    std::stable_sort(ev.begin(), ev.end(), [](const dbt_event& x, const dbt_event& y) {
      return x.time != y.time ? x.time < y.time : x.order < y.order;
    });
    for (const dbt_event& e : ev) {
      s.at(e.time);
      if (e.is_send) s.send(e.peer, e.a);
      else s.recv(e.peer, e.a, e.with, e.how);
    }
    return s;
  }

  /// Loads over all ranks (profile.hpp). A rank's steps depend only on its place in the two
  /// trees (height, depth, parent or not, its children's heights), so ranks are grouped by that
  /// place and one of each group is walked: a few dozen groups instead of N ranks of O(N + C).
  load_runs all_reduce_loads(const ar_problem& p) const {
    load_maxima m;
    if (p.size == 1) return m.runs();
    const dbt_plan d = plan(p);
    struct role {
      int v[12];
      bool operator==(const role&) const = default;
    };
    auto role_of = [&](int r) {
      role x{};
      for (int t = 0; t < d.ntrees; ++t) {
        const tree_links& l = d.links[t][std::size_t(r)];
        int* v = x.v + 6 * t;
        v[0] = d.height[t][std::size_t(r)];
        v[1] = d.depth[t][std::size_t(r)];
        v[2] = l.parent >= 0;
        v[3] = l.child[0] >= 0 ? d.height[t][std::size_t(l.child[0])] : -1;
        v[4] = l.child[1] >= 0 ? d.height[t][std::size_t(l.child[1])] : -1;
        if (v[3] > v[4]) std::swap(v[3], v[4]);
        v[5] = (l.child[0] >= 0) + (l.child[1] >= 0);
      }
      return x;
    };
    std::vector<role> roles;
    std::vector<std::uint32_t> members;
    std::vector<int> first;
    for (int r = 0; r < p.size; ++r) {
      const role x = role_of(r);
      std::size_t i = 0;
      while (i < roles.size() && !(roles[i] == x)) ++i;
      if (i == roles.size()) {
        roles.push_back(x);
        members.push_back(0);
        first.push_back(r);
      }
      ++members[i];
    }
    std::vector<std::uint64_t> out, in, red;
    for (std::size_t i = 0; i < roles.size(); ++i) {
      out.assign(0, 0);
      std::size_t span = 0;
      auto at = [&](int t) {
        if (std::size_t(t) >= out.size()) {
          out.resize(std::size_t(t) + 1, 0);
          in.resize(std::size_t(t) + 1, 0);
          red.resize(std::size_t(t) + 1, 0);
        }
        span = std::max(span, std::size_t(t) + 1);
      };
      in.assign(0, 0);
      red.assign(0, 0);
      std::vector<bool> busy;
      dbt_rank(d, first[i], p.src, [&](const dbt_event& e) {
        at(e.time);
        if (busy.size() <= std::size_t(e.time)) busy.resize(std::size_t(e.time) + 1, false);
        busy[std::size_t(e.time)] = true;
        const std::uint64_t b = e.a.count * p.elem_size;
        if (e.is_send) out[std::size_t(e.time)] += b;
        else {
          in[std::size_t(e.time)] += b;
          if (e.how != combine::copy) red[std::size_t(e.time)] += b;
        }
      }, [](region, region) {});
      for (std::size_t t = 0; t < span; ++t)
        if (busy[t]) m.add(int(t), out[t], in[t], red[t], members[i]);
    }
    return m.runs();
  }

  /// The taller of the double binary tree's two trees.
  static int height(int n) {
    int best = 0;
    for (int t = 0; t < 2; ++t) {
      std::vector<int> depth(std::size_t(n), 0);
      for (int r = 0; r < n; ++r)
        for (int a = r; dtree(n, a, t).parent >= 0; a = dtree(n, a, t).parent) ++depth[std::size_t(r)];
      best = std::max(best, *std::max_element(depth.begin(), depth.end()));
    }
    return best;
  }

  /// The textbook's steps and bytes (algo/textbook.hpp; collx-explain prints them).
  static formula textbook(const textbook_case& k) {
    using W = formula::who;
    const int n = k.n, lg = k.lg();
    const double D = k.D(), share = k.share();
    switch (k.c) {
      case collective::all_reduce: {
        const int H = height(n), trees = k.commutative ? 2 : 1;
        const std::size_t largest = partition(k.bytes / k.elem, trees).count(0);
        const int c = chunks(largest, k.elem, tuning::pipeline_chunk_bytes).parts;
        return {"2H+C-1, H = " + std::to_string(H) + " (tree height), C = " + std::to_string(c) + " chunk(s) per tree",
                2 * H + c - 1, "2(N-1)·D, all ranks together", 2.0 * (n - 1) * D, W::total};
      }
      case collective::reduce_scatter:
        return {"2·ceil(log2 N): reduce to rank 0, then scatter", 2 * lg, "(N-1)/N·D by rank 0 (the scatter)", share, W::one_rank, 0};
      case collective::all_gather:
        return {"2·ceil(log2 N): gather at rank 0, then broadcast", 2 * lg, "ceil(log2 N)·D by rank 0 (the broadcast)", lg * D,
                W::one_rank, 0};
      case collective::broadcast: return {"ceil(log2 N)", lg, "ceil(log2 N)·D by the root", lg * D, W::one_rank, k.root};
      case collective::reduce: {
        // A non-commutative op is reduced at rank 0 (where binomial subtrees are rank ranges),
        // which then forwards the result to the root in one more step.
        const bool forward = !k.commutative && k.root != 0;
        return {forward ? "ceil(log2 N)+1" : "ceil(log2 N)", lg + (forward ? 1 : 0),
                forward ? "ceil(log2 N)·D received by rank 0" : "ceil(log2 N)·D received by the root", lg * D, W::one_rank,
                forward ? 0 : k.root, true};
      }
      default: return {};
    }
  }
};

}  // namespace collx::algo
