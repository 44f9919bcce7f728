#pragma once
// algo::recursive_halving — Rabenseifner's reduce-scatter by recursive halving and all-gather by
// recursive doubling: log-many steps that still move only (N-1)/N·D bytes per phase.
//
// Powers of two, N = 2^k. Reduce-scatter: at step i (distance d = N/2, N/4, ..., 1) a rank pairs
// with rank ^ d, keeps the half of its current range on its own side, sends the other half and
// reduces the half it receives: log2 N steps, D/2 + D/4 + ... = (N-1)/N·D bytes sent and reduced.
// All-gather mirrors it, distance 1, 2, ..., N/2, doubling the range each step: log2 N steps,
// (N-1)/N·D bytes. All-reduce = the two: 2·log2 N steps and 2(N-1)/N·D bytes, as the ring, with
// logarithmic instead of linear latency: T = 2·log2 N·α + 2(N-1)/N·D·β + (N-1)/N·D·γ.
//
// Other N: with p the largest power of two below N and r = N - p, the first 2r ranks fold in
// pairs before the power-of-two part: even rank 2i sends everything to 2i+1, which reduces it
// and stands for both ("virtual rank" i); the remaining ranks are virtual ranks r, r+1, .... At
// the end the odd rank hands the even rank its block. That costs two extra steps and D extra
// bytes on the folded pairs: steps 2 + log2 p per phase.
//
// Rank order: halving pairs rank r with r + N/2 first, which a non-commutative op cannot accept.
// For such ops the reduce-scatter runs as recursive doubling on whole vectors (distance 1, 2,
// 4, ...): each virtual rank stands for a contiguous range of ranks and its partner's range is
// adjacent (the lower one on the left), so the result is in0 ⊕ in1 ⊕ ... ⊕ in(N-1), at
// log2 p·D bytes per rank instead of (N-1)/N·D.
//
// Broadcast is van de Geijn's scatter + all-gather (binomial scatter of N blocks from the root,
// then recursive doubling among ranks renumbered from the root): ~2·D bytes for the root instead
// of log2 N·D. Reduce is the halving reduce-scatter followed by a gather of the blocks at the root.
#include <cstddef>

#include "../core/concepts.hpp"
#include "binomial.hpp"
#include "problem.hpp"
#include "textbook.hpp"

namespace collx::algo {

/// The fold of non-powers of two: which virtual rank stands for which ranks.
struct fold {
  int n, p, r;  // ranks, largest power of two <= n, ranks folded away (n - p)
  explicit fold(int n_) : n(n_), p(floor_pow2(n_)), r(n_ - floor_pow2(n_)) {}
  /// The virtual rank of v, or -1 for an even rank that folded into its odd neighbour.
  int virt(int v) const { return v < 2 * r ? (v % 2 ? v / 2 : -1) : v - r; }
  /// The rank that acts for virtual rank w.
  int acting(int w) const { return w < r ? 2 * w + 1 : w + r; }
  /// The first rank virtual rank w stands for (w == p gives n).
  int first(int w) const { return w < r ? 2 * w : w + r; }
};

struct doubling_result {
  region sum;  // where this rank's full reduction is (ranks that were not folded away)
  int t_end;   // the step after the last exchange
};

/// Recursive doubling on whole vectors over the folded ranks, shared by recursive_doubling's
/// all-reduce and recursive_halving's rank-ordered reduce-scatter. The even rank of each folded
/// pair first hands its vector to the odd one; then partners at distance 1, 2, 4, ... exchange
/// their running sums, the lower-ranked on the left. Sums alternate between scratch regions a
/// and b (a partner reads the one being sent); the last exchange writes `last` instead, when
/// given and not the region being sent.
inline doubling_result doubling(schedule& s, const fold& f, int me, region src, region a, region b, region last) {
  const int steps = ceil_log2(f.p);
  region cur = src;
  auto next = [&](bool is_last) {
    if (is_last && last.b != buf::none && !(cur == last)) return last;
    return cur == a ? b : a;
  };
  int t = 0;
  if (f.r > 0) {
    if (me < 2 * f.r) {
      s.at(0);
      if (me % 2 == 0) s.send(me + 1, src);
      else {
        const region d = next(steps == 0);
        s.recv(me - 1, d, src, combine::received_left);
        cur = d;
      }
    }
    t = 1;
  }
  const int t_end = t + steps;
  const int w = f.virt(me);
  if (w >= 0)
    for (int d = 1, k = 1; d < f.p; d *= 2, ++k, ++t) {
      const int pw = w ^ d;
      const region dst = next(k == steps);
      s.at(t);
      s.send(f.acting(pw), cur);
      s.recv(f.acting(pw), dst, cur, pw < w ? combine::received_left : combine::received_right);
      cur = dst;
    }
  return {cur, t_end};
}

struct recursive_halving {
  using algorithm_policy_concept = algorithm_policy_tag;
  static constexpr const char* name = "recursive_halving";
  static constexpr bool keeps_rank_order = true;

