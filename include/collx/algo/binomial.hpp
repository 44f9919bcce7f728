#pragma once
// Binomial trees: the log-depth building blocks that tree and recursive_halving share.
//
// Ranks are renumbered relative to the root, v = (rank - root) mod N. In the binomial tree of
// reduce, scatter and gather the parent of v is v with its lowest set bit cleared, so every
// subtree is a contiguous range of v:
// the subtree of v is [v, v + lowbit(v)). That contiguity is what lets a reduction keep rank
// order (when the root is 0) and lets scatter/gather move whole ranges of blocks per message.
//   broadcast / reduce: ceil(log2 N) steps; the root sends (or receives) ceil(log2 N)·D bytes.
//   scatter / gather:   ceil(log2 N) steps; the root sends (or receives) (N-1)/N·D bytes.
// Each function appends to a schedule from step time t0 and returns the first free time after it.
#include "problem.hpp"

namespace collx::algo::binomial {

/// Broadcast of `data` (the same region on every rank) from root. This tree is the other
/// binomial tree: the parent of v is v with its highest set bit cleared, so at step k the ranks
/// v < 2^k send to v + 2^k, nearest first (broadcast needs no contiguous subtrees). Launchers
/// place ranks round robin over cores (launch_processes, `mpirun --map-by core`, and Open MPI's
/// default over sockets), so rank v and v + 1 sit on different cores and v and v + 2 on the
/// same one: the first hop crosses between cores and the later ones stay within a core, one
/// cross-core message per core instead of one per hop. 4 processes on 2 cores, 3 alternating
/// runs, `collx-perf --transport shm -np 4 --op broadcast --algo tree -b 8 -e 8K -f 4 -n 20000`:
/// 8 B 0.29-0.39 vs 0.41-0.43 us, 128 B 0.38-0.47 vs 0.62-0.64, 8 KiB 1.75-1.80 vs 2.77-2.79
/// (Open MPI: 0.40-0.48, 0.44-0.45, 2.7 at 512 B).
inline int broadcast(schedule& s, int t0, int rank, int n, int root, region data) {
  const int v = mod(rank - root, n), levels = ceil_log2(n);
  for (int k = 0; k < levels; ++k) {
    const int m = 1 << k;
    if (v < m && v + m < n) {
      s.at(t0 + k);
      s.send(mod(v + m + root, n), data);
    } else if (v >= m && v < 2 * m) {
      s.at(t0 + k);
      s.recv(mod(v - m + root, n), data);
    }
  }
  return t0 + levels;
}

/// Reduce of `src` into `root_dst` at root. Non-root ranks accumulate in `acc` (scratch). With
/// rank_ordered, the tree is rooted at rank 0 — whose subtrees are rank ranges, so combining
/// "mine ⊕ child's" keeps rank order — and rank 0 forwards the result to root in one more step.
inline int reduce(schedule& s, int t0, int rank, int n, int root, region src, region root_dst, region acc,
                  bool rank_ordered) {
  const int tree_root = rank_ordered ? 0 : root;
  const int v = mod(rank - tree_root, n), levels = ceil_log2(n);
  const region mine = rank == root ? root_dst : acc;
  region cur = src;
  for (int k = 0, m = 1; m < n; ++k, m <<= 1) {
    if (v & m) {
      s.at(t0 + k);
      s.send(mod(v - m + tree_root, n), cur);
      break;
    }
    if (v + m < n) {
      s.at(t0 + k);
      s.recv(mod(v + m + tree_root, n), mine, cur, combine::received_right);
      cur = mine;
    }
  }
  int t = t0 + levels;
  if (tree_root != root) {
    if (rank == tree_root) { s.at(t); s.send(root, cur); }
    if (rank == root) { s.at(t); s.recv(tree_root, root_dst); }
    ++t;
  } else if (rank == root) {
    s.copy(root_dst, cur);  // no children (N = 1): the result is the input
  }
  return t;
}

/// Scatter of blocks (a partition indexed by v, laid out in `full` buffers) from root. The root
/// holds every block in `root_buf`; other ranks receive their subtree's blocks into `relay`
/// (same layout) and forward them; at the end each rank's own block is copied to `own`.
inline int scatter(schedule& s, int t0, int rank, int n, int root, const partition& blocks, buf root_buf, buf relay,
                   region own) {
  const int v = mod(rank - root, n), levels = ceil_log2(n);
  const buf holder = v == 0 ? root_buf : relay;
  auto range = [&](buf b, int lo, int hi) {
    return region{b, blocks.offset(lo), blocks.offset(hi) - blocks.offset(lo)};
  };
  for (int k = 0; k < levels; ++k) {
    const int m = 1 << (levels - 1 - k);
    if (v % (2 * m) == 0 && v + m < n) {
      s.at(t0 + k);
      s.send(mod(v + m + root, n), range(holder, v + m, std::min(v + 2 * m, n)));
    } else if (v % (2 * m) == m) {
      s.at(t0 + k);
      s.recv(mod(v - m + root, n), range(relay, v, std::min(v + m, n)));
    }
  }
  s.at(t0 + levels);  // a copy-only step: it runs at the start of whatever step follows
  s.copy(own, range(holder, v, v + 1));
  return t0 + levels;
}

/// Gather of blocks into `full` (the same layout on every rank; each rank's own block must
/// already be at its offset) at root: subtrees send their contiguous range upward.
inline int gather(schedule& s, int t0, int rank, int n, int root, const partition& blocks, buf full) {
  const int v = mod(rank - root, n), levels = ceil_log2(n);
  auto range = [&](int lo, int hi) { return region{full, blocks.offset(lo), blocks.offset(hi) - blocks.offset(lo)}; };
  for (int k = 0, m = 1; m < n; ++k, m <<= 1) {
    if (v & m) {
      s.at(t0 + k);
      s.send(mod(v - m + root, n), range(v, std::min(v + m, n)));
      break;
    }
    if (v + m < n) {
      s.at(t0 + k);
      s.recv(mod(v + m + root, n), range(v + m, std::min(v + 2 * m, n)));
    }
  }
  return t0 + levels;
}

}  // namespace collx::algo::binomial
