// collx-precision: how far each policy's all_reduce sum lands from the exact sum, in units in
// the last place (ulp) of the element type; the table of docs/precision.md.
//
//   collx-precision [-n 2,4,8,16,32,64] [--count 65536] [--check]
//
// Ranks are threads. Each rank's inputs are values of the type in ±[2^-6, 1] (tests/precision.hpp),
// whose exact sum the float64 reference is. The default mode rounds each partial result to the
// element type at every step of its policy (the sum itself is computed in float for half and
// bfloat16); the deterministic mode sums all N contributions in rank order in the accumulator
// (float for half and bfloat16; double for float, ops::accumulate_in<double>) and rounds once.
// Columns: the share of elements that are not the correctly rounded sum; the median, 99th
// percentile and largest error in ulp at the exact sum; the largest in ulp at the sum of the
// inputs' magnitudes (a per-step rounding's bound is a multiple of that). --check: exit 1 unless every one-rounding row is within 0.5 ulp and
// correctly rounded everywhere.
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <stdexcept>
#include <span>
#include <string>
#include <vector>

#include <collx/collx.hpp>

#include "cli.hpp"
#include "precision.hpp"

namespace {

namespace algo = collx::algo;
namespace ops = collx::ops;
using collx_precision::error;

struct config {
  std::vector<int> ranks{2, 4, 8, 16, 32, 64};
  std::size_t count = 65536;
  bool check = false;
};

template <class E>
const char* type_name() {
  if constexpr (std::is_same_v<E, collx::bfloat16>) return "bfloat16";
  else if constexpr (std::is_same_v<E, collx::half>) return "half";
  else return "float";
}

/// One all_reduce under `a` at n thread-ranks; rank 0's error (every rank's result is checked to
/// be the same bits).
template <class E, class Op, class Algo>
error run(int n, std::size_t count, const collx_precision::exact& x, Algo a, Op op = {}) {
  std::vector<std::vector<E>> out(static_cast<std::size_t>(n));
  collx::launch_threads(n, [&](auto& comm) {
    std::vector<E> v(count);
    for (std::size_t i = 0; i < count; ++i) v[i] = collx_precision::input<E>(comm.rank(), i);
    collx::all_reduce(comm, std::span{v}, op, a);
    out[std::size_t(comm.rank())] = std::move(v);
  });
  for (const auto& v : out)
    for (std::size_t i = 0; i < count; ++i)
      if (float(v[i]) != float(out[0][i])) throw std::runtime_error(std::string(Algo::name) + ": ranks' results differ");
  error e;
  e.add(out[0].data(), x, count);
  return e;
}

void row(const char* type, int n, const char* policy, const char* rounding, const error& e) {
  std::printf("%-9s %3d  %-19s %-21s %7.1f%% %8.2f %8.2f %10.3g %8.2f\n", type, n, policy, rounding, 100 * e.wrong_fraction(),
              e.quantile(0.5), e.quantile(0.99), e.max_ulp, e.max_of_sum_abs);
}

/// Every policy's rows for element type E; false when a one-rounding row is off.
template <class E>
bool table(const config& cfg) {
  bool ok = true;
  for (int n : cfg.ranks) {
    const auto x = collx_precision::exact_sums<E>(n, cfg.count);
    const char* t = type_name<E>();
    const char* step = "every step";
    row(t, n, "ring", step, run<E, ops::sum>(n, cfg.count, x, algo::ring{}));
    row(t, n, "tree", step, run<E, ops::sum>(n, cfg.count, x, algo::tree{}));
    row(t, n, "recursive_halving", step, run<E, ops::sum>(n, cfg.count, x, algo::recursive_halving{}));
    row(t, n, "recursive_doubling", step, run<E, ops::sum>(n, cfg.count, x, algo::recursive_doubling{}));
    error once;
    if constexpr (std::is_same_v<E, float>) {
      row(t, n, "deterministic", "every step, rank order", run<E, ops::sum>(n, cfg.count, x, algo::deterministic<>{}));
      once = run<E, ops::accumulate_in<double>>(n, cfg.count, x, algo::deterministic<>{});
      row(t, n, "deterministic", "once, from double", once);
    } else {
      once = run<E, ops::sum>(n, cfg.count, x, algo::deterministic<>{});
      row(t, n, "deterministic", "once, from float", once);
    }
    if (once.max_ulp > 0.5 || once.wrong != 0) ok = false;
  }
  return ok;
}

std::vector<int> parse_ranks(const std::string& s) {
  std::vector<int> v;
  std::size_t at = 0;
  while (at <= s.size()) {
    const std::size_t comma = s.find(',', at);
    const std::string one = s.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
    v.push_back(int(bench_cli::parse_int("-n", one, 1, 1024)));
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  config cfg;
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      auto value = [&]() -> std::string {
        if (i + 1 >= argc) throw bench_cli::usage_error(a + " needs a value");
        return argv[++i];
      };
      if (a == "-n") cfg.ranks = parse_ranks(value());
      else if (a == "--count") cfg.count = bench_cli::parse_size("--count", value());
      else if (a == "--check") cfg.check = true;
      else if (a == "-h" || a == "--help") {
        std::printf("usage: collx-precision [-n 2,4,8,16,32,64] [--count 65536] [--check]\n");
        return 0;
      } else throw bench_cli::usage_error("unknown argument '" + a + "'");
    }
    for (int n : cfg.ranks)
      if (n > 64) throw bench_cli::usage_error("-n: at most 64 ranks (the inputs' sums are exact up to 64)");
  } catch (const bench_cli::usage_error& e) {
    std::fprintf(stderr, "collx-precision: %s\n", e.what());
    return 2;
  }
  std::printf("# all_reduce (sum) of %zu elements, ranks as threads; inputs in +-[2^-6, 1], exact sums in float64\n", cfg.count);
  std::printf("# wrong: elements that are not the correctly rounded sum; median, p99, max: |error| in ulp of the type\n");
  std::printf("# at the exact sum (large where the inputs cancel); max/sum|x|: in ulp at the sum of the inputs' magnitudes\n");
  std::printf("%-9s %3s  %-19s %-21s %8s %8s %8s %10s %8s\n", "# type", "N", "policy", "rounding", "wrong", "median", "p99", "max",
              "max/sum|x|");
  bool ok = true;
  try {
    ok &= table<collx::bfloat16>(cfg);
    ok &= table<collx::half>(cfg);
    ok &= table<float>(cfg);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "collx-precision: %s\n", e.what());
    return 1;
  }
  if (cfg.check && !ok) {
    std::fprintf(stderr, "collx-precision: a one-rounding result is more than 0.5 ulp off, or not correctly rounded\n");
    return 1;
  }
  return 0;
}
