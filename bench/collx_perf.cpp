// collx-perf: an nccl-tests-style benchmark of one collective, over the thread transport.
//
//   collx-perf -np 8 -b 8 -e 64M -f 4 --op all_reduce --algo all -d float --redop sum
//   collx-perf --demo
//
// The flags, the columns and the bandwidth conventions are nccl-tests' (doc/PERFORMANCE.md), so
// numbers read the same way as published ones:
//   size    bytes of the largest buffer a rank passes: the buffer of all_reduce, broadcast and reduce;
//           the n·k input of reduce_scatter, the n·k output of all_gather, the n·k send buffer of
//           all_to_all. Sizes are rounded down to whole elements (and to a multiple of n elements
//           where the buffer is split in n blocks).
//   count   the count argument: all elements for all_reduce/broadcast/reduce, the k per rank for
//           reduce_scatter and all_gather, the k per peer for all_to_all.
//   time    average per call, measured on rank 0 between two barriers around the timed loop (us).
//   algbw   size / time, in GB/s (1 GB = 1e9 B).
//   busbw   algbw × the collective's factor: 2(n-1)/n for all_reduce, (n-1)/n for reduce_scatter,
//           all_gather and all_to_all, 1 for broadcast and reduce: the bytes each rank's link must
//           carry per second, which does not depend on n for an optimal algorithm.
//   #wrong  after the timed loop (-c 1) each collective runs once more on inputs whose result is
//           exactly representable (small integers: every order of combining gives the same value)
//           and every rank counts the elements that differ from a serial reference; summed over ranks.
//
// Instantiation: the dtype × op × policy choice is a runtime switch over ONE list of each (below),
// so the binary holds what the flags can reach and nothing else. The buffers, the timed loop and
// the check are instantiated per collective × dtype × op; a policy adds only a thin function that
// makes the call. Collectives that reduce nothing move bytes, so they run on an unsigned carrier
// of the element's size (float and int32 share one instantiation).
#include <algorithm>
#include <bit>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <limits>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <sys/mman.h>

#include <collx/collx.hpp>

#include "cli.hpp"

