#pragma once
// What the baseline drivers (mpi-perf, gloo-perf) share: collx-perf's flags, shapes, check
// values, columns and sweep, so their rows compare line by line with collx-perf's. A driver
// supplies a backend (see run_size) that calls its library. Conventions, as in collx-perf:
//   size    bytes of the largest buffer a rank passes: the buffer of all_reduce and broadcast; the n·k
//           input of reduce_scatter, the n·k output of all_gather, the n·k send buffer of all_to_all
//           (rounded down to whole elements, and to a multiple of n elements where split in n blocks).
//   count   all elements for all_reduce/broadcast; k per rank for reduce_scatter/all_gather; k per peer
//           for all_to_all.
//   time    average per call (us), measured on rank 0 between two barriers around the timed loop,
//           after -w warm-up calls.
//   algbw   size / time in GB/s (1e9); busbw = algbw × 2(n-1)/n (all_reduce), (n-1)/n (reduce_scatter,
//           all_gather, all_to_all), 1 (broadcast).
//   #wrong  after the timed loop, one more call on small-integer inputs (exact in any order of
//           summation), compared with a serial reference on every rank; summed over ranks.
// Only float and sum: the baselines are for collx-perf's default dtype and op. Buffers are
// allocated once per size and written before the first call so page faults are not timed.
#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include <collx/algo/collectives.hpp>

#include "cli.hpp"

namespace baseline {

using bench_cli::parse_int;
using bench_cli::parse_size;
using bench_cli::usage_error;


/// The flags (bench_cli::sweep_flags: nccl-tests'); algo is which of a driver's algorithms (gloo-perf)
/// or "all", ranks the -np of drivers that start their own ranks (gloo-perf).
struct config : bench_cli::sweep_flags {};

/// The collectives, and their names, bus factors and kinds, are collx's one list
/// (algo/collectives.hpp).
using coll = collx::algo::collective;

struct coll_info {
  coll c;
  const char* name;
  const char* bus;
  bool reduces, rooted;
  constexpr explicit coll_info(coll x)
      : c(x), name(collx::algo::traits(x).name), bus(collx::algo::traits(x).bus), reduces(collx::algo::traits(x).reduces),
        rooted(collx::algo::traits(x).rooted) {}
};

/// The collectives the baseline drivers time: every one of the list but reduce.
constexpr coll_info kColls[] = {coll_info(coll::all_reduce), coll_info(coll::reduce_scatter), coll_info(coll::all_gather),
                                coll_info(coll::broadcast), coll_info(coll::all_to_all)};

inline double bus_factor(coll c, int n) { return collx::algo::traits(c).bus_factor(n); }

/// One call's buffer sizes in elements, and the row's size and count columns (as collx-perf's shape).
struct shape {
  std::size_t bytes = 0, count = 0, in = 0, out = 0, k = 0;
};

inline shape make_shape(coll c, std::size_t bytes, int n) {
  const std::size_t es = sizeof(float), un = std::size_t(n);
  switch (c) {
    case coll::all_reduce:
    case coll::reduce: {
      const std::size_t e = bytes / es;
      return {e * es, e, e, e, 0};
    }
    case coll::broadcast: {
      const std::size_t e = bytes / es;
      return {e * es, e, 0, e, 0};
    }
    case coll::reduce_scatter: {
      const std::size_t k = bytes / es / un, t = k * un;
      return {t * es, k, t, k, k};
    }
    case coll::all_gather: {
      const std::size_t k = bytes / es / un, t = k * un;
      return {t * es, k, k, t, k};
    }
    case coll::all_to_all: {
      const std::size_t k = bytes / es / un, t = k * un;
      return {t * es, k, t, t, k};
    }
  }
  return {};
}

// Inputs of the check, as collx-perf's pattern for float: sum takes (i + 3r) mod 16 (sums of at
// most 16·n small integers are exact in float), collectives that move take (5i + 11r) mod 251 - 125.
inline float sum_value(int r, std::size_t i) { return float(long((i + 3 * std::size_t(r)) % 16)); }
inline float move_value(int r, std::size_t i) { return float(long((i * 5 + std::size_t(r) * 11) % 251) - 125); }
constexpr float kPoison = -1000.0f;  // no check input gives it

/// The value rank r's output element j must hold after one call.
inline float expect(coll c, const shape& sh, int n, int r, int root, std::size_t j) {
  switch (c) {
    case coll::all_reduce:
    case coll::reduce_scatter: {
      const std::size_t i = c == coll::all_reduce ? j : std::size_t(r) * sh.k + j;
      float acc = sum_value(0, i);
      for (int q = 1; q < n; ++q) acc += sum_value(q, i);
      return acc;
    }
    case coll::all_gather: return move_value(int(j / sh.k), j % sh.k);
    case coll::broadcast: return move_value(root, j);
    case coll::all_to_all: return move_value(int(j / sh.k), std::size_t(r) * sh.k + j % sh.k);
    case coll::reduce: break;  // (not timed: kColls)
  }
  return 0;
}

struct row {
  shape sh;
  double us = 0;
  unsigned long long wrong = 0;  // summed over ranks (valid on rank 0)
};

/// B (a driver's backend) supplies: invoke(coll, in, out, shape, root), barrier(),
/// sum_to_root(unsigned long long) (the total on rank 0), and algo() (the algo column). A
/// backend whose buffers live elsewhere (collx-perf-cuda's, in device memory) also supplies
/// upload(in, out), which copies the host buffers to its own (after they are written, and
/// again before the check), and download(out), which copies its result back after the check's
/// call; its invoke then runs on its own buffers, not on the host pointers it is given.
template <class B>
row run_size(B& be, const config& cfg, const coll_info& ci, std::size_t bytes, int rank, int n) {
  row res;
  res.sh = make_shape(ci.c, bytes, n);
  const shape& sh = res.sh;
  const int root = ci.rooted ? cfg.root : -1;
  auto value = [&](int r, std::size_t i) { return ci.reduces ? sum_value(r, i) : move_value(r, i); };

  // Allocated once per size and written (touched) before any call.
  std::vector<float> in(sh.in), out(sh.out);
  for (std::size_t i = 0; i < in.size(); ++i) in[i] = value(rank, i);
  if (ci.c == coll::broadcast && rank == root)
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = value(rank, i);
  else std::fill(out.begin(), out.end(), 0.0f);
  auto upload = [&] {
    if constexpr (requires { be.upload(in, out); }) be.upload(in, out);
  };
  upload();

  for (int i = 0; i < cfg.warmup; ++i) be.invoke(ci.c, in.data(), out.data(), sh, root);
  be.barrier();
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < cfg.iters; ++i) be.invoke(ci.c, in.data(), out.data(), sh, root);
  be.barrier();
  const auto t1 = std::chrono::steady_clock::now();
  res.us = std::chrono::duration<double, std::micro>(t1 - t0).count() / cfg.iters;

