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
#include <thread>
#include <type_traits>
#include <vector>

#include <sys/mman.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <collx/collx.hpp>
#include <collx/algo/model.hpp>
#include <collx/algo/calibration.hpp>

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
/// The policies (algo/policies.hpp: one list), and automatic.
template <class... P>
list<P..., collx::algo::automatic> and_automatic(collx::algo::policy_list<P...>);
using policies = decltype(and_automatic(collx::algo::policies{}));

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

/// sizeof the element type named by -d (0 when unknown).
std::size_t dtype_size(const std::string& d) {
  std::size_t z = 0;
  dispatch(dtypes{}, d, [&]<class E>(std::type_identity<E>) { z = sizeof(E); });
  return z;
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

/// Whether --algo A can run collective K: automatic always, a policy when it has a schedule.
template <class A, collx::algo::collective K>
constexpr bool runs() {
  if constexpr (std::is_same_v<A, collx::algo::automatic>) return true;
  else return collx::model::supports<A>(K, true);
}
template <class A, collx::algo::collective K>
inline constexpr bool runs_v = runs<A, K>();

/// --wire: all_reduce of float (sum, avg) as algo::compressed<wire::bf16> (1) or <wire::mxfp8> (2).
int g_wire = 0;

struct all_reduce_c {
  static constexpr const collx::algo::collective_traits& t = collx::algo::traits(collx::algo::collective::all_reduce);
  static constexpr const char* name = t.name;
  static constexpr bool reduces = t.reduces, rooted = t.rooted, in_place = false, out_at_root = false;
  static constexpr const char* bus = t.bus;
  static constexpr const char* what = "every rank ends with the element-wise reduction of all ranks' buffers";
  static constexpr const char* size_doc = "bytes of each rank's buffer; count: its elements";
  static double bus_factor(int n) { return t.bus_factor(n); }
  template <class A>
  static constexpr bool supports = runs_v<A, collx::algo::collective::all_reduce>;
  static shape make(std::size_t bytes, std::size_t es, int) {
    const std::size_t c = bytes / es;
    return {c * es, c, c, c, 0, c};
  }
  template <class S, class Op, class A>
  static void call(comm_t& c, std::span<const S> in, std::span<S> out, int) {
    if constexpr (std::is_same_v<S, float> && (std::is_same_v<Op, collx::ops::sum> || std::is_same_v<Op, collx::ops::avg>)) {
      if (g_wire == 1) return collx::all_reduce(c, in, out, Op{}, collx::algo::compressed<collx::wire::bf16>{});
      if (g_wire == 2) return collx::all_reduce(c, in, out, Op{}, collx::algo::compressed<collx::wire::mxfp8>{});
    }
    collx::all_reduce(c, in, out, Op{}, A{});
  }
  template <class S, class V>
  static S expect(const check_ctx<S, V>& x, int, std::size_t j) { return x.ref[j]; }
};

struct reduce_scatter_c {
  static constexpr const collx::algo::collective_traits& t = collx::algo::traits(collx::algo::collective::reduce_scatter);
  static constexpr const char* name = t.name;
  static constexpr bool reduces = t.reduces, rooted = t.rooted, in_place = false, out_at_root = false;
  static constexpr const char* bus = t.bus;
  static constexpr const char* what = "rank r ends with the reduction of every rank's r-th block (k elements)";
  static constexpr const char* size_doc = "bytes of the n*k input; count: k, the elements each rank receives";
  static double bus_factor(int n) { return t.bus_factor(n); }
  template <class A>
  static constexpr bool supports = runs_v<A, collx::algo::collective::reduce_scatter>;
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
  static constexpr const collx::algo::collective_traits& t = collx::algo::traits(collx::algo::collective::all_gather);
  static constexpr const char* name = t.name;
  static constexpr bool reduces = t.reduces, rooted = t.rooted, in_place = false, out_at_root = false;
  static constexpr const char* bus = t.bus;
  static constexpr const char* what = "every rank ends with all ranks' k-element blocks, in rank order";
  static constexpr const char* size_doc = "bytes of the n*k output; count: k, the elements each rank sends";
  static double bus_factor(int n) { return t.bus_factor(n); }
  template <class A>
  static constexpr bool supports = runs_v<A, collx::algo::collective::all_gather>;
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
  static constexpr const collx::algo::collective_traits& t = collx::algo::traits(collx::algo::collective::broadcast);
  static constexpr const char* name = t.name;
  static constexpr bool reduces = t.reduces, rooted = t.rooted, in_place = true, out_at_root = false;
  static constexpr const char* bus = t.bus;
  static constexpr const char* what = "every rank ends with the root's buffer";
  static constexpr const char* size_doc = "bytes of the buffer; count: its elements";
  static double bus_factor(int n) { return t.bus_factor(n); }
  template <class A>
  static constexpr bool supports = runs_v<A, collx::algo::collective::broadcast>;
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
  static constexpr const collx::algo::collective_traits& t = collx::algo::traits(collx::algo::collective::reduce);
  static constexpr const char* name = t.name;
  static constexpr bool reduces = t.reduces, rooted = t.rooted, in_place = false, out_at_root = true;
  static constexpr const char* bus = t.bus;
  static constexpr const char* what = "the root ends with the element-wise reduction of all ranks' buffers";
  static constexpr const char* size_doc = "bytes of each rank's buffer; count: its elements";
  static double bus_factor(int n) { return t.bus_factor(n); }
  template <class A>
  static constexpr bool supports = runs_v<A, collx::algo::collective::reduce>;
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
  static constexpr const collx::algo::collective_traits& t = collx::algo::traits(collx::algo::collective::all_to_all);
  static constexpr const char* name = t.name;
  static constexpr bool reduces = t.reduces, rooted = t.rooted, in_place = false, out_at_root = false;
  static constexpr const char* bus = t.bus;
  static constexpr const char* what = "rank r sends its j-th k-element block to rank j (MoE token dispatch)";
  static constexpr const char* size_doc = "bytes of each rank's n*k send buffer; count: k, the elements per peer";
  static double bus_factor(int n) { return t.bus_factor(n); }
  template <class A>
  static constexpr bool supports = runs_v<A, collx::algo::collective::all_to_all>;
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
  bool calibrate = false;
  bool footprint = false;
  bool split = false;
  int groups = 0;        // --groups G: the ranks in groups of G, each running the collective
  int slow_rank = -1;    // --slow-rank R: job rank R sleeps slow_us before every timed call
  int slow_us = 2000;
  bool waits = false;    // --waits: who waited on whom in the timed calls (the flight recorder)
  std::string dump;      // --dump DIR: every rank's flight record written there after each size
  /// The ranks of one collective: a group's, or the job's.
  int group() const { return groups > 0 ? groups : ranks; }
  config() {
    ranks = 8;
    algo = "all";
  }
};

// ---- running one size -----------------------------------------------------------------------
struct row {
  shape sh;
  double us = 0;
  std::vector<std::size_t> wrong;  // per job rank
  std::vector<std::int64_t> waited, late;  // --waits: [job rank * ranks + peer's job rank], ns
  std::vector<std::int64_t> busy;          // --waits: per job rank, in the timed calls, ns
};

/// How a table says transport t (core/transports.hpp).
inline const char* transport_words(const std::string& t) {
  const collx::transport_entry* e = collx::find_transport(t);
  return e != nullptr ? e->words.data() : "?";
}

/// The transport every run uses: "threads", "shm" or "tcp" (set once from --transport).
std::string g_transport = "threads";
/// --split: every run is on a communicator split from the job's that holds every rank;
/// --groups G: on communicators of G consecutive ranks each (split from the job's, named "group").
bool g_split = false;
int g_groups = 0;

/// What ranks report back: in memory shared with forked ranks (MAP_SHARED | MAP_ANONYMOUS), so
/// it works the same whether the ranks are threads or processes.
struct report {
  static constexpr int kMaxRanks = 1024;
  static constexpr int kWaitRanks = 64;  // --waits keeps an n x n table
  double us;
  std::size_t wrong[kMaxRanks];
  // --waits: [job rank][peer's job rank], the timed calls only (flight::waits before and after)
  std::int64_t waited[kWaitRanks][kWaitRanks], late[kWaitRanks][kWaitRanks], busy[kWaitRanks];
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
void launch(int n, const std::function<void(comm_t&)>& run) {
  const std::function<void(comm_t&)> body = !g_split && g_groups == 0 ? run : [&run](comm_t& comm) {
    comm_t child = g_groups > 0 ? comm.split(comm.rank() / g_groups, comm.rank(), "group") : comm.split(0, comm.rank(), "every rank");
    run(child);
  };
  collx::launch_named<collx::transport::as_any>(g_transport, n, body);
}

/// Storage type: E for reducing collectives, an unsigned carrier of E's size for the others.
template <class C, class E>
using storage_t = std::conditional_t<C::reduces, E, uint_of_size<sizeof(E)>>;

template <class C, class E, class Op>
[[gnu::noinline]] row run_size(const config& cfg, invoke_fn<storage_t<C, E>> invoke, std::size_t bytes) {
  using S = storage_t<C, E>;
  const int n = cfg.group(), root = C::rooted ? cfg.root : -1;  // the ranks of one collective
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
  res.wrong.assign(std::size_t(cfg.ranks), 0);
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
  std::fill(rep.wrong, rep.wrong + std::min(cfg.ranks, report::kMaxRanks), std::size_t(0));
  if (cfg.waits) {
    std::fill(&rep.waited[0][0], &rep.waited[0][0] + report::kWaitRanks * report::kWaitRanks, std::int64_t(0));
    std::fill(&rep.late[0][0], &rep.late[0][0] + report::kWaitRanks * report::kWaitRanks, std::int64_t(0));
  }
  launch(cfg.ranks, [&](comm_t& comm) {
    const int r = comm.rank(), job = comm.job_rank(r);  // r: in the group (the job's rank without --groups)
    const bool has_out = !C::out_at_root || r == root;
    std::vector<S> in(sh.in), out(has_out ? sh.out : 0);
    for (std::size_t i = 0; i < in.size(); ++i) in[i] = value(r, i);
    if (C::in_place && r == root)
      for (std::size_t i = 0; i < out.size(); ++i) out[i] = value(r, i);
    const std::span<const S> cin{in};
    const std::span<S> sout{out};

    const bool slow = job == cfg.slow_rank;
    for (int i = 0; i < cfg.warmup; ++i) invoke(comm, cin, sout, root);
    collx::barrier(comm);
    const collx::wait_table before = cfg.waits ? collx::flight::waits(comm) : collx::wait_table{};
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < cfg.iters; ++i) {
      if (slow) std::this_thread::sleep_for(std::chrono::microseconds(cfg.slow_us));  // compute that runs long
      invoke(comm, cin, sout, root);
    }
    if (cfg.waits) {  // the timed calls' waits, before the barrier adds its own
      const collx::wait_table after = collx::flight::waits(comm);
      for (int p = 0; p < comm.size() && p < int(after.waited_ns.size()); ++p) {
        const int pj = comm.job_rank(p);
        shared_report().waited[job][pj] = after.waited_ns[std::size_t(p)] - before.waited_ns[std::size_t(p)];
        shared_report().late[job][pj] = after.late_ns[std::size_t(p)] - before.late_ns[std::size_t(p)];
      }
      shared_report().busy[job] = after.busy_ns - before.busy_ns;
    }
    collx::barrier(comm);
    const auto t1 = std::chrono::steady_clock::now();
    if (job == 0) shared_report().us = std::chrono::duration<double, std::micro>(t1 - t0).count() / cfg.iters;

    if (cfg.check) {
      if (!(C::in_place && r == root)) std::fill(out.begin(), out.end(), poison);
      invoke(comm, cin, sout, root);
      std::size_t bad = 0;
      for (std::size_t j = 0; j < out.size(); ++j) bad += !(out[j] == C::expect(ctx, r, j));
      shared_report().wrong[std::size_t(job)] = bad;
    }
    if (!cfg.dump.empty()) collx::flight::dump(job, cfg.dump);
  });
  res.us = rep.us;
  for (int q = 0; q < cfg.ranks; ++q) res.wrong[std::size_t(q)] = rep.wrong[q];
  if (cfg.waits)
    for (int q = 0; q < cfg.ranks; ++q) {
      res.busy.push_back(rep.busy[q]);
      for (int p = 0; p < cfg.ranks; ++p) {
        res.waited.push_back(rep.waited[q][p]);
        res.late.push_back(rep.late[q][p]);
      }
    }
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

/// The model's parameters for this run's transport, as automatic reads them.
collx::model::params run_params(const config& cfg) {
  return collx::model::params_for(collx::find_transport(cfg.transport)->name, cfg.ranks);
}

/// With --algo all: for each size, the fastest policy against automatic, and what the model
/// picked (what automatic ran, unless COLLX_ALGO overrides it). Target: automatic within 10% of
/// the best (issue 5); the last column says where it is not.
void print_automatic_vs_best(const config& cfg, const sweep_info& si,
                             const std::vector<std::vector<std::pair<std::size_t, double>>>& times) {
  std::size_t autos = si.blocks.size();
  for (std::size_t i = 0; i < si.blocks.size(); ++i)
    if (std::string_view(si.blocks[i].policy) == "automatic") autos = i;
  if (autos == si.blocks.size() || si.blocks.size() < 3) return;
  const auto coll = collx::model::parse_collective(si.coll);
  const collx::model::params p = run_params(cfg);
  std::printf("# automatic vs the best policy of this run (time per call; auto/best > 1: automatic slower)\n");
  std::printf("# model: alpha %.3g s, beta %.3g s/B, gamma %.3g s/B, delta %.2f, %d ranks on %d cores: %s%s\n", p.alpha,
              p.beta, p.gamma, p.delta, p.ranks, p.cores, p.source.c_str(),
              std::getenv("COLLX_ALGO") ? " (COLLX_ALGO is set: it overrides the model)" : "");
  std::printf("# pick/best: the time of the model's pick in its own rows over the best; auto/best: the\n"
              "# automatic rows over the best (the same choice, plus run-to-run noise)\n");
  const char* tune = std::getenv("COLLX_AUTOTUNE");
  if (tune != nullptr && std::string_view(tune) == "1")
    std::printf("# automatic learns from its calls here (COLLX_AUTOTUNE, algo/automatic.hpp): its rows ran the fastest\n"
                "# of the model's closest candidates, tried in its first calls; 'model's pick' is the model's alone\n");
  std::printf("#a%10s  %-18s %10s  %-18s %10s %10s %10s  %s\n", "size", "best", "best(us)", "model's pick", "auto(us)",
              "pick/best", "auto/best", "");
  int within = 0, sizes = 0;
  for (std::size_t k = 0; k < times[autos].size(); ++k) {
    std::size_t best = autos;
    for (std::size_t i = 0; i < times.size(); ++i)
      if (i != autos && k < times[i].size() && times[i][k].second < times[best][k].second) best = i;
    const std::size_t bytes = times[autos][k].first;
    const char* pick = "?";
    double pick_us = times[autos][k].second;  // when the pick has no rows of its own
    if (coll) {
      const auto pr = collx::model::problem::of_bytes(*coll, cfg.group(), bytes, dtype_size(cfg.dtype));
      pick = collx::model::name(collx::model::best(pr, p));
      for (std::size_t i = 0; i < times.size(); ++i)
        if (i != autos && std::string_view(si.blocks[i].policy) == pick && k < times[i].size()) pick_us = times[i][k].second;
    }
    const double b_us = times[best][k].second;
    const double ratio = b_us > 0 ? pick_us / b_us : 1.0, aratio = b_us > 0 ? times[autos][k].second / b_us : 1.0;
    ++sizes;
    within += ratio <= 1.10;
    std::printf("#a%10zu  %-18s %10.2f  %-18s %10.2f %10.2f %10.2f  %s\n", bytes, si.blocks[best].policy, b_us, pick,
                times[autos][k].second, ratio, aratio, ratio <= 1.10 ? "" : "pick > 10% slower");
  }
  std::printf("# the model's pick within 10%% of the best policy at %d of %d sizes\n#\n", within, sizes);
}

/// --waits: per group, per rank, over one size's timed calls: how long the rank waited, how long
/// the others waited on it, and how much of that its late entry explains (collx::flight::waits;
/// the attribution is core/flight_record.hpp's), the most blamed rank first.
void print_waits(const config& cfg, const row& rw) {
  const int n = cfg.ranks, g = cfg.group();
  auto ms = [](std::int64_t ns) { return double(ns) / 1e6; };
  for (int first = 0; first < n; first += g) {
    struct line {
      int job;
      std::int64_t waited = 0, on = 0, late = 0;
    };
    std::vector<line> ls;
    std::vector<std::int64_t> late, busy;
    for (int q = first; q < first + g; ++q) {
      line l{q};
      for (int p = first; p < first + g; ++p) {
        l.waited += rw.waited[std::size_t(q * n + p)];
        l.on += rw.waited[std::size_t(p * n + q)];
        l.late += rw.late[std::size_t(p * n + q)];
      }
      late.push_back(l.late);
      busy.push_back(rw.busy[std::size_t(q)]);
      ls.push_back(l);
    }
    const int slow = collx::flight::straggler(late, busy);
    std::stable_sort(ls.begin(), ls.end(), [](const line& a, const line& b) { return a.late > b.late; });
    std::printf("#w waits in the timed calls, %s of job ranks %d-%d (ms; late: the part of the others' wait on a rank that its\n"
                "#w late entry explains)\n#w %8s %10s %10s %10s\n",
                g == n ? "the communicator" : "the group", first, first + g - 1, "job rank", "waited", "on it", "late");
    for (const line& l : ls)
      std::printf("#w %8d %10.2f %10.2f %10.2f%s\n", l.job, ms(l.waited), ms(l.on), ms(l.late),
                  slow >= 0 && l.job == first + slow ? "  <- straggler" : "");
  }
}

/// The size sweep and its printing: not a template, so it is compiled once.
void sweep(const config& cfg, const sweep_info& si, totals& tot) {
  std::printf("# collx-perf  %s  transport: %s  ranks: %d (%s)%s\n", si.coll, cfg.transport.c_str(), cfg.ranks,
              transport_words(cfg.transport),
              cfg.groups > 0 ? (", in groups of " + std::to_string(cfg.groups) + ", each running it").c_str() : "");
  if (cfg.slow_rank >= 0)
    std::printf("# job rank %d sleeps %d us before every timed call (--slow-rank, --slow-us)\n", cfg.slow_rank, cfg.slow_us);
  bench_cli::print_sweep_header(cfg, si.bus, si.bus_factor, cfg.group());
  std::fflush(stdout);

  std::string averages;
  std::size_t wrong_here = 0;
  std::vector<std::vector<std::pair<std::size_t, double>>> times;  // per block: (bytes, us) per size
  for (const auto& b : si.blocks) {
    double sum_bw = 0;
    int rows = 0;
    times.emplace_back();
    for (std::size_t bytes = cfg.minbytes; bytes <= cfg.maxbytes;) {
      const row rw = b.run(bytes);
      times.back().push_back({rw.sh.bytes, rw.us});
      std::size_t wrong = 0;
      for (std::size_t w : rw.wrong) wrong += w;
      tot.wrong += wrong;
      wrong_here += wrong;
      const double busbw = bench_cli::print_row(rw.sh.bytes, rw.sh.count, si.dtype, si.redop, si.rooted ? cfg.root : -1,
                                                rw.us, si.bus_factor, cfg.check, wrong, b.policy);
      if (cfg.waits) print_waits(cfg, rw);
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
  print_automatic_vs_best(cfg, si, times);
  std::fflush(stdout);
}

template <class C, class E, class Op>
void run_collective(const config& cfg, totals& tot) {
  using S = storage_t<C, E>;
  sweep_info si{C::name, C::bus, dtype<E>::name, C::reduces ? Op::name : "none", C::bus_factor(cfg.group()), C::rooted, {}};
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

// ---- calibration (--calibrate) --------------------------------------------------------------
// The model (collx/algo/model.hpp) charges α per step, β per byte a rank sends (or receives) in a
// step, δ·β per byte of its smaller direction when it does both, and γ per byte reduced. So
// calibration times exactly those units, through the same executor and transport as the
// collectives, with ranks in pairs (r, r xor 1; with -np > 2 the other pairs work at the same
// time, so a crowded machine is measured crowded):
//   one-way steps: the pair's lower rank sends `bytes` to the higher, then the other way, ...;
//   exchange steps: both send `bytes` to each other at once;
// and the host's reduction loop for γ.
//   α = the time of an 8-byte one-way step;
//   β = the median over 64 KiB, 1 MiB and 16 MiB of (one-way time - α) / bytes;
//   δ = the median over the same sizes of (exchange time - α) / (β·bytes) - 1, in [0, 1];
//   γ = seconds per byte of `dst = a + b` over 64 KiB of float (an operand's bytes, as the model
//       counts reduced bytes), through collx's own reduction loop, on every rank at once: the transports reduce a
//       message chunk by chunk as it arrives (shm's 64 KiB slots, tcp's 64 KiB bounce buffer),
//       on data that is in cache.
// Each figure is the median of 5 batches.

/// Seconds per step of `bytes`, one-way, exchange, or exchange in which both ranks reduce what
/// they receive (float sum), measured on rank 0 (median of `batches`).
enum class step_kind { one_way, exchange, reduce };
double time_step(const config& cfg, std::size_t bytes, int iters, int batches, step_kind kind) {
  report& rep = shared_report();
  std::vector<double> got;
  const bool exchange = kind != step_kind::one_way, reduce = kind == step_kind::reduce;
  const std::size_t count = reduce ? std::max<std::size_t>(1, bytes / sizeof(float)) : bytes;
  for (int b = 0; b < batches; ++b) {
    rep.us = 0;
    launch(cfg.ranks, [&](comm_t& comm) {
      const int r = comm.rank(), peer = r ^ 1;
      std::vector<float> fin(reduce ? count : 0, 1.0f), fout(reduce ? count : 0, 0.0f);
      std::vector<std::uint8_t> in(reduce ? 0 : bytes, std::uint8_t(r)), out(reduce ? 0 : bytes);
      collx::schedule st[2];  // [0]: even steps, [1]: odd steps
      if (peer < comm.size())
        for (int k = 0; k < 2; ++k) {
          const bool sends = exchange || (k == 0) == (r < peer), receives = exchange || !sends;
          if (sends) st[k].send(peer, {collx::buf::in, 0, count});
          if (receives && reduce) st[k].recv(peer, {collx::buf::out, 0, count}, {collx::buf::in, 0, count}, collx::combine::received_left);
          else if (receives) st[k].recv(peer, {collx::buf::out, 0, count});
        }
      int parity = 0;
      const char* what = kind == step_kind::one_way ? "one-way" : reduce ? "reduce" : "exchange";
      auto step = [&] {
        if (reduce) {
          auto call = collx::detail::make_call<float, collx::ops::sum>(comm, "calibrate", what, count);
          collx::detail::execute(comm, call, st[parity], fin.data(), fout.data(), collx::ops::sum{});
        } else {
          auto call = collx::detail::make_call<std::uint8_t, collx::no_op>(comm, "calibrate", what, bytes);
          collx::detail::execute(comm, call, st[parity], in.data(), out.data(), collx::no_op{});
        }
        parity ^= 1;
      };
      for (int i = 0; i < std::max(2, iters / 10) * 2; ++i) step();  // an even count: parity stays in step
      collx::barrier(comm);
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < iters * 2; ++i) step();
      collx::barrier(comm);
      const auto t1 = std::chrono::steady_clock::now();
      if (r == 0) shared_report().us = std::chrono::duration<double, std::micro>(t1 - t0).count() / (iters * 2);
      if (!reduce && peer < comm.size() && bytes > 0 && out[bytes / 2] != std::uint8_t(peer))
        throw std::runtime_error("calibration: the exchanged bytes are wrong");
      if (reduce && peer < comm.size() && fout[count / 2] != 2.0f) throw std::runtime_error("calibration: the reduced values are wrong");
    });
    got.push_back(rep.us * 1e-6);
  }
  std::sort(got.begin(), got.end());
  return got[got.size() / 2];
}

/// Seconds per operand byte of collx's float-sum loop over 64 KiB operands, run by every rank at
/// once (so ranks that share cores are measured sharing them), timed on rank 0; median of 5.
double time_reduction(const config& cfg) {
  report& rep = shared_report();
  std::vector<double> got;
  for (int k = 0; k < 5; ++k) {
    rep.us = 0;
    launch(cfg.ranks, [&](comm_t& comm) {
      const std::size_t n = (std::size_t(64) << 10) / sizeof(float);
      std::vector<float> a(n, 1.0f), b(n, 2.0f), c(n);
      const collx::combiner comb = collx::ops::host_combiner<float>(collx::ops::sum{});
      const int reps = 2000;
      collx::barrier(comm);
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < reps; ++i) {
        comb(reinterpret_cast<std::byte*>(c.data()), reinterpret_cast<const std::byte*>(a.data()),
             reinterpret_cast<const std::byte*>(b.data()), n);
        a[std::size_t(i) % n] = c[(std::size_t(i) * 7) % n];  // keep every pass live
      }
      const auto t1 = std::chrono::steady_clock::now();
      collx::barrier(comm);
      if (comm.rank() == 0) shared_report().us = std::chrono::duration<double, std::micro>(t1 - t0).count() / reps;
    });
    got.push_back(rep.us * 1e-6 / double((std::size_t(64) << 10)));
  }
  std::sort(got.begin(), got.end());
  return got[2];
}

/// Every policy of every collective the model chooses for, at sizes x2 apart from 8 B to 32 MiB,
/// all in one job (float sum for the reducing ones): the measured time per call, median of 5
/// rounds that take the policies in turn (so a slow moment of the machine hits them alike).
/// Returns measured[collective][policy][size] in seconds (0: not run).
std::vector<double> time_policies(const config& cfg, const std::vector<std::size_t>& sizes) {
  constexpr int kColl = collx::algo::policy_fit::kCollectives, kPol = collx::algo::policy_fit::kPolicies, kRounds = 5;
  const std::size_t cells = std::size_t(kColl) * kPol * sizes.size() * kRounds;
  // shared with the ranks, whether they are threads or forked processes
  void* mem = mmap(nullptr, cells * sizeof(double), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) throw std::runtime_error("calibration: mmap failed");
  double* t = static_cast<double*>(mem);
  std::fill(t, t + cells, 0.0);
  auto cell = [&](int c, int a, std::size_t i, int round) -> double& {
    return t[((std::size_t(c) * kPol + std::size_t(a)) * sizes.size() + i) * kRounds + std::size_t(round)];
  };
  launch(cfg.ranks, [&](comm_t& comm) {
    for_each(list<all_reduce_c, reduce_scatter_c, all_gather_c, broadcast_c, reduce_c>{}, [&]<class C>(std::type_identity<C>) {
      using S = storage_t<C, float>;
      const int ci = int(*collx::model::parse_collective(C::name));
      for (std::size_t si = 0; si < sizes.size(); ++si) {
        const shape sh = C::make(sizes[si], sizeof(float), comm.size());
        std::vector<S> in(sh.in, S(1)), out(sh.out);
        const int iters = sizes[si] < (std::size_t(64) << 10) ? 200 : sizes[si] <= (std::size_t(1) << 20) ? 20 : sizes[si] <= (std::size_t(8) << 20) ? 4 : 2;
        for (int round = 0; round < kRounds; ++round)
          for_each(policies{}, [&]<class A>(std::type_identity<A>) {
            if constexpr (!std::is_same_v<A, collx::algo::automatic> && C::template supports<A>) {
              const int ai = int(*collx::model::parse_policy(A::name));
              for (int i = 0; i < std::max(1, iters / 10); ++i) C::template call<S, collx::ops::sum, A>(comm, in, out, 0);
              collx::barrier(comm);
              const auto t0 = std::chrono::steady_clock::now();
              for (int i = 0; i < iters; ++i) C::template call<S, collx::ops::sum, A>(comm, in, out, 0);
              collx::barrier(comm);
              if (comm.rank() == 0)
                cell(ci, ai, si, round) = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iters;
            }
          });
      }
    });
  });
  std::vector<double> med(std::size_t(kColl) * kPol * sizes.size(), 0.0);
  for (int c = 0; c < kColl; ++c)
    for (int a = 0; a < kPol; ++a)
      for (std::size_t i = 0; i < sizes.size(); ++i) {
        double r[kRounds];
        for (int k = 0; k < kRounds; ++k) r[k] = cell(c, a, i, k);
        std::sort(r, r + kRounds);
        med[(std::size_t(c) * kPol + std::size_t(a)) * sizes.size() + i] = r[kRounds / 2];
      }
  munmap(mem, cells * sizeof(double));
  return med;
}

int calibrate(const config& cfg) {
  const std::string kind(collx::find_transport(cfg.transport)->name);
  std::printf("# collx-perf --calibrate: the cost model's alpha, beta, gamma for transport %s, %d ranks (%s)\n",
              kind.c_str(), cfg.ranks, transport_words(cfg.transport));
  std::fflush(stdout);
  const double alpha = time_step(cfg, 8, 2000, 5, step_kind::one_way);
  std::printf("#   one-way step of 8 B: %.3f us  -> alpha\n", alpha * 1e6);
  std::vector<double> per_byte, dup;
  std::vector<std::pair<std::size_t, double>> points{{8, alpha}}, xpoints;
  for (std::size_t b : {std::size_t(64) << 10, std::size_t(1) << 20, std::size_t(16) << 20}) {
    const int iters = b <= (std::size_t(64) << 10) ? 500 : b <= (std::size_t(1) << 20) ? 50 : 5;
    const double t = time_step(cfg, b, iters, 5, step_kind::one_way), tx = time_step(cfg, b, iters, 5, step_kind::exchange);
    points.push_back({b, t});
    xpoints.push_back({b, tx});
    const double pb = std::max(0.0, t - alpha) / double(b);
    per_byte.push_back(pb);
    dup.push_back(pb > 0 ? (tx - alpha) / (pb * double(b)) - 1.0 : 0.0);
    std::printf("#   %zu B: one-way step %.2f us (%.2f GB/s), exchange step %.2f us (%.2f GB/s each way)\n", b, t * 1e6,
                double(b) / t / 1e9, tx * 1e6, double(b) / tx / 1e9);
    std::fflush(stdout);
  }
  std::sort(per_byte.begin(), per_byte.end());
  std::sort(dup.begin(), dup.end());
  const double beta = per_byte[per_byte.size() / 2];
  const double delta = std::clamp(dup[dup.size() / 2], 0.0, 1.0);
  const double gamma = time_reduction(cfg);
  std::printf("#   float sum over 64 KiB: %.2f GB/s of operand  -> gamma\n", 1e-9 / gamma);
  collx::model::params p{alpha, beta, gamma, {}};
  p.cores = collx::detail::usable_cores();
  p.ranks = cfg.ranks;
  p.delta = delta;
  // The step times by size, which the model charges steps from (algo/model.hpp, step_seconds): from
  // a few bytes, where a step is its latency, through sizes that stay in cache, to sizes that
  // stream from memory.
  std::printf("# step times by size (one way, exchange, exchange + float sum), medians of 5:\n");
  // (x2 apart from 16 KiB on: where a step's buffers leave the caches the time per byte jumps, and
  // a step in between is charged from its neighbours)
  for (std::size_t b : {std::size_t(8), std::size_t(512), std::size_t(4) << 10, std::size_t(16) << 10, std::size_t(32) << 10,
                        std::size_t(64) << 10, std::size_t(128) << 10, std::size_t(256) << 10, std::size_t(512) << 10,
                        std::size_t(1) << 20, std::size_t(2) << 20, std::size_t(4) << 20, std::size_t(8) << 20,
                        std::size_t(16) << 20}) {
    const int iters = b <= (std::size_t(16) << 10) ? 2000 : b <= (std::size_t(256) << 10) ? 300 : b <= (std::size_t(1) << 20) ? 50 : 8;
    auto& c = p.curve;
    c.bytes[c.n] = double(b);
    c.one_way[c.n] = time_step(cfg, b, iters, 5, step_kind::one_way);
    c.exchange[c.n] = time_step(cfg, b, iters, 5, step_kind::exchange);
    c.reduce[c.n] = time_step(cfg, b, iters, 5, step_kind::reduce);
    std::printf("#   %9zu B: %10.2f us %10.2f us %10.2f us\n", b, c.one_way[c.n] * 1e6, c.exchange[c.n] * 1e6, c.reduce[c.n] * 1e6);
    std::fflush(stdout);
    ++c.n;
  }
  std::printf("alpha %.4g s   beta %.4g s/B (%.2f GB/s)   gamma %.4g s/B (%.2f GB/s)   delta %.2f\n", alpha, beta,
              1e-9 / beta, gamma, 1e-9 / gamma, delta);
  std::printf("# the model's lines through them, against each measured step:\n");
  for (const auto& [b, t] : points)
    std::printf("#   one-way %10zu B: measured %10.2f us, alpha + beta*bytes %10.2f us\n", b, t * 1e6,
                (alpha + beta * double(b)) * 1e6);
  for (const auto& [b, t] : xpoints)
    std::printf("#   exchange %9zu B: measured %10.2f us, alpha + beta*(1+delta)*bytes %10.2f us\n", b, t * 1e6,
                (alpha + beta * (1 + delta) * double(b)) * 1e6);
  // Every policy measured against what the model predicts for it: the factors it scales its
  // predictions by (algo/model.hpp, policy_fit).
  {
    namespace model = collx::model;
    std::vector<std::size_t> sizes;
    for (std::size_t b = 8; b <= (std::size_t(32) << 20); b *= 2) sizes.push_back(b);
    std::printf("# every policy against the model's prediction, %zu sizes from 8 B to 32 MiB (measured / predicted):\n",
                sizes.size());
    std::fflush(stdout);
    const std::vector<double> med = time_policies(cfg, sizes);
    for (model::collective c : model::all_collectives) {
      if (c == model::collective::all_to_all) continue;
      for (model::choice q : model::all_policies) {
        if (!model::supports(q, c, true)) continue;
        std::string line;
        for (std::size_t i = 0; i < sizes.size(); ++i) {
          const double m = med[(std::size_t(c) * collx::algo::policy_fit::kPolicies + std::size_t(q)) * sizes.size() + i];
          const auto pr = model::problem::of_bytes(c, cfg.ranks, std::max(sizes[i], std::size_t(cfg.ranks) * 4), 4, 0, true);
          const double pred = model::predict(model::profile(q, pr), p);
          if (!(m > 0) || !(pred > 0)) continue;
          const double f = std::clamp(m / pred, 0.01, 100.0);
          const int slot = p.fit.slot(double(sizes[i]));
          if (slot >= 0) p.fit.factor[int(c)][int(q)][slot] = float(f);
          char b[32];
          std::snprintf(b, sizeof b, " %.2f", f);
          line += b;
        }
        std::printf("#   %-15s %-19s%s\n", model::name(c), model::name(q), line.c_str());
      }
    }
  }
  const std::string path = collx::model::calibration_file(kind, cfg.ranks);
  const std::string err = collx::model::write_calibration(
      path, kind, p, cfg.ranks, "(collx-perf --calibrate --transport " + cfg.transport + " -np " + std::to_string(cfg.ranks) + ")");
  if (!err.empty()) {
    std::fprintf(stderr, "collx-perf: %s\n", err.c_str());
    return 3;
  }
  std::printf("wrote %s (algo::automatic reads it for transport %s, %d ranks)\n", path.c_str(), kind.c_str(), cfg.ranks);
  return 0;
}

// ---- the demo -------------------------------------------------------------------------------
template <class C>
void demo_header(const config& cfg) {
  const double f = C::bus_factor(cfg.group());
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
              cfg.ranks, (std::string(transport_words(cfg.transport)) + " (transport::" + std::string(collx::find_transport(cfg.transport)->name) + ")").c_str(),
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
               "  --wire bf16|mxfp8          all_reduce of float with its data on the wire as bf16 or MXFP8,\n"
               "                             summed in float (algo::compressed; with --algo ring, no check)\n"
               "  --transport threads|shm|tcp  ranks as threads of this process, or as forked processes over\n"
               "                             POSIX shared memory (transport::shm) or TCP on 127.0.0.1\n"
               "                             (transport::tcp, rank 0 serving the rendezvous store)\n"
               "  --transport cuda           thread-ranks on GPUs, buffers in device memory (transport::cuda):\n"
               "                             run by collx-perf-cuda, built beside collx-perf where nvcc is\n"
               "                             (its flags: collx-perf --transport cuda --help)\n"
               "  --split                    run on a communicator split from the job's that holds every rank\n"
               "                             (communicator::split: its own channels), to compare with the job's\n"
               "  --groups G                 split the ranks into groups of G consecutive ranks, each running the\n"
               "                             collective on its own communicator at once (-r is a rank of a group)\n"
               "  --slow-rank R, --slow-us US  job rank R sleeps US microseconds (default 2000) before every timed\n"
               "                             call: a straggler on purpose\n"
               "  --waits                    after each size, per group and rank: the time it waited in the timed\n"
               "                             calls, the others waited on it, and what its late entry explains (the\n"
               "                             flight recorder's straggler accounting)\n"
               "  --dump DIR                 after each size every rank writes its flight record to DIR/collx-rank<R>.json\n"
               "                             (the last size's stay; collx-trace DIR reads them)\n"
               "  --demo                     a guided tour: five collectives, 8 ranks, all policies\n"
               "  --calibrate                measure the cost model's alpha (s per step), beta (s per byte)\n"
               "                             and gamma (s per byte reduced) for --transport with -np ranks\n"
               "                             (default 2) and write them to $XDG_CACHE_HOME/collx/ (else\n"
               "                             ~/.cache/collx/), where algo::automatic reads them\n"
               "  --footprint                the shared memory a job of -np ranks takes (transport::shm): the\n"
               "                             segment's size, and what /dev/shm loses while the ranks are\n"
               "                             attached (measured with statvfs)\n"
               "  -h, --help                 this text\n"
               "Exit status: 0, or 1 when any #wrong > 0, 2 for bad flags, 3 when a collective fails.\n",
               names(collectives{}).c_str(), names(policies{}).c_str(), names(dtypes{}).c_str(),
               names(redops{}).c_str(), bench_cli::kSweepHelp);
}


/// --footprint: what a job of cfg.ranks ranks takes of /dev/shm. The segment's size
/// (transport::shm::footprint, every page of it reserved when it is made), and what /dev/shm's
/// free space drops by while the ranks are attached (statvfs; other users of /dev/shm at the
/// same time would show in it too).
int footprint(const config& cfg) {
  struct statvfs before {};
  if (statvfs("/dev/shm", &before) != 0) {
    std::fprintf(stderr, "collx-perf: statvfs /dev/shm: %s\n", std::strerror(errno));
    return 3;
  }
  auto used = [](const struct statvfs& v) { return double(v.f_blocks - v.f_bfree) * double(v.f_frsize); };
  const double base = used(before);
  auto* seen = static_cast<double*>(mmap(nullptr, sizeof(double), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  *seen = 0;
  collx::launch_processes(cfg.ranks, [&](auto& comm) {
    collx::barrier(comm);  // every rank attached
    if (comm.rank() == 0) {
      struct statvfs now {};
      if (statvfs("/dev/shm", &now) == 0) *seen = used(now) - base;
    }
    collx::barrier(comm);
  });
  const std::size_t computed = collx::transport::shm::footprint(cfg.ranks);
  const collx::transport::shm::config sc;
  std::printf("# collx-perf --footprint: transport::shm with %d ranks, %u data slots of %zu B per rank (COLLX_SHM_SLOTS, "
              "COLLX_SHM_SLOT_BYTES)\n", cfg.ranks, sc.slots, sc.slot_bytes);
  std::printf("#  ranks   segment(MiB)   per rank(MiB)   /dev/shm used while attached(MiB)\n");
  std::printf("%8d %14.2f %15.3f %21.2f\n", cfg.ranks, double(computed) / double(1 << 20),
              double(computed) / double(1 << 20) / cfg.ranks, *seen / double(1 << 20));
  munmap(seen, sizeof(double));
  return 0;
}

config parse(int argc, char** argv) {
  config cfg;
  bench_cli::parse_flags(argc, argv, cfg, [&](const std::string& a, auto&& value) {
    if (a == "--demo") cfg.demo = true;
    else if (a == "--calibrate") cfg.calibrate = true;
    else if (a == "--footprint") cfg.footprint = true;
    else if (a == "--split") cfg.split = true;
    else if (a == "--groups") cfg.groups = int(parse_int(a, value(), 1, 4096));
    else if (a == "--slow-rank") cfg.slow_rank = int(parse_int(a, value(), 0, 4095));
    else if (a == "--slow-us") cfg.slow_us = int(parse_int(a, value(), 0, 10000000));
    else if (a == "--waits") cfg.waits = true;
    else if (a == "--dump") cfg.dump = value();
    else if (a == "--transport") cfg.transport = value();
    else if (a == "--wire") {
      const std::string w = value();
      if (w == "bf16") g_wire = 1;
      else if (w == "mxfp8") g_wire = 2;
      else throw usage_error("--wire expects bf16 or mxfp8, got '" + w + "'");
    } else return false;
    return true;
  });
  if (const collx::transport_entry* t = collx::find_transport(cfg.transport); t != nullptr && t->ranks == collx::rank_kind::mpi)
    throw usage_error("--transport mpi: MPI's launcher starts those ranks: run `mpirun -np N mpi-perf --collx` (bench/mpi_perf.cpp, "
                      "docs/mpi.md), beside `mpirun -np N mpi-perf` for MPI's own collectives");
  if (const collx::transport_entry* t = collx::find_transport(cfg.transport); t == nullptr || t->ranks == collx::rank_kind::device)
    throw usage_error("--transport '" + cfg.transport + "' is not available: " +
                      collx::transport_flags(collx::rank_kind::threads, collx::rank_kind::processes, collx::rank_kind::hosts) +
                      " (core/transports.hpp), or 'cuda' (thread-ranks on GPUs, run by collx-perf-cuda)");
  g_transport = cfg.transport;
  g_split = cfg.split;
  g_groups = cfg.groups;
  if (cfg.groups > 0 && cfg.ranks % cfg.groups != 0)
    throw usage_error("--groups " + std::to_string(cfg.groups) + " does not divide -np " + std::to_string(cfg.ranks));
  if (cfg.groups > 0 && cfg.split) throw usage_error("--groups and --split: choose one");
  if (cfg.slow_rank >= cfg.ranks)
    throw usage_error("--slow-rank " + std::to_string(cfg.slow_rank) + " is not a rank of [0, " + std::to_string(cfg.ranks) + ")");
  if (cfg.waits && cfg.ranks > report::kWaitRanks)
    throw usage_error("--waits keeps a table of at most " + std::to_string(report::kWaitRanks) + " ranks");
  if (cfg.waits && collx::detail::flight_capacity() == 0)
    throw usage_error("--waits reads the flight recorder, and COLLX_FLIGHT_RECORDER=0 turns it off");
  if (cfg.calibrate) {  // two ranks unless -np says otherwise
    bool np = false;
    for (int i = 1; i < argc; ++i) np = np || std::string_view(argv[i]) == "-np" || std::string_view(argv[i]).rfind("--nranks", 0) == 0;
    if (!np) cfg.ranks = 2;
  }
  if (g_wire != 0) {
    if (cfg.op != "all_reduce" || cfg.dtype != "float" || (cfg.redop != "sum" && cfg.redop != "avg") || cfg.algo != "ring")
      throw usage_error("--wire compresses an all_reduce of float (sum or avg): --op all_reduce -d float --algo ring "
                        "(algo::compressed's all-gather)");
    cfg.check = false;  // (lossy: tests/test_compressed.cpp checks its results against their bounds)
  }
  if (cfg.root >= cfg.group())
    throw usage_error("-r " + std::to_string(cfg.root) + " is not a rank of [0, " + std::to_string(cfg.group()) + ")");
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

/// --transport cuda: collx-perf-cuda (bench/cuda/perf_cuda.cu), this program's sibling, built
/// where nvcc is, runs the whole command line.
bool wants_cuda(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (a == "--transport=cuda" || (a == "--transport" && i + 1 < argc && std::string_view(argv[i + 1]) == "cuda")) return true;
  }
  return false;
}
int run_cuda_driver(char** argv) {
  std::string dir = ".";
  char self[4096];
  if (const ssize_t k = ::readlink("/proc/self/exe", self, sizeof self - 1); k > 0) {
    const std::string exe(self, std::size_t(k));
    dir = exe.substr(0, exe.rfind('/'));
  }
  const std::string driver = dir + "/collx-perf-cuda";
  argv[0] = const_cast<char*>(driver.c_str());
  ::execv(driver.c_str(), argv);
  std::fprintf(stderr,
               "collx-perf: --transport cuda is run by %s, which is not there: it is built where CMake finds nvcc "
               "(check_language(CUDA); COLLX_CUDA=ON)\n",
               driver.c_str());
  return 2;
}

int main(int argc, char** argv) {
  if (wants_cuda(argc, argv)) return run_cuda_driver(argv);
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
    if (cfg.calibrate) return calibrate(cfg);
    if (cfg.footprint) return footprint(cfg);
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
