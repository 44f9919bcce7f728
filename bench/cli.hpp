#pragma once
// The command-line pieces collx-perf and mpi-perf share (mpi-perf is built with mpicxx alone, so
// this header needs nothing of collx): nccl-tests-style sizes (8, 64K, 32M, 1G) and bounded
// integers, each failing with a usage_error that names the flag.
#include <cstddef>
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

}  // namespace bench_cli
