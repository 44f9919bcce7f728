#pragma once
// algo::deterministic<Inner> — reductions that can be reproduced bit for bit.
//
// Floating-point addition is not associative, so a reduction's result depends on the order it
// adds in, and every other policy's order follows its structure: the ring adds block b starting
// at rank b+1, the tree by subtrees, recursive halving by pairs; the order changes with the rank
// count, the segment and the policy. Here every element's result is
//   ((x_0 ⊕ x_1) ⊕ x_2) ⊕ ... ⊕ x_(N-1),
// the N ranks' contributions in rank order, reduced in the op's accumulator type and rounded to
// the element type once (ops.hpp: accumulator_t; ops::accumulate_in). It is the same on every
// rank, for every Inner, segment and chunk size, fused layout and transport, and equal to a
// serial loop that adds in rank order (tests/test_deterministic.cpp).
//
// reduce_scatter, by direct exchange: at step s = 1 .. N-1 rank r sends block r+s of its input
// to its owner and receives rank r-s's contribution to its own block into scratch (all at once
// when the blocks are small, as pairwise's all-gather); then one fold (core/schedule.hpp:
// fold_op) reduces the N contributions in rank order. It sends and receives what the ring's
// reduce-scatter does, (N-1)/N·D per rank, in N-1 steps (one for small blocks), and keeps
// (N-1)/N·D of scratch per segment; every reduction happens once, on the block's owner. Where
// the op accumulates in the element type itself and divides nothing at the end (a float sum, a
// double sum, a product, a user's op: ops::stepwise_exact_v), reducing two at a time gives the
// fold's bits, and the owner reduces each contribution as it arrives, in rank order, where it
// lies: two steps, one block of scratch for the lower ranks' partial sum, no second pass
// (direct_reduce_scatter's `stepwise`).
// all_reduce: that reduce-scatter, then Inner's all-gather (copies: exact in any order), in
// segments as every composed all-reduce (algo/compose.hpp); a small one (the N inputs within
// tuning::deterministic_gather_bytes) gathers every input on every rank in ceil(log2 N) steps
// and folds them there, in rank order: the same fold, so the same bits.
// reduce: the reduce-scatter, then every block sent to the root (N-1 receives there at once).
//
// Inner picks the all-gather (ring, tree, recursive_halving, pairwise; automatic: the model's
// choice, made per call in collectives/common.hpp and carried in `gather`, so one instantiation
// serves every choice); the reduction never depends on it.
#include <algorithm>
#include <array>
#include <cstddef>
#include <type_traits>
#include <utility>
#include <vector>

#include "../core/concepts.hpp"
#include "automatic.hpp"
#include "policies.hpp"
#include "problem.hpp"
#include "tuning.hpp"

namespace collx::algo {

template <class Inner = automatic>
struct deterministic {
  using algorithm_policy_concept = algorithm_policy_tag;
  static constexpr std::array<char, 48> name_chars = policy_name("deterministic(", Inner::name, ")");
  static constexpr const char* name = name_chars.data();
  static constexpr bool keeps_rank_order = true;  // the fold is in rank order, whatever the op
  using inner_policy = Inner;

  Inner inner{};
  /// deterministic<automatic>: the all-gather's policy, chosen per call (collectives/common.hpp:
  /// with_policy, the model's choice for the blocks); one of algo::policies that has one.
  choice gather = choice(-1);

  schedule reduce_scatter(const rs_problem& p) const {
    schedule s;
    direct_reduce_scatter(s, p.rank, p.size, p.blocks, p.src, p.result(), p.elem_size, p.stepwise_exact);
    return s;
  }

  schedule all_gather(const ag_problem& p) const {
    if constexpr (std::is_same_v<Inner, automatic>) {
      schedule s;
      bool built = false;
      for_each_policy([&]<class P>() {
        if constexpr (requires(const P& q) { q.all_gather(p); })
          if (!built && gather == choice_of<P>) {
            s = P{}.all_gather(p);
            built = true;
          }
      });
      return built ? std::move(s) : ring{}.all_gather(p);
    } else {
      return inner.all_gather(p);
    }
  }

  schedule reduce(const reduce_problem& p) const {
    schedule s;
    const int n = p.size, r = p.rank;
    const partition blocks(p.count, n);
    const std::size_t slot = blocks.max_count();
    // the root's block lands in its output; another rank's in scratch after the slots, to send
    // (stepwise, the reduce-scatter keeps one slot of scratch, the fold N-1)
    const std::size_t mine_at = (p.stepwise_exact ? 1 : std::size_t(n - 1)) * slot;
    const region mine = r == p.root ? region{buf::out, blocks.offset(r), blocks.count(r)}
                                    : region{buf::tmp, mine_at, blocks.count(r)};
    if (r != p.root) s.need_tmp(mine_at + slot);
    direct_reduce_scatter(s, r, n, blocks, buf::in, mine, p.elem_size, p.stepwise_exact);
    if (n == 1) return s;
    s.next_step();
    if (r != p.root) {
      s.send(p.root, mine);
    } else {
      for (int q = 0; q < n; ++q)
        if (q != r) s.recv(q, {buf::out, blocks.offset(q), blocks.count(q)});
    }
    return s;
  }