  schedule reduce_scatter(const rs_problem& p) const {
    schedule s;
    reduce_scatter_into(s, p);
    return s;
  }

  schedule all_gather(const ag_problem& p) const {
    schedule s;
    all_gather_into(s, 0, p);
    return s;
  }

  schedule broadcast(const bcast_problem& p) const {
    schedule s;
    if (p.size == 1) return s;
    const partition blocks(p.count, p.size);
    const int v = mod(p.rank - p.root, p.size);
    // Scatter: block v of the rotated numbering goes to rank v (relative to the root), in place.
    const int t = binomial::scatter(s, 0, p.rank, p.size, p.root, blocks, buf::out, buf::out,
                                    {buf::out, blocks.offset(v), blocks.count(v)});
    all_gather_into(s, t, ag_problem{v, p.size, blocks, true, p.root, p.elem_size});
    return s;
  }

  schedule reduce(const reduce_problem& p) const {
    schedule s;
    const partition blocks(p.count, p.size);
    const bool root = p.rank == p.root;
    if (!root) s.need_tmp(p.count);
    const rs_problem rs{p.rank, p.size, blocks, buf::in, root ? buf::out : buf::tmp, p.elem_size, p.commutative};
    const int t = reduce_scatter_into(s, rs);
    // Gather the reduced blocks at the root: one step, every block straight to the root.
    if (p.size == 1) return s;
    s.at(t);
    if (!root) s.send(p.root, rs.result());
    else
      for (int i = 0; i < p.size; ++i)
        if (i != p.root) s.recv(i, rs.block(buf::out, i));
    return s;
  }

 private:
  static int reduce_scatter_into(schedule& s, const rs_problem& p) {
    const int n = p.size, me = p.rank;
    const region result = p.result();
    const std::size_t total = p.blocks.total;
    if (n == 1) {
      s.copy(result, p.block(p.src, 0));
      return 0;
    }
    const fold f(n);
    if (!p.commutative) return reduce_scatter_ordered(s, p, f);
    const buf work = p.work == buf::none ? buf::tmp : p.work;
    if (work == buf::tmp) s.need_tmp(total);
    // Elements of the ranks that virtual ranks [lo, hi) stand for.
    auto range = [&](buf b, int lo, int hi) {
      const std::size_t a = p.blocks.offset(f.first(lo)), e = p.blocks.offset(f.first(hi));
      return region{b, a, e - a};
    };
    buf cur = p.src;  // where this rank's running partial sums are
    int t = 0;
    if (f.r > 0) {
      if (me < 2 * f.r) {
        s.at(0);
        if (me % 2 == 0) s.send(me + 1, {p.src, 0, total});
        else {
          s.recv(me - 1, {work, 0, total}, {p.src, 0, total}, combine::received_left);
          cur = work;
        }
      }
      t = 1;
    }
    const int w = f.virt(me);
    int steps = 0;
    for (int d = f.p / 2; d >= 1; d /= 2) ++steps;
    const int t_end = t + steps;
    if (w < 0) {  // folded away: the odd neighbour returns this rank's block at the end
      s.at(t_end);
      s.recv(me + 1, result);
      return t_end + 1;
    }
    int lo = 0, hi = f.p;
    for (int d = f.p / 2; d >= 1; d /= 2, ++t) {
      const int pw = w ^ d, partner = f.acting(pw), mid = lo + d;
      const int klo = w < mid ? lo : mid, khi = w < mid ? mid : hi;
      const int slo = w < mid ? mid : lo, shi = w < mid ? hi : mid;
      s.at(t);
      s.send(partner, range(cur, slo, shi));
      const bool last_single = d == 1 && f.first(khi) - f.first(klo) == 1;
      s.recv(partner, last_single ? result : range(work, klo, khi), range(cur, klo, khi),
             pw < w ? combine::received_left : combine::received_right);
      cur = work;
      lo = klo;
      hi = khi;
    }
    if (me < 2 * f.r) {  // odd rank standing for (me-1, me): hand over me-1's block
      s.at(t_end);
      s.send(me - 1, p.block(work, me - 1));
      s.copy(result, p.block(work, me));
      return t_end + 1;
    }
    if (f.r > 0) return t_end + 1;
    return t_end;
  }

