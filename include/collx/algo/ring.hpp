#pragma once
// algo::ring — the bandwidth-optimal policy.
//
// Ranks sit on a ring: rank r sends to r+1 and receives from r-1 (mod N). The buffer of D bytes
// is split into N blocks (partition.hpp), D/N bytes each.
//
// Reduce-scatter, N-1 steps. At step s rank r sends its partial sum of block (r-1-s) to r+1 and
// receives the partial of block (r-2-s) from r-1, which it combines with its own copy of that
// block. A block's partial starts at the rank after its owner and travels once round the ring,
// gaining one contribution per hop; after N-1 hops it arrives, complete, at its owner.
//   steps N-1; each rank sends and receives (N-1)/N·D bytes and reduces (N-1)/N·D bytes.
//
// All-gather, N-1 steps. At step s rank r forwards block (r-s) to r+1 and receives block
// (r-s-1) from r-1: the same rotation without the reduction.
//   steps N-1; each rank sends and receives (N-1)/N·D bytes.
//
// All-reduce = reduce-scatter + all-gather: 2(N-1) steps and 2(N-1)/N·D bytes sent per rank,
// which is optimal (every byte of the result must leave each rank's share once and arrive once),
// so T = 2(N-1)·α + 2(N-1)/N·D·β + (N-1)/N·D·γ. The price is latency linear in N, which is why
// small messages go to the log-step policies instead.
//
// Broadcast and reduce run the ring as a chain rooted at the root, pipelined: the buffer is cut
// into C chunks of chunk_bytes and chunk c crosses hop h at step c+h, so after the pipeline fills
// every link is busy: C+N-2 steps, each rank sends D bytes at most: T ≈ (C+N-2)·(α + D/C·β).
//
// Ring order is cyclic, not rank order, so a non-commutative op cannot be honoured here:
// reducing collectives refuse it at compile time (use tree or recursive_halving).
#include <cstddef>

#include "../concepts.hpp"
#include "problem.hpp"
#include "tuning.hpp"

namespace collx::algo {

/// A pipelined chain of n ranks, this one at position v: chunk c crosses the hop from position
/// h to h+1 at step c+h, so a rank receives chunk c at step c+v-1 and forwards it at step c+v.
template <class Send, class Recv>
void chain(schedule& s, int n, int v, int nchunks, Send send, Recv recv) {
  for (int t = 0; t < nchunks + n - 2; ++t) {
    const int c_send = t - v, c_recv = t - v + 1;
    const bool snd = v < n - 1 && c_send >= 0 && c_send < nchunks;
    const bool rcv = v > 0 && c_recv >= 0 && c_recv < nchunks;
    if (!snd && !rcv) continue;
    s.at(t);
    if (snd) send(c_send);
    if (rcv) recv(c_recv);
  }
}

struct ring {
  using algorithm_policy_concept = algorithm_policy_tag;
  static constexpr const char* name = "ring";
  static constexpr bool keeps_rank_order = false;

  /// Pipeline chunk of the chain broadcast/reduce.
  std::size_t chunk_bytes = tuning::pipeline_chunk_bytes;

  schedule reduce_scatter(const rs_problem& p) const {
    schedule s;
    const int n = p.size, r = p.rank;
    const region result = p.result();
    if (n == 1) {
      s.copy(result, p.block(p.src, 0));
      return s;
    }
    const bool compact = p.work == buf::none;
    const std::size_t maxc = p.blocks.max_count();
    if (compact && n > 2) s.need_tmp(2 * maxc);
    // Where the partial of block b lives after step `st`: in the full-layout work buffer, or in
    // one of two scratch slots used alternately (the one being sent is never the one received).
    auto partial = [&](int b, int st) -> region {
      return compact ? region{buf::tmp, std::size_t(st % 2) * maxc, p.blocks.count(b)} : p.block(p.work, b);
    };
    const int right = mod(r + 1, n), left = mod(r - 1, n);
    for (int st = 0; st < n - 1; ++st) {
      s.next_step();
      const int sb = mod(r - 1 - st, n), rb = mod(r - 2 - st, n);
      s.send(right, st == 0 ? p.block(p.src, sb) : partial(sb, st - 1));
      s.recv(left, st == n - 2 ? result : partial(rb, st), p.block(p.src, rb), combine::received_left);
    }
    return s;
  }

  schedule all_gather(const ag_problem& p) const {
    schedule s;
    const int n = p.size, v = p.rank;
    if (!p.in_place) s.copy(p.block(v), {buf::in, 0, p.blocks.count(v)});
    for (int st = 0; st < n - 1; ++st) {
      s.next_step();
      s.send(p.actual(v + 1), st == 0 ? p.own() : p.block(mod(v - st, n)));
      s.recv(p.actual(v - 1), p.block(mod(v - st - 1, n)));
    }
    return s;
  }

  schedule broadcast(const bcast_problem& p) const {
    schedule s;
    const int n = p.size, v = mod(p.rank - p.root, n);  // position on the chain from the root
    const partition ch = chunks(p.count, p.elem_size, chunk_bytes);
    auto chunk = [&](int c) { return region{buf::out, ch.offset(c), ch.count(c)}; };
    chain(s, n, v, ch.parts, [&](int c) { s.send(mod(p.rank + 1, n), chunk(c)); },
          [&](int c) { s.recv(mod(p.rank - 1, n), chunk(c)); });
    return s;
  }

  schedule reduce(const reduce_problem& p) const {
    schedule s;
    const int n = p.size;
    const region whole_in{buf::in, 0, p.count};
    if (n == 1) {
      s.copy({buf::out, 0, p.count}, whole_in);
      return s;
    }
    // The chain runs root+1, root+2, ..., root: v is the position on it, the root is last.
    const int v = mod(p.rank - p.root - 1, n);
    const partition ch = chunks(p.count, p.elem_size, chunk_bytes);
    const buf acc = v == n - 1 ? buf::out : buf::tmp;
    if (v > 0 && v < n - 1) s.need_tmp(p.count);
    auto chunk = [&](buf b, int c) { return region{b, ch.offset(c), ch.count(c)}; };
    chain(s, n, v, ch.parts, [&](int c) { s.send(mod(p.rank + 1, n), chunk(v == 0 ? buf::in : acc, c)); },
          [&](int c) { s.recv(mod(p.rank - 1, n), chunk(acc, c), chunk(buf::in, c), combine::received_left); });
    return s;
  }
};

}  // namespace collx::algo
