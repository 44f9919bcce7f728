#pragma once
// The command line collx-perf and the baselines (mpi-perf, gloo-perf) share (mpi-perf is built
// with mpicxx alone, so this header needs nothing of collx): nccl-tests' sweep flags, the way
// arguments are split (--flag=value, -b64M, -np N), nccl-tests-style sizes (8, 64K, 32M, 1G) and
// bounded integers, each failing with a usage_error that names the flag.
#include <cstddef>
#include <cstdio>
#include <limits>
#include <stdexcept>
#include <string>

namespace bench_cli {

struct usage_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

inline std::size_t parse_size(const std::string& flag, const std::string& s) {
  std::size_t pos = 0;
  unsigned long long v = 0;
  try {
    if (s.empty() || s[0] == '-') throw std::invalid_argument(s);
    v = std::stoull(s, &pos, 10);
  } catch (const std::exception&) {
    throw usage_error(flag + " expects a size like 8, 64K, 32M or 1G, got '" + s + "'");
  }
  std::string suf = s.substr(pos);
  unsigned long long mul = 1;
  if (!suf.empty()) {
    switch (suf[0]) {
      case 'k': case 'K': mul = 1ull << 10; break;
      case 'm': case 'M': mul = 1ull << 20; break;
      case 'g': case 'G': mul = 1ull << 30; break;
      case 'b': case 'B': mul = 1; break;
      default: throw usage_error(flag + " expects a size like 8, 64K, 32M or 1G, got '" + s + "'");
    }
    std::string rest = suf.substr(suf[0] == 'b' || suf[0] == 'B' ? 0 : 1);
    if (!(rest.empty() || rest == "B" || rest == "b" || rest == "iB" || rest == "ib"))
      throw usage_error(flag + " expects a size like 8, 64K, 32M or 1G, got '" + s + "'");
  }
  if (v > std::numeric_limits<std::size_t>::max() / mul) throw usage_error(flag + " is too large: '" + s + "'");
  return std::size_t(v * mul);
}

inline long parse_int(const std::string& flag, const std::string& s, long lo, long hi) {
  std::size_t pos = 0;
  long v = 0;
  try {
    v = std::stol(s, &pos, 10);
  } catch (const std::exception&) {
    pos = 0;
  }
  if (pos == 0 || pos != s.size() || v < lo || v > hi)
    throw usage_error(flag + " expects an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got '" +
                      s + "'");
  return v;
}

/// nccl-tests' flags, with its defaults.
struct sweep_flags {
  int ranks = 0;
  std::size_t minbytes = 32 << 20, maxbytes = 32 << 20;
  std::size_t factor = 1, stepbytes = 1 << 20;  // -f overrides -i, as in nccl-tests
  int iters = 20, warmup = 5;
  bool check = true;
  int root = 0;
  std::string op = "all_reduce", algo, dtype = "float", redop = "sum";
  bool help = false;
};

/// Walks argv: for each flag calls on(flag, value) where value() fetches its value (from
/// "--flag=v", "-bV" or the next argument); on returns false for a flag it does not know. The
/// flags of sweep_flags are handled here first. Checks what every driver checks afterwards.
template <class On>
void parse_flags(int argc, char** argv, sweep_flags& cfg, On on) {
  bool factor_given = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i], val;
    bool has_val = false;
    if (a.rfind("--", 0) == 0) {
      if (const auto eq = a.find('='); eq != std::string::npos) {
        val = a.substr(eq + 1);
        a = a.substr(0, eq);
        has_val = true;
      }
    } else if (a.size() > 2 && a[0] == '-' && a != "-np") {  // -b64M, as getopt allows
      val = a.substr(2);
      a = a.substr(0, 2);
      has_val = true;
    }
    auto value = [&]() -> std::string {
      if (has_val) return val;
      if (i + 1 >= argc) throw usage_error(a + " needs a value");
      return argv[++i];
    };
    if (a == "-h" || a == "--help") cfg.help = true;
    else if (a == "-np" || a == "--nranks") cfg.ranks = int(parse_int(a, value(), 1, 4096));
    else if (a == "-b" || a == "--minbytes") cfg.minbytes = parse_size(a, value());
    else if (a == "-e" || a == "--maxbytes") cfg.maxbytes = parse_size(a, value());
    else if (a == "-f" || a == "--stepfactor") {
      cfg.factor = std::size_t(parse_int(a, value(), 1, 1 << 20));
      factor_given = cfg.factor > 1;
    } else if (a == "-i" || a == "--stepbytes") cfg.stepbytes = parse_size(a, value());
    else if (a == "-n" || a == "--iters") cfg.iters = int(parse_int(a, value(), 1, 1 << 30));
    else if (a == "-w" || a == "--warmup_iters") cfg.warmup = int(parse_int(a, value(), 0, 1 << 30));
    else if (a == "-c" || a == "--check") cfg.check = parse_int(a, value(), 0, 1 << 30) != 0;
    else if (a == "-r" || a == "--root") cfg.root = int(parse_int(a, value(), 0, 1 << 30));
    else if (a == "-d" || a == "--datatype") cfg.dtype = value();
    else if (a == "-o" || a == "--redop") cfg.redop = value();
    else if (a == "--op") cfg.op = value();
    else if (a == "--algo") cfg.algo = value();
    else if (!on(a, value)) throw usage_error("unknown flag '" + std::string(argv[i]) + "'");
  }
  if (!factor_given) cfg.factor = 1;
  if (cfg.factor <= 1 && cfg.stepbytes == 0) throw usage_error("-i 0 without -f would repeat one size forever");
  if (cfg.minbytes > cfg.maxbytes)
    throw usage_error("-b (" + std::to_string(cfg.minbytes) + ") is larger than -e (" + std::to_string(cfg.maxbytes) + ")");
}