namespace {

using bench_cli::parse_int;
using bench_cli::parse_size;
using bench_cli::usage_error;

using comm_t = collx::communicator<collx::transport::any>;

template <class... Ts>
struct list {};

template <class... Ts, class F>
void for_each(list<Ts...>, F&& f) {
  (f(std::type_identity<Ts>{}), ...);
}

// ---- dtypes ---------------------------------------------------------------------------------
// exact: every integer in [0, exact] is representable, so sums of small integers up to it are
// exact in any order. max_log2: 2^max_log2 is representable (prod of 1s and 2s stays exact).
template <class E>
struct dtype;
template <>
struct dtype<float> {
  static constexpr const char* name = "float";
  static constexpr double exact = 16777216.0, max_log2 = 100;
};
template <>
struct dtype<double> {
  static constexpr const char* name = "double";
  static constexpr double exact = 9007199254740992.0, max_log2 = 100;
};
template <>
struct dtype<std::int32_t> {
  static constexpr const char* name = "int32";
  static constexpr double exact = 2147483647.0, max_log2 = 30;
};
template <>
struct dtype<std::int64_t> {
  static constexpr const char* name = "int64";
  static constexpr double exact = 9.2e18, max_log2 = 62;
};
template <>
struct dtype<collx::half> {
  static constexpr const char* name = "half";
  static constexpr double exact = 2048.0, max_log2 = 15;
};
template <>
struct dtype<collx::bfloat16> {
  static constexpr const char* name = "bfloat16";
  static constexpr double exact = 256.0, max_log2 = 100;
};

using dtypes = list<float, double, std::int32_t, std::int64_t, collx::half, collx::bfloat16>;
using redops = list<collx::ops::sum, collx::ops::prod, collx::ops::min, collx::ops::max, collx::ops::avg>;
using policies = list<collx::algo::ring, collx::algo::tree, collx::algo::recursive_halving, collx::algo::pairwise,
                      collx::algo::automatic>;

/// The op of collectives that reduce nothing (printed as nccl-tests does).
struct no_redop {
  static constexpr const char* name = "none";
};

template <class T>
constexpr const char* name_of() {
  if constexpr (requires { T::name; }) return T::name;
  else return dtype<T>::name;
}

template <class... Ts>
std::string names(list<Ts...>, const char* sep = "|") {
  std::string s;
  ((s += (s.empty() ? "" : sep), s += name_of<Ts>()), ...);
  return s;
}

/// Calls f(type_identity<T>) for the T of the list named `name`; false when none is.
template <class... Ts, class F>
bool dispatch(list<Ts...>, std::string_view name, F&& f) {
  return ((name == name_of<Ts>() && (f(std::type_identity<Ts>{}), true)) || ...);
}

template <std::size_t N>
using uint_of_size = std::conditional_t<N == 1, std::uint8_t,
                                        std::conditional_t<N == 2, std::uint16_t,
                                                           std::conditional_t<N == 4, std::uint32_t, std::uint64_t>>>;

template <class E>
E from_int(long v) {
  if constexpr (collx::is_reduced_float_v<E>) return E(float(v));
  else return static_cast<E>(v);
}

// ---- the check's inputs ---------------------------------------------------------------------
/// Input element i of rank r: small integers whose reduction is exact for this dtype at n ranks.
template <class E, class Op>
struct pattern {
  std::size_t m = 1, q = 8;
  explicit pattern(int n) {
    const double exact = dtype<E>::exact, max_log2 = dtype<E>::max_log2;
    m = std::size_t(std::clamp(exact / n + 1, 1.0, 16.0));                   // sum: values in [0, m)
    q = std::max<std::size_t>(8, std::size_t((n + max_log2 - 1) / max_log2));  // prod: a 2 every q ranks
  }
  E operator()(int r, std::size_t i) const {
    const auto ur = std::size_t(r);
    if constexpr (std::is_same_v<Op, collx::ops::sum> || std::is_same_v<Op, collx::ops::avg>)
      return from_int<E>(long((i + 3 * ur) % m));
    else if constexpr (std::is_same_v<Op, collx::ops::prod>)
      return from_int<E>((i + ur) % q == 0 ? 2 : 1);
    else if constexpr (std::is_same_v<Op, collx::ops::min> || std::is_same_v<Op, collx::ops::max>)
      return from_int<E>(long((i * 7 + ur * 13) % 61) - 30);
    else  // moved, not reduced: distinct per rank and index
      return from_int<E>(long((i * 5 + ur * 11) % 251) - 125);
  }
};

// ---- collectives ----------------------------------------------------------------------------
/// One call's buffer sizes, in elements, and its row's size and count columns.
struct shape {
  std::size_t bytes = 0;    // "size"
  std::size_t count = 0;    // "count"
  std::size_t in = 0;       // each rank's input
  std::size_t out = 0;      // each rank's output (reduce: the root's)
  std::size_t k = 0;        // block per rank or per peer
  std::size_t ref = 0;      // elements of the host reference (reducing collectives)
};

template <class S>
using invoke_fn = void (*)(comm_t&, std::span<const S>, std::span<S>, int);

/// What the check compares an output element with.
template <class S, class V>
struct check_ctx {
  const V& value;                 // value(rank, i): rank's input element i
  std::span<const S> ref;         // the serial reduction (reducing collectives)
  int n, root;
  std::size_t k;
};

template <class A>
inline constexpr bool is_pairwise_v = std::is_same_v<A, collx::algo::pairwise>;

struct all_reduce_c {
  static constexpr const char* name = "all_reduce";
  static constexpr bool reduces = true, rooted = false, in_place = false, out_at_root = false;
  static constexpr const char* bus = "2(n-1)/n";
  static constexpr const char* what = "every rank ends with the element-wise reduction of all ranks' buffers";
  static constexpr const char* size_doc = "bytes of each rank's buffer; count: its elements";
  static double bus_factor(int n) { return 2.0 * (n - 1) / n; }
  template <class A>
  static constexpr bool supports = !is_pairwise_v<A>;
  static shape make(std::size_t bytes, std::size_t es, int) {
    const std::size_t c = bytes / es;
    return {c * es, c, c, c, 0, c};
  }
  template <class S, class Op, class A>
  static void call(comm_t& c, std::span<const S> in, std::span<S> out, int) {
    collx::all_reduce(c, in, out, Op{}, A{});
  }
  template <class S, class V>
  static S expect(const check_ctx<S, V>& x, int, std::size_t j) { return x.ref[j]; }
};

struct reduce_scatter_c {
  static constexpr const char* name = "reduce_scatter";
  static constexpr bool reduces = true, rooted = false, in_place = false, out_at_root = false;
  static constexpr const char* bus = "(n-1)/n";
  static constexpr const char* what = "rank r ends with the reduction of every rank's r-th block (k elements)";
  static constexpr const char* size_doc = "bytes of the n*k input; count: k, the elements each rank receives";
  static double bus_factor(int n) { return double(n - 1) / n; }
  template <class A>
  static constexpr bool supports = !is_pairwise_v<A>;
  static shape make(std::size_t bytes, std::size_t es, int n) {
    const std::size_t k = bytes / es / std::size_t(n), t = k * std::size_t(n);
    return {t * es, k, t, k, k, t};
  }
  template <class S, class Op, class A>
  static void call(comm_t& c, std::span<const S> in, std::span<S> out, int) {
    collx::reduce_scatter(c, in, out, Op{}, A{});
  }
  template <class S, class V>
  static S expect(const check_ctx<S, V>& x, int r, std::size_t j) { return x.ref[std::size_t(r) * x.k + j]; }
};

struct all_gather_c {
  static constexpr const char* name = "all_gather";
  static constexpr bool reduces = false, rooted = false, in_place = false, out_at_root = false;
  static constexpr const char* bus = "(n-1)/n";
  static constexpr const char* what = "every rank ends with all ranks' k-element blocks, in rank order";
  static constexpr const char* size_doc = "bytes of the n*k output; count: k, the elements each rank sends";
  static double bus_factor(int n) { return double(n - 1) / n; }
  template <class A>
  static constexpr bool supports = !is_pairwise_v<A>;
  static shape make(std::size_t bytes, std::size_t es, int n) {
    const std::size_t k = bytes / es / std::size_t(n), t = k * std::size_t(n);
    return {t * es, k, k, t, k, 0};
  }
  template <class S, class Op, class A>
  static void call(comm_t& c, std::span<const S> in, std::span<S> out, int) {
    collx::all_gather(c, in, out, A{});
  }
  template <class S, class V>
  static S expect(const check_ctx<S, V>& x, int, std::size_t j) { return x.value(int(j / x.k), j % x.k); }
};

struct broadcast_c {
  static constexpr const char* name = "broadcast";
  static constexpr bool reduces = false, rooted = true, in_place = true, out_at_root = false;
  static constexpr const char* bus = "1";
  static constexpr const char* what = "every rank ends with the root's buffer";
  static constexpr const char* size_doc = "bytes of the buffer; count: its elements";
  static double bus_factor(int) { return 1.0; }
  template <class A>
  static constexpr bool supports = !is_pairwise_v<A>;
  static shape make(std::size_t bytes, std::size_t es, int) {
    const std::size_t c = bytes / es;
    return {c * es, c, 0, c, 0, 0};
  }
  template <class S, class Op, class A>
  static void call(comm_t& c, std::span<const S>, std::span<S> buf, int root) {
    collx::broadcast(c, buf, root, A{});
  }
  template <class S, class V>
  static S expect(const check_ctx<S, V>& x, int, std::size_t j) { return x.value(x.root, j); }
};

struct reduce_c {
  static constexpr const char* name = "reduce";
  static constexpr bool reduces = true, rooted = true, in_place = false, out_at_root = true;
  static constexpr const char* bus = "1";
  static constexpr const char* what = "the root ends with the element-wise reduction of all ranks' buffers";
  static constexpr const char* size_doc = "bytes of each rank's buffer; count: its elements";
  static double bus_factor(int) { return 1.0; }
  template <class A>
  static constexpr bool supports = !is_pairwise_v<A>;
  static shape make(std::size_t bytes, std::size_t es, int) {
    const std::size_t c = bytes / es;
    return {c * es, c, c, c, 0, c};
  }
  template <class S, class Op, class A>
  static void call(comm_t& c, std::span<const S> in, std::span<S> out, int root) {
    collx::reduce(c, in, out, Op{}, root, A{});
  }
  template <class S, class V>
  static S expect(const check_ctx<S, V>& x, int, std::size_t j) { return x.ref[j]; }
};

struct all_to_all_c {
  static constexpr const char* name = "all_to_all";
  static constexpr bool reduces = false, rooted = false, in_place = false, out_at_root = false;
  static constexpr const char* bus = "(n-1)/n";
  static constexpr const char* what = "rank r sends its j-th k-element block to rank j (MoE token dispatch)";
  static constexpr const char* size_doc = "bytes of each rank's n*k send buffer; count: k, the elements per peer";
  static double bus_factor(int n) { return double(n - 1) / n; }
  template <class A>
  static constexpr bool supports = is_pairwise_v<A> || std::is_same_v<A, collx::algo::automatic>;
  static shape make(std::size_t bytes, std::size_t es, int n) {
    const std::size_t k = bytes / es / std::size_t(n), t = k * std::size_t(n);
    return {t * es, k, t, t, k, 0};
  }
  template <class S, class Op, class A>
  static void call(comm_t& c, std::span<const S> in, std::span<S> out, int) {
    collx::all_to_all(c, in, out, A{});
  }
  template <class S, class V>
  static S expect(const check_ctx<S, V>& x, int r, std::size_t j) {
    return x.value(int(j / x.k), std::size_t(r) * x.k + j % x.k);
  }
};

using collectives = list<all_reduce_c, reduce_scatter_c, all_gather_c, broadcast_c, reduce_c, all_to_all_c>;

// ---- configuration --------------------------------------------------------------------------

struct config : bench_cli::sweep_flags {
  std::string transport = "threads";
  bool demo = false;
  config() {
    ranks = 8;
    algo = "all";
  }
};

// ---- running one size -----------------------------------------------------------------------
struct row {
  shape sh;
  double us = 0;
  std::vector<std::size_t> wrong;  // per rank
};

inline const char* transport_words(const std::string& t) {
  return t == "shm" ? "processes over shared memory" : t == "tcp" ? "processes over tcp (127.0.0.1)" : "threads of this process";
}

/// The transport every run uses: "threads", "shm" or "tcp" (set once from --transport).
std::string g_transport = "threads";

/// What ranks report back: in memory shared with forked ranks (MAP_SHARED | MAP_ANONYMOUS), so
/// it works the same whether the ranks are threads or processes.
struct report {
  static constexpr int kMaxRanks = 1024;
  double us;
  std::size_t wrong[kMaxRanks];
};
report& shared_report() {
  static report* r = [] {
    void* p = mmap(nullptr, sizeof(report), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::runtime_error("collx-perf: cannot map the report area");
    return static_cast<report*>(p);
  }();
  return *r;
}

/// One instantiation of every collective for the whole binary: the transport is type-erased
/// (transport::any) and a rank's body is a std::function.
void launch(int n, const std::function<void(comm_t&)>& body) {
  if (g_transport == "shm") collx::launch_processes<collx::transport::as_any>(n, body);
  else if (g_transport == "tcp") collx::launch_processes<collx::transport::as_any>(n, body, collx::options{}, collx::transport::tcp_config{});
  else collx::launch_threads<collx::transport::as_any>(n, body);
}

/// Storage type: E for reducing collectives, an unsigned carrier of E's size for the others.
template <class C, class E>
using storage_t = std::conditional_t<C::reduces, E, uint_of_size<sizeof(E)>>;

template <class C, class E, class Op>
[[gnu::noinline]] row run_size(const config& cfg, invoke_fn<storage_t<C, E>> invoke, std::size_t bytes) {
  using S = storage_t<C, E>;
  const int n = cfg.ranks, root = C::rooted ? cfg.root : -1;
  const pattern<E, Op> gen(n);
  auto value = [&gen](int r, std::size_t i) -> S {
    if constexpr (C::reduces) return gen(r, i);
    else return std::bit_cast<S>(gen(r, i));
  };
  S poison;
  if constexpr (C::reduces) poison = from_int<E>(-1000);  // no check input reduces to it (see pattern)
  else poison = std::bit_cast<S>(from_int<E>(-1000));

  row res;
  res.sh = C::make(bytes, sizeof(E), n);
  res.wrong.assign(std::size_t(n), 0);
  const shape& sh = res.sh;

  // The serial reference: every rank's input folded in rank order, then finalized (avg).
  std::vector<S> ref;
  if constexpr (C::reduces) {
    if (cfg.check) {
      ref.resize(sh.ref);
      const Op op{};
      for (std::size_t i = 0; i < sh.ref; ++i) {
        S acc = value(0, i);
        for (int r = 1; r < n; ++r) acc = op(acc, value(r, i));
        if constexpr (collx::has_finalize_v<Op, S>) acc = Op::finalize(acc, n);
        ref[i] = acc;
      }
    }
  }
  const check_ctx<S, decltype(value)> ctx{value, ref, n, root, sh.k};

  report& rep = shared_report();
  rep.us = 0;
  std::fill(rep.wrong, rep.wrong + std::min(n, report::kMaxRanks), std::size_t(0));
  launch(n, [&](comm_t& comm) {
    const int r = comm.rank();
    const bool has_out = !C::out_at_root || r == root;
    std::vector<S> in(sh.in), out(has_out ? sh.out : 0);
    for (std::size_t i = 0; i < in.size(); ++i) in[i] = value(r, i);
    if (C::in_place && r == root)
      for (std::size_t i = 0; i < out.size(); ++i) out[i] = value(r, i);
    const std::span<const S> cin{in};
    const std::span<S> sout{out};

    for (int i = 0; i < cfg.warmup; ++i) invoke(comm, cin, sout, root);
    collx::barrier(comm);
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < cfg.iters; ++i) invoke(comm, cin, sout, root);
    collx::barrier(comm);
    const auto t1 = std::chrono::steady_clock::now();
    if (r == 0) shared_report().us = std::chrono::duration<double, std::micro>(t1 - t0).count() / cfg.iters;

    if (cfg.check) {
      if (!(C::in_place && r == root)) std::fill(out.begin(), out.end(), poison);
      invoke(comm, cin, sout, root);
      std::size_t bad = 0;
      for (std::size_t j = 0; j < out.size(); ++j) bad += !(out[j] == C::expect(ctx, r, j));
      shared_report().wrong[std::size_t(r)] = bad;
    }
  });
  res.us = rep.us;
  for (int q = 0; q < n; ++q) res.wrong[std::size_t(q)] = rep.wrong[q];
  return res;
}

// ---- printing -------------------------------------------------------------------------------
struct totals {
  std::size_t wrong = 0;
};

/// A collective, a dtype and an op, as the sweep prints them; one block of rows per policy.
struct sweep_info {
  const char *coll, *bus, *dtype, *redop;
  double bus_factor;
  bool rooted;
  struct block {
    const char* policy;
    std::function<row(std::size_t bytes)> run;
  };
  std::vector<block> blocks;
};

/// The size sweep and its printing: not a template, so it is compiled once.
void sweep(const config& cfg, const sweep_info& si, totals& tot) {
  std::printf("# collx-perf  %s  transport: %s  ranks: %d (%s)\n", si.coll, cfg.transport.c_str(), cfg.ranks,
              transport_words(cfg.transport));
  bench_cli::print_sweep_header(cfg, si.bus, si.bus_factor, cfg.ranks);
  std::fflush(stdout);

  std::string averages;
  std::size_t wrong_here = 0;
  for (const auto& b : si.blocks) {
    double sum_bw = 0;
    int rows = 0;
    for (std::size_t bytes = cfg.minbytes; bytes <= cfg.maxbytes;) {
      const row rw = b.run(bytes);
      std::size_t wrong = 0;
      for (std::size_t w : rw.wrong) wrong += w;
      tot.wrong += wrong;
      wrong_here += wrong;
      const double busbw = bench_cli::print_row(rw.sh.bytes, rw.sh.count, si.dtype, si.redop, si.rooted ? cfg.root : -1,
                                                rw.us, si.bus_factor, cfg.check, wrong, b.policy);
      std::fflush(stdout);
      sum_bw += busbw;
      ++rows;
      const std::size_t nb = bench_cli::next_size(cfg, bytes);
      if (nb <= bytes) break;
      bytes = nb;
    }
    char avg[96];
    std::snprintf(avg, sizeof avg, "%s%s %.2f", averages.empty() ? "" : "  ", b.policy, rows ? sum_bw / rows : 0.0);
    averages += avg;
    if (&b != &si.blocks.back()) std::printf("#\n");
  }
  if (cfg.check) std::printf("# Out of bounds values : %zu %s\n", wrong_here, wrong_here == 0 ? "OK" : "FAILED");
  std::printf("# Avg bus bandwidth    : %s\n#\n", averages.c_str());
  std::fflush(stdout);
}

template <class C, class E, class Op>
void run_collective(const config& cfg, totals& tot) {
  using S = storage_t<C, E>;
  sweep_info si{C::name, C::bus, dtype<E>::name, C::reduces ? Op::name : "none", C::bus_factor(cfg.ranks), C::rooted, {}};
  for_each(policies{}, [&]<class A>(std::type_identity<A>) {
    if constexpr (C::template supports<A>)
      if (cfg.algo == "all" || cfg.algo == A::name)
        si.blocks.push_back({A::name, [&cfg](std::size_t bytes) {
                               return run_size<C, E, Op>(cfg, &C::template call<S, Op, A>, bytes);
                             }});
  });
  if (si.blocks.empty()) {
    std::string ok;
    for_each(policies{}, [&]<class A>(std::type_identity<A>) {
      if constexpr (C::template supports<A>) ok += std::string(ok.empty() ? "" : ", ") + A::name;
    });
    throw usage_error("--algo " + cfg.algo + " cannot run " + C::name + "; choose one of " + ok + " or all");
  }
  sweep(cfg, si, tot);
}

void run(const config& cfg, totals& tot) {
  bool found = dispatch(collectives{}, cfg.op, [&]<class C>(std::type_identity<C>) {
    const bool dt = dispatch(dtypes{}, cfg.dtype, [&]<class E>(std::type_identity<E>) {
      if constexpr (C::reduces) {
        if (!dispatch(redops{}, cfg.redop, [&]<class Op>(std::type_identity<Op>) { run_collective<C, E, Op>(cfg, tot); }))
          throw usage_error("unknown --redop '" + cfg.redop + "'; choose one of " + names(redops{}));
      } else {
        run_collective<C, E, no_redop>(cfg, tot);
      }
    });
    if (!dt) throw usage_error("unknown datatype -d '" + cfg.dtype + "'; choose one of " + names(dtypes{}));
  });
  if (!found) throw usage_error("unknown --op '" + cfg.op + "'; choose one of " + names(collectives{}));
}

// ---- the demo -------------------------------------------------------------------------------
template <class C>
void demo_header(const config& cfg) {
  const double f = C::bus_factor(cfg.ranks);
  std::printf("################################################################################\n");
  std::printf("# %s: %s.\n", C::name, C::what);
  std::printf("#   size    %s\n", C::size_doc);
  std::printf("#   time    average per call, measured on rank 0 between barriers (microseconds)\n");
  std::printf("#   algbw   size / time, GB/s (1 GB = 1e9 bytes)\n");
  std::printf("#   busbw   algbw x %s = x %.3f at %d ranks: what each rank's link carries per second,\n", C::bus, f,
              cfg.ranks);
  std::printf("#           comparable across rank counts (nccl-tests' convention; here the 'links'\n");
  std::printf("#           are memory copies between threads, so expect memory-bandwidth numbers)\n");
  std::printf("#   #wrong  elements that differ from a serial reference after one extra checked call (0 = correct)\n");
  std::printf("#   algo    the policy; one block of rows per policy that supports %s\n", C::name);
  std::printf("################################################################################\n");
}

void run_demo(config cfg, totals& tot) {
  cfg.ranks = 8;
  cfg.minbytes = 1 << 10;
  cfg.maxbytes = 16 << 20;
  cfg.factor = 4;  // 1 KiB, 4 KiB, ... 16 MiB: both ends run
  cfg.iters = 5;
  cfg.warmup = 2;
  cfg.algo = "all";
  cfg.check = true;
  std::printf("# collx-perf --demo: five collectives on %d %s, every policy, %zu B .. %zu B (x%zu),\n"
              "# %d timed calls after %d warm-up calls per size, dtype %s, redop %s.\n#\n",
              cfg.ranks, cfg.transport == "shm" ? "processes (transport::shm)" : cfg.transport == "tcp" ? "processes (transport::tcp, loopback)" : "thread-ranks (transport::inproc)",
              cfg.minbytes, cfg.maxbytes, cfg.factor, cfg.iters, cfg.warmup, cfg.dtype.c_str(), cfg.redop.c_str());
  for_each(list<all_reduce_c, reduce_scatter_c, all_gather_c, broadcast_c, all_to_all_c>{},
           [&]<class C>(std::type_identity<C>) {
             demo_header<C>(cfg);
             config c = cfg;
             c.op = C::name;
             run(c, tot);
             std::printf("\n");
           });
}

// ---- command line ---------------------------------------------------------------------------
void usage(std::FILE* f) {
  std::fprintf(f,
               "usage: collx-perf [flags]   (nccl-tests' flags; ranks are threads, or processes with --transport shm|tcp)\n"
               "  -np, --nranks N            ranks (default 8)\n"
               "  --op COLL                  %s (default all_reduce)\n"
               "  --algo POLICY              %s|all (default all: every policy that supports COLL)\n"
               "  -d, --datatype T           %s (default float)\n"
               "  -o, --redop OP             %s (default sum; ignored by collectives that do not reduce)\n"
               "  -r, --root R               root of broadcast and reduce (default 0)\n"
               "%s"
               "  --transport threads|shm|tcp  ranks as threads of this process, or as forked processes over\n"
               "                             POSIX shared memory (transport::shm) or TCP on 127.0.0.1\n"
               "                             (transport::tcp, rank 0 serving the rendezvous store)\n"
               "  --demo                     a guided tour: five collectives, 8 ranks, all policies\n"
               "  -h, --help                 this text\n"
               "Exit status: 0, or 1 when any #wrong > 0, 2 for bad flags, 3 when a collective fails.\n",
               names(collectives{}).c_str(), names(policies{}).c_str(), names(dtypes{}).c_str(),
               names(redops{}).c_str(), bench_cli::kSweepHelp);
}


config parse(int argc, char** argv) {
  config cfg;
  bench_cli::parse_flags(argc, argv, cfg, [&](const std::string& a, auto&& value) {
    if (a == "--demo") cfg.demo = true;
    else if (a == "--transport") cfg.transport = value();
    else return false;
    return true;
  });
  if (cfg.transport != "threads" && cfg.transport != "shm" && cfg.transport != "tcp")
    throw usage_error("--transport '" + cfg.transport +
                      "' is not available: 'threads' (ranks as threads of this process), 'shm' (forked processes "
                      "over shared memory) or 'tcp' (forked processes over loopback sockets)");
  g_transport = cfg.transport;
  if (cfg.root >= cfg.ranks)
    throw usage_error("-r " + std::to_string(cfg.root) + " is not a rank of [0, " + std::to_string(cfg.ranks) + ")");
  // Names are checked here, before anything runs, so a typo does not cost a sweep.
  auto known = [](auto l, const std::string& v) { return dispatch(l, v, [](auto) {}); };
  if (!known(collectives{}, cfg.op)) throw usage_error("unknown --op '" + cfg.op + "'; choose one of " + names(collectives{}));
  if (cfg.algo != "all" && !known(policies{}, cfg.algo))
    throw usage_error("unknown --algo '" + cfg.algo + "'; choose one of " + names(policies{}) + "|all");
  if (!known(dtypes{}, cfg.dtype)) throw usage_error("unknown datatype -d '" + cfg.dtype + "'; choose one of " + names(dtypes{}));
  if (!known(redops{}, cfg.redop)) throw usage_error("unknown --redop '" + cfg.redop + "'; choose one of " + names(redops{}));
  return cfg;
}

}  // namespace

int main(int argc, char** argv) {
  config cfg;
  try {
    cfg = parse(argc, argv);
  } catch (const usage_error& e) {
    std::fprintf(stderr, "collx-perf: %s\n(collx-perf --help lists the flags)\n", e.what());
    return 2;
  }
  if (cfg.help) {
    usage(stdout);
    return 0;
  }
  totals tot;
  try {
    if (cfg.demo) run_demo(cfg, tot);
    else run(cfg, tot);
  } catch (const usage_error& e) {
    std::fprintf(stderr, "collx-perf: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "collx-perf: %s\n", e.what());
    return 3;
  }
  if (tot.wrong > 0) {
    std::fprintf(stderr, "collx-perf: %zu wrong elements\n", tot.wrong);
    return 1;
  }
  return 0;
}
