#pragma once
// algo::pairwise — all-to-all by pairwise exchange.
//
// At step s = 1 .. N-1 rank r sends its block for rank r+s and receives the block from rank r-s
// (mod N); its own block is a local copy. Every pair of ranks exchanges exactly once, each rank
// has one send and one receive in flight per step, and the load is the same for every rank:
//   steps N-1; bytes sent per rank = the bytes it addresses to others ((N-1)/N·D when uniform).
// This is the bandwidth-optimal all-to-all (no byte is forwarded); Bruck's log-step variant
// forwards each byte log2 N / 2 times and wins only for tiny blocks.
//
// The same schedule serves all_to_all_v: blocks have per-peer counts, packed in rank order.
//
// all_gather the same way: at step s rank r sends its own block to rank r+s and receives rank
// r-s's. With blocks up to tuning::a2a_one_step_bytes every exchange is in one step, so a small
// all-gather costs one round of latency instead of recursive doubling's log2 N or the ring's
// N-1: steps 1 (else N-1); bytes sent per rank (N-1)/N·D, as the ring.
#include <cstddef>
#include <span>

#include "../core/concepts.hpp"
#include "problem.hpp"
#include "profile.hpp"
#include "tuning.hpp"
#include "textbook.hpp"

namespace collx::algo {

struct a2a_problem {
  int rank = 0, size = 1;
  std::span<const std::size_t> send_counts, send_offsets, recv_counts, recv_offsets;
  std::size_t elem_size = 1;
  bool uniform = false;  // all_to_all (every count equal), as opposed to all_to_all_v
};

struct pairwise {
  using algorithm_policy_concept = algorithm_policy_tag;
  static constexpr const char* name = "pairwise";
  static constexpr bool keeps_rank_order = true;

  schedule all_to_all(const a2a_problem& p) const {
    schedule s;
    const int n = p.size, r = p.rank;
    const auto ur = std::size_t(r);
    s.copy({buf::out, p.recv_offsets[ur], p.recv_counts[ur]}, {buf::in, p.send_offsets[ur], p.send_counts[ur]});
    // Tiny blocks: every exchange in one step, so the transport overlaps them and the call costs
    // one round of latency instead of N-1. Every rank decides alike only if its blocks are all
    // tiny, and each rank sees only its own counts, so the rule uses the uniform all_to_all's
    // count (all_to_all_v always steps).
    const bool one_step = p.uniform && p.send_counts[0] * p.elem_size <= tuning::a2a_one_step_bytes;
    for (int st = 1; st < n; ++st) {
      const auto to = std::size_t(mod(r + st, n)), from = std::size_t(mod(r - st, n));
      if (one_step) s.at(0);
      else s.next_step();
      s.send(int(to), {buf::in, p.send_offsets[to], p.send_counts[to]});
      s.recv(int(from), {buf::out, p.recv_offsets[from], p.recv_counts[from]});
    }
    return s;
  }

  /// Loads over all ranks (profile.hpp), without building N schedules of 2(N-1) messages.
  load_runs all_gather_loads(const ag_problem& p) const {
    load_runs r;
    const int n = p.size;
    if (n < 2) return r;
    const std::uint64_t e = p.elem_size, q = p.blocks.total / std::size_t(n), rem = p.blocks.total % std::size_t(n);
    if (p.blocks.max_count() * p.elem_size <= tuning::a2a_one_step_bytes) {
      // one step: a rank with block c sends it to n-1 peers and receives everything else
      step_load l{std::uint32_t(n), 0, 0, 0, 1};
      for (const std::uint64_t c : {q + 1, q}) {
        if ((c == q + 1 && rem == 0) || (c == q && rem == std::uint64_t(n))) continue;  // no rank has such a block
        const std::uint64_t out = std::uint64_t(n - 1) * c * e, in = (p.blocks.total - c) * e;
        l.bytes = std::max({l.bytes, out, in});
        l.both = std::max(l.both, std::min(out, in));
      }
      push_load(r, l);
      return r;
    }
    // step st: own block to rank+st, block of rank-st received; the first `rem` blocks are larger
    for (int st = 1; st < n; ++st) {
      const bool pair_large = rem > 0 && (rem > std::uint64_t(st) || rem + std::uint64_t(st) > std::uint64_t(n));
      push_load(r, {std::uint32_t(n), p.blocks.max_count() * e, (pair_large ? q + 1 : q) * e, 0, 1});
    }
    return r;
  }

  schedule all_gather(const ag_problem& p) const {
    schedule s;
    const int n = p.size, v = p.rank;
    if (!p.in_place) s.copy(p.block(v), {buf::in, 0, p.blocks.count(v)});
    // Every rank knows the whole partition, so all decide alike.
    const bool one_step = p.blocks.max_count() * p.elem_size <= tuning::a2a_one_step_bytes;
    for (int st = 1; st < n; ++st) {
      if (one_step) s.at(0);
      else s.next_step();
      s.send(p.actual(v + st), p.own());
      s.recv(p.actual(v - st), p.block(mod(v - st, n)));
    }
    return s;
  }

  /// The textbook's steps and bytes (algo/textbook.hpp; collx-explain prints them).
  static formula textbook(const textbook_case& k) {
    using W = formula::who;
    if (k.bytes / std::size_t(k.n) <= tuning::a2a_one_step_bytes)
      return {"1 (blocks of at most 1 MiB: every exchange at once)", 1, "(N-1)/N·D", k.share(), W::each};
    return {"N-1", k.n - 1, "(N-1)/N·D", k.share(), W::each};
  }
};

}  // namespace collx::algo