// ---- nccl-tests' columns -------------------------------------------------------------------------

inline std::string format_time(double us) {
  char b[32];
  std::snprintf(b, sizeof b, us >= 10000.0 ? "%7.0f" : us >= 100.0 ? "%7.1f" : "%7.2f", us);
  return b;
}

/// The size after `b` in the sweep (-f multiplies, -i adds), saturating.
inline std::size_t next_size(const sweep_flags& cfg, std::size_t b) {
  const std::size_t max = std::numeric_limits<std::size_t>::max();
  if (cfg.factor > 1) return b == 0 ? 1 : (b > max / cfg.factor ? max : b * cfg.factor);
  return b > max - cfg.stepbytes ? max : b + cfg.stepbytes;
}

/// The lines above a sweep's rows: the sweep, the busbw factor and the column heads.
inline void print_sweep_header(const sweep_flags& cfg, const char* bus, double bus_factor, int ranks) {
  if (cfg.factor > 1)
    std::printf("# minBytes %zu maxBytes %zu step: %zu(factor) warmup iters: %d iters: %d validation: %d\n", cfg.minbytes,
                cfg.maxbytes, cfg.factor, cfg.warmup, cfg.iters, int(cfg.check));
  else
    std::printf("# minBytes %zu maxBytes %zu step: %zu(bytes) warmup iters: %d iters: %d validation: %d\n", cfg.minbytes,
                cfg.maxbytes, cfg.stepbytes, cfg.warmup, cfg.iters, int(cfg.check));
  std::printf("# busbw = algbw x %s = algbw x %.3f at %d ranks\n#\n", bus, bus_factor, ranks);
  std::printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %s\n", "size", "count", "type", "redop", "root", "time",
              "algbw", "busbw", "#wrong", "algo");
  std::printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s\n", "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)");
}

/// One row: size, count, type, redop, root, time, algbw, busbw, #wrong, algo; algbw = bytes /
/// time, busbw = algbw x bus_factor. Returns busbw (for the sweep's average).
inline double print_row(std::size_t bytes, std::size_t count, const char* type, const char* redop, int root, double us,
                        double bus_factor, bool checked, unsigned long long wrong, const char* algo) {
  const double sec = us * 1e-6;
  const double algbw = sec > 0 ? double(bytes) / 1e9 / sec : 0.0;
  const double busbw = algbw * bus_factor;
  const std::string w = checked ? std::to_string(wrong) : "N/A";
  std::printf("%12zu  %12zu  %8s  %6s  %6d  %7s  %6.2f  %6.2f  %6s  %s\n", bytes, count, type, redop, root,
              format_time(us).c_str(), algbw, busbw, w.c_str(), algo);
  return busbw;
}

/// The help lines of the sweep flags every driver takes (parse_flags).
inline constexpr const char* kSweepHelp =
    "  -b, --minbytes SIZE        smallest size (default 32M); SIZE takes K, M, G suffixes (x1024)\n"
    "  -e, --maxbytes SIZE        largest size (default 32M)\n"
    "  -f, --stepfactor F         multiply the size by F each step\n"
    "  -i, --stepbytes SIZE       add SIZE each step (default 1M; used when -f is not given)\n"
    "  -n, --iters N              timed iterations per size (default 20)\n"
    "  -w, --warmup_iters N       untimed iterations before them (default 5)\n"
    "  -c, --check 0|1            check the results against a serial reference (default 1)\n";

}  // namespace bench_cli
