#pragma once
// algo::recursive_doubling — the latency-optimal all-reduce, for small messages.
//
// Every rank exchanges its whole running sum with rank ^ 1, then rank ^ 2, rank ^ 4, ...,
// combining what it receives: after log2 N steps every rank holds the full reduction. No
// reduce-scatter, no all-gather: each step moves all D bytes, so
//   steps log2 N; bytes sent and reduced per rank log2 N · D;
//   T = log2 N · (α + D·β + D·γ),
// against 2·log2 N·α + 2(N-1)/N·D·β for recursive halving: half the latency, log2 N / 2 times
// the bytes. It wins while α dominates, which is why algo::automatic takes it for small
// all-reduces (algo/tuning.hpp) — the choice MPICH and Open MPI make for short vectors too.
//
// Other N fold as in recursive_halving.hpp: the first 2(N - p) ranks pair up before (even
// gives to odd) and after (odd gives back), two extra steps. Partners always hold adjacent rank
// ranges, the lower on the left, so a non-commutative op gets the rank-ordered result.
#include "../core/concepts.hpp"
#include "problem.hpp"
#include "recursive_halving.hpp"
#include "textbook.hpp"

namespace collx::algo {

struct recursive_doubling {
  using algorithm_policy_concept = algorithm_policy_tag;
  static constexpr const char* name = "recursive_doubling";
  static constexpr bool keeps_rank_order = true;

  schedule all_reduce(const ar_problem& p) const {
    schedule s;
    const int n = p.size, me = p.rank;
    const region src{p.src, 0, p.count}, out{buf::out, 0, p.count};
    if (n == 1) {
      s.copy(out, src);
      return s;
    }
    const fold f(n);
    s.need_tmp(2 * p.count);
    const auto [sum, t_end] = doubling(s, f, me, src, {buf::tmp, 0, p.count}, {buf::tmp, p.count, p.count}, out);
    s.at(t_end);
    if (f.virt(me) < 0) {  // folded away: the odd neighbour hands back the result
      s.recv(me + 1, out);
      return s;
    }
    s.copy(out, sum);  // in place, the last sum is in scratch; copies run before the step's transfers
    if (me < 2 * f.r) s.send(me - 1, out);
    return s;
  }

  /// The textbook's steps and bytes (algo/textbook.hpp; collx-explain prints them).
  static formula textbook(const textbook_case& k) {
    formula f{k.lgs(), k.lgv(), "log2 p·D (whole vectors), + D on the folded ranks", k.lgp() * k.D(), formula::who::max};
    f.pow2_only = !k.pow2();
    return f;
  }
};

}  // namespace collx::algo