  // A non-commutative op: halving would combine rank r with rank r + N/2 first, which breaks
  // rank order. Recursive doubling on whole vectors keeps it (partners at distance 1, 2, 4, ...
  // hold adjacent ranges), at log2 p·D bytes instead of (N-1)/N·D: the price of order.
  static int reduce_scatter_ordered(schedule& s, const rs_problem& p, const fold& f) {
    const int me = p.rank;
    const std::size_t total = p.blocks.total;
    s.need_tmp(2 * total);
    const auto d = doubling(s, f, me, {p.src, 0, total}, {buf::tmp, 0, total}, {buf::tmp, total, total}, region{});
    const region sum = d.sum;  // named, not bound: the lambda below captures it (clang 14)
    const int t_end = d.t_end;
    if (f.virt(me) < 0) {  // folded away: the odd neighbour hands over this rank's block
      s.at(t_end);
      s.recv(me + 1, p.result());
      return t_end + 1;
    }
    auto block_of = [&](int i) { return sum.sub(p.blocks.offset(i), p.blocks.count(i)); };
    s.at(t_end);  // a step's copies run before its transfers: this one after the last exchange
    if (me < 2 * f.r) s.send(me - 1, block_of(me - 1));
    s.copy(p.result(), block_of(me));
    return f.r > 0 ? t_end + 1 : t_end;
  }

  static int all_gather_into(schedule& s, int t0, const ag_problem& p) {
    const int n = p.size, v = p.rank;
    if (!p.in_place) s.copy(p.block(v), {buf::in, 0, p.blocks.count(v)});
    if (n == 1) return t0;
    const fold f(n);
    auto range = [&](int lo, int hi) {
      const std::size_t a = p.blocks.offset(f.first(lo)), e = p.blocks.offset(f.first(hi));
      return region{buf::out, a, e - a};
    };
    int t = t0;
    if (f.r > 0) {
      if (v < 2 * f.r) {
        s.at(t);
        if (v % 2 == 0) s.send(p.actual(v + 1), p.own());
        else s.recv(p.actual(v - 1), p.block(v - 1));
      }
      ++t;
    }
    const int w = f.virt(v);
    int steps = 0;
    for (int d = 1; d < f.p; d *= 2) ++steps;
    const int t_end = t + steps;
    if (w < 0) {  // folded away: receive everything but its own block from the odd neighbour
      s.at(t_end);
      s.recv(p.actual(v + 1), {buf::out, 0, p.blocks.offset(v)});
      s.recv(p.actual(v + 1), {buf::out, p.blocks.end(v), p.blocks.total - p.blocks.end(v)});
      return t_end + 1;
    }
    int lo = w, hi = w + 1;
    for (int d = 1; d < f.p; d *= 2, ++t) {
      const int partner = p.actual(f.acting(w ^ d));
      const int plo = (w & d) ? lo - d : hi, phi = (w & d) ? lo : hi + d;
      s.at(t);
      s.send(partner, hi - lo == 1 && f.r == 0 ? p.own() : range(lo, hi));
      s.recv(partner, range(plo, phi));
      lo = std::min(lo, plo);
      hi = std::max(hi, phi);
    }
    if (v < 2 * f.r) {
      s.at(t_end);
      s.send(p.actual(v - 1), {buf::out, 0, p.blocks.offset(v - 1)});
      s.send(p.actual(v - 1), {buf::out, p.blocks.end(v - 1), p.blocks.total - p.blocks.end(v - 1)});
      return t_end + 1;
    }
    return f.r > 0 ? t_end + 1 : t_end;
  }

 public:
  /// The textbook's steps and bytes (algo/textbook.hpp; collx-explain prints them). Its byte
  /// counts hold for N a power of two (the folded ranks move more).
  static formula textbook(const textbook_case& k) {
    using W = formula::who;
    const double D = k.D(), share = k.share();
    const int lgp = k.lgp(), lgv = k.lgv(), lg = k.lg();
    const std::string lgs = k.lgs();
    formula f = [&]() -> formula {
      switch (k.c) {
        case collective::all_reduce:
          if (!k.commutative)
            return k.per_segment({"2(" + lgs + ")", 2 * lgv, "log2 p·D + (N-1)/N·D (doubling on whole vectors, then all-gather)",
                                  lgp * D + share, W::max});
          return k.per_segment({"2(" + lgs + ")", 2 * lgv, "2(N-1)/N·D", 2 * share, W::max});
        case collective::reduce_scatter:
          if (!k.commutative) return {lgs, lgv, "log2 p·D (doubling on whole vectors)", lgp * D, W::max};
          return {lgs, lgv, "(N-1)/N·D", share, W::max};
        case collective::all_gather: return {lgs, lgv, "(N-1)/N·D", share, W::max};
        case collective::broadcast:
          // ceil(log2 N) steps of binomial scatter, then the all-gather's.
          return {"ceil(log2 N)+(" + lgs + "): binomial scatter, then all-gather", lg + lgv, "2(N-1)/N·D by the root",
                  2 * share, W::one_rank, k.root};
        case collective::reduce:
          return {"(" + lgs + ")+1: reduce-scatter, then every block straight to the root", lgv + 1,
                  "(N-1)/N·D received by the root in the last step, after its reduce-scatter share",
                  k.commutative ? 2 * share : lgp * D + share, W::one_rank, k.root, true};
        default: return {};
      }
    }();
    f.pow2_only = !k.pow2();
    return f;
  }
};

}  // namespace collx::algo