  if (cfg.check) {
    if (!(ci.c == coll::broadcast && rank == root)) std::fill(out.begin(), out.end(), kPoison);
    if constexpr (requires { be.before_check(); }) be.before_check();  // in-place drivers start afresh
    upload();
    be.invoke(ci.c, in.data(), out.data(), sh, root);
    if constexpr (requires { be.download(out); }) be.download(out);
    unsigned long long bad = 0;
    for (std::size_t j = 0; j < out.size(); ++j) bad += !(out[j] == expect(ci.c, sh, n, rank, root, j));
    res.wrong = be.sum_to_root(bad);
  }
  return res;
}

/// The sweep; prints on rank 0 only. Returns the wrong elements over all sizes (rank 0).
template <class B>
unsigned long long sweep(B& be, const config& cfg, const coll_info& ci, int rank, int n) {
  const double f = bus_factor(ci.c, n);
  if (rank == 0) {
    std::printf("# %s  %s  transport: %s  ranks: %d (%s)\n", B::program, ci.name, B::transport, n, B::ranks_are);
    bench_cli::print_sweep_header(cfg, ci.bus, f, n);
    std::fflush(stdout);
  }
  unsigned long long wrong_all = 0;
  double sum_bw = 0;
  int rows = 0;
  for (std::size_t bytes = cfg.minbytes; bytes <= cfg.maxbytes;) {
    const row rw = run_size(be, cfg, ci, bytes, rank, n);
    if (rank == 0) {
      wrong_all += rw.wrong;
      const double busbw = bench_cli::print_row(rw.sh.bytes, rw.sh.count, "float", ci.reduces ? "sum" : "none",
                                                ci.rooted ? cfg.root : -1, rw.us, f, cfg.check, rw.wrong, be.algo());
      std::fflush(stdout);
      sum_bw += busbw;
      ++rows;
    }
    const std::size_t nb = bench_cli::next_size(cfg, bytes);
    if (nb <= bytes) break;
    bytes = nb;
  }
  if (rank == 0) {
    if (cfg.check) std::printf("# Out of bounds values : %llu %s\n", wrong_all, wrong_all == 0 ? "OK" : "FAILED");
    std::printf("# Avg bus bandwidth    : %s %.2f\n#\n", be.algo(), rows ? sum_bw / rows : 0.0);
    std::fflush(stdout);
  }
  return wrong_all;
}

// ---- command line (collx-perf's flags, less what a baseline cannot vary) ---------------------
/// n: the rank count when the launcher decides it (mpirun), else 0 (read -np). `more(flag,
/// value)` takes a driver's own flags (returns false for one it does not know either).
template <class More>
config parse(int argc, char** argv, int n, More more) {
  config cfg;
  bench_cli::parse_flags(argc, argv, cfg, more);
  if (n != 0 && cfg.ranks != 0) throw usage_error("-np: the ranks come from the launcher here");
  if (n == 0) n = cfg.ranks = cfg.ranks == 0 ? 2 : cfg.ranks;
  if (cfg.root >= n)
    throw usage_error("-r " + std::to_string(cfg.root) + " is not a rank of [0, " + std::to_string(n) + ")");
  if (cfg.dtype != "float") throw usage_error("datatype -d '" + cfg.dtype + "': this driver measures float only");
  if (cfg.redop != "sum") throw usage_error("--redop '" + cfg.redop + "': this driver measures sum only");
  return cfg;
}

inline config parse(int argc, char** argv, int n) {
  return parse(argc, argv, n, [](const std::string&, auto&&) { return false; });
}

inline const coll_info* find_coll(const std::string& name) {
  for (const auto& c : kColls)
    if (name == c.name) return &c;
  return nullptr;
}

}  // namespace baseline