  /// all_reduce of a small buffer (tuning::deterministic_gather_bytes, all_reduce_gathers):
  /// every rank gathers the N inputs by Bruck's all-gather, ceil(log2 N) steps of one send and
  /// one receive (the messages recursive doubling sends, for any N): scratch slot j holds rank
  /// r+j's input, and at distance d a rank sends its first min(d, N-d) slots to rank r-d and
  /// receives as many into slots d.. from rank r+d. Then the fold of the N inputs in rank order,
  /// on every rank: the reduce-scatter's fold, so the same bits, without its all-gather.
  static schedule gathered_all_reduce(const ar_problem& p) {
    schedule s;
    const int n = p.size, r = p.rank;
    const region src{p.src, 0, p.count}, out{buf::out, 0, p.count};
    if (n == 1) {
      s.copy(out, src);
      return s;
    }
    s.need_tmp(std::size_t(n) * p.count);
    auto slots = [&](int j, int k) { return region{buf::tmp, std::size_t(j) * p.count, std::size_t(k) * p.count}; };
    s.at(0);
    s.copy(slots(0, 1), src);  // (a step's copies run before its transfers)
    int t = 0;
    for (int d = 1; d < n; d *= 2, ++t) {
      const int m = std::min(d, n - d);
      s.at(t);
      s.send(mod(r - d, n), slots(0, m));
      s.recv(mod(r + d, n), slots(d, m));
    }
    s.next_step();
    std::vector<region> in_order;
    in_order.reserve(std::size_t(n));
    for (int q = 0; q < n; ++q) in_order.push_back(slots(mod(q - r, n), 1));
    s.fold(out, in_order, /*complete*/ true);
    return s;
  }
  static bool all_reduce_gathers(const ar_problem& p) {
    return std::size_t(p.size) * p.count * p.elem_size <= tuning::deterministic_gather_bytes;
  }

  /// The direct reduce-scatter into `result`: block q of `src` to rank q, the contributions to
  /// this rank's block into scratch slots (one per other rank, `slot` elements each, from
  /// scratch element 0), then the fold in rank order.
  ///
  /// `stepwise`: reducing two at a time in the element type gives the fold's bits (rs_problem::
  /// stepwise_exact), so each contribution is reduced as it arrives, in rank order, with no slot
  /// to land in and no pass to fold them: receives that reduce, chained (each one's operand is
  /// what the one before it wrote, so they run in the order listed: core/concepts.hpp,
  /// may_progress). In two steps, because this rank's own contribution goes in between:
  ///   step 1: send to the higher ranks; receive x_0, x_0 ⊕ x_1, ... up to x_(r-1) into scratch;
  ///   step 2: result = that ⊕ own; send to the lower ranks; receive ⊕ x_(r+1) ... ⊕ x_(N-1).
  /// A rank's step-1 messages go up and its step-2 messages down, and each rank takes them in
  /// rank order, so no rank waits on one that waits on it. The traffic is the same; the receiver
  /// reads each contribution once where it lies (a thread-rank's buffer, a shm channel's cell)
  /// and keeps one block of scratch.
  static void direct_reduce_scatter(schedule& s, int r, int n, const partition& blocks, buf src, region result,
                                    std::size_t elem_size, bool stepwise) {
    const region own{src, blocks.offset(r), blocks.count(r)};
    if (n == 1) {
      s.copy(result, own);
      return;
    }
    auto block = [&](int q) { return region{src, blocks.offset(q), blocks.count(q)}; };
    if (stepwise) {
      const region low{buf::tmp, 0, blocks.count(r)};  // x_0 ⊕ ... ⊕ x_(r-1) (result may be own: in place)
      if (r > 0) s.need_tmp(blocks.count(r));
      s.next_step();
      for (int q = r + 1; q < n; ++q) s.send(q, block(q));
      for (int q = 0; q < r; ++q) {
        if (q == 0) s.recv(q, low);
        else s.recv(q, low, low, combine::received_right);
      }
      s.next_step();
      if (r > 0) {
        const region pair[] = {low, own};
        s.fold(result, pair);
      }
      for (int q = 0; q < r; ++q) s.send(q, block(q));
      for (int q = r + 1; q < n; ++q) s.recv(q, result, q == r + 1 && r == 0 ? own : result, combine::received_right);
      return;
    }
    const std::size_t slot = blocks.max_count();
    s.need_tmp(std::size_t(n - 1) * slot);
    auto from_slot = [&](int q) { return region{buf::tmp, std::size_t(q < r ? q : q - 1) * slot, blocks.count(r)}; };
    const bool one_step = slot * elem_size <= tuning::a2a_one_step_bytes;
    for (int st = 1; st < n; ++st) {
      const int to = mod(r + st, n), from = mod(r - st, n);
      if (one_step) s.at(0);
      else s.next_step();
      s.send(to, block(to));
      s.recv(from, from_slot(from));
    }
    s.next_step();
    std::vector<region> in_order;
    in_order.reserve(std::size_t(n));
    for (int q = 0; q < n; ++q) in_order.push_back(q == r ? own : from_slot(q));
    s.fold(result, in_order, /*complete*/ true);
  }
};

/// The name of deterministic<P> where `gather` is P's choice: what a call in the mode runs, as
/// its signature names it (deterministic(automatic) while the all-gather is not yet chosen).
inline const char* deterministic_name(choice gather) {
  const char* name = deterministic<>::name;
  for_each_policy([&]<class P>() {
    if constexpr (requires(const P& q, const ag_problem& p) { q.all_gather(p); })
      if (gather == choice_of<P>) name = deterministic<P>::name;
  });
  return name;
}

template <class A>
inline constexpr bool is_deterministic_v = false;
template <class Inner>
inline constexpr bool is_deterministic_v<deterministic<Inner>> = true;
/// deterministic<automatic>: its all-gather is chosen per call.
template <class A>
inline constexpr bool is_deterministic_automatic_v = std::is_same_v<A, deterministic<automatic>>;

}  // namespace collx::algo
