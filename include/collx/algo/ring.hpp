#pragma once
// algo::ring — the bandwidth-optimal policy.
//
// Ranks sit on a ring: rank r sends to r+1 and receives from r-1 (mod N). The buffer of D bytes
// is split into N blocks (core/partition.hpp), D/N bytes each.
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

#include "../core/concepts.hpp"
#include "problem.hpp"
#include "profile.hpp"
#include "tuning.hpp"
#include "textbook.hpp"

namespace collx::algo {

/// The loads of a ring step (profile.hpp) over blocks `b`: every rank sends one block to its right
/// and receives the block before it from its left, so the busiest rank moves the largest block,
/// and the largest pair of neighbouring blocks bounds what one rank moves both ways.
inline step_load ring_step_load(const partition& b, int n, std::size_t e, bool reduce) {
  const std::size_t q = b.total / std::size_t(n), rem = b.total % std::size_t(n);
  const std::uint64_t top = b.max_count() * e, pair = (rem >= 2 || rem == 0 ? b.max_count() : q) * e;
  return {std::uint32_t(n), top, pair, reduce ? top : 0, 1};
}

/// The loads of a pipelined chain of n positions and C chunks of `ch` (profile.hpp): at step t
/// position v sends chunk t-v and receives chunk t-v+1 (chain, below), so the chunks in flight
/// are a window that slides along the chain.
inline load_runs chain_loads(int n, const partition& ch, std::size_t e, bool reduce) {
  load_runs r;
  const long long C = ch.parts, N = n;
  if (n < 2) return r;
  for (long long t = 0; t < C + N - 2; ++t) {
    const long long s_lo = std::max(0ll, t - C + 1), s_hi = std::min(N - 2, t);      // positions sending
    const long long r_lo = std::max(1ll, t - C + 2), r_hi = std::min(N - 1, t + 1);  // positions receiving
    const bool any_s = s_lo <= s_hi, any_r = r_lo <= r_hi;
    long long active = (any_s ? s_hi - s_lo + 1 : 0) + (any_r ? r_hi - r_lo + 1 : 0);
    if (any_s && any_r) active -= std::max(0ll, std::min(s_hi, r_hi) - std::max(s_lo, r_lo) + 1);
    long long first = C;  // the lowest chunk index moving (chunks get no larger with the index)
    if (any_s) first = std::min(first, t - s_hi);
    if (any_r) first = std::min(first, t - r_hi + 1);
    const long long b_lo = std::max(s_lo, r_lo), b_hi = std::min(s_hi, r_hi);  // positions doing both
    step_load l;
    l.active = std::uint32_t(active);
    l.bytes = first < C ? ch.count(int(first)) * e : 0;
    l.both = b_lo <= b_hi ? ch.count(int(t - b_hi + 1)) * e : 0;
    l.reduced = reduce && any_r ? ch.count(int(t - r_hi + 1)) * e : 0;
    push_load(r, l);
  }
  return r;
}

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

  /// Loads over all ranks (profile.hpp), without building N schedules of N-1 steps each.
  load_runs reduce_scatter_loads(const rs_problem& p) const {
    load_runs r;
    if (p.size > 1) push_load(r, ring_step_load(p.blocks, p.size, p.elem_size, true), std::uint64_t(p.size - 1));
    return r;
  }
  load_runs all_gather_loads(const ag_problem& p) const {
    load_runs r;
    if (p.size > 1) push_load(r, ring_step_load(p.blocks, p.size, p.elem_size, false), std::uint64_t(p.size - 1));
    return r;
  }
  load_runs broadcast_loads(const bcast_problem& p) const {
    return chain_loads(p.size, chunks(p.count, p.elem_size, chunk_bytes), p.elem_size, false);
  }
  load_runs reduce_loads(const reduce_problem& p) const {
    return chain_loads(p.size, chunks(p.count, p.elem_size, chunk_bytes), p.elem_size, true);
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

  /// The textbook's steps and bytes (algo/textbook.hpp; collx-explain prints them).
  static formula textbook(const textbook_case& k) {
    using W = formula::who;
    const int n = k.n;
    const double D = k.D(), share = k.share();
    const int C = k.chain_chunks();
    const std::string Cs = "C = " + std::to_string(C) + " chunks of 256 KiB";
    switch (k.c) {
      case collective::all_reduce: return k.per_segment({"2(N-1)", 2 * (n - 1), "2(N-1)/N·D", 2 * share, W::each});
      case collective::reduce_scatter:
      case collective::all_gather: return {"N-1", n - 1, "(N-1)/N·D", share, W::each};
      case collective::broadcast: return {"C+N-2, " + Cs, C + n - 2, "D by every rank but the chain's last", D, W::max};
      case collective::reduce:
        return {"C+N-2, " + Cs, C + n - 2, "D, received and reduced, by every rank but the chain's first", D, W::max, 0, true};
      default: return {};
    }
  }
};

}  // namespace collx::algo
