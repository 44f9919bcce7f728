#pragma once
// The cost model's parameters (algo/model.hpp: time = α·steps + β·bytes + γ·reduced) for a transport:
// measured on this machine by `collx-perf --calibrate --transport T` and kept in a small text
// file in the user's cache directory, or the shipped defaults below, which say that they are.
//
//   $XDG_CACHE_HOME/collx/calibration-<transport>-np<N>.txt   (else $HOME/.cache/collx/...)
//
// one file per transport and rank count, because ranks that share cores (8 ranks on 2 cores)
// see steps several times slower than ranks that have a core each: a job of N ranks uses the
// calibration for N, else the nearest calibrated rank count (below first), else the defaults.
//
//   # collx calibration (collx-perf --calibrate --transport shm -np 2)
//   transport shm
//   alpha 2.1e-07        seconds per step (an 8-byte message between two ranks)
//   beta 7.3e-11         seconds per byte a rank sends (or receives) in one step
//   gamma 1.2e-10        seconds per byte reduced (float sum)
//   delta 0.9            what receiving while sending adds (0: full duplex; 1: an exchange
//                        costs twice a one-way message)
//   ranks 2              the ranks it was measured with
//   cores 2              the cores they shared (algo/model.hpp: steps with fewer active ranks)
//   date 2026-11-30T16:20:00Z
//   step 65536 9.1e-06 1.4e-05 1.9e-05   a step of this many bytes, measured: one way, exchanged,
//                                         exchanged and reduced (seconds; one line per size)
//
// Lines are "key value"; '#' starts a comment; unknown keys are ignored (newer files stay
// readable); a file that lacks alpha, beta or gamma, or has a value that is not a finite number
// >= 0, is not used, and params::source says why.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "../core/transports.hpp"
#include "model.hpp"

namespace collx::model {

/// $XDG_CACHE_HOME/collx, else $HOME/.cache/collx; "" when neither is set.
inline std::string cache_dir() {
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x != nullptr && *x == '/') return std::string(x) + "/collx";
  if (const char* h = std::getenv("HOME"); h != nullptr && *h != 0) return std::string(h) + "/.cache/collx";
  return {};
}

inline std::string calibration_file(std::string_view transport, int ranks) {
  const std::string d = cache_dir();
  return d.empty() ? std::string()
                   : d + "/calibration-" + std::string(transport) + "-np" + std::to_string(ranks) + ".txt";
}

/// Shipped defaults (core/transports.hpp: the list of transports holds them), measured on the
/// development machine (2 cores, Debian 12, 2 ranks, `collx-perf --calibrate --transport T`):
/// they order the policies sensibly anywhere, but a machine's own calibration is better. cuda's
/// are not measured (no GPU has run collx yet): α is a step's flag round trip in peer memory
/// behind a system-scope fence, estimated at 2 us; β a pull's two bytes of HBM traffic (read the
/// peer's, write its own) per byte at the ~4 TB/s an H200 reaches of its 4.8 TB/s; γ the extra
/// operand a reducing pull reads. cuda-ipc (process-ranks, one GPU each), also estimated: each
/// call's exchange of buffers through the bootstrap (an all_gather over shm, ~5 us) added to
/// cuda's α; β a pull over NVLink (~450 GB/s a direction between two H100/H200 of an HGX node).
/// A transport the list does not have gets inproc's.
inline params shipped_defaults(std::string_view transport) {
  const transport_entry* t = find_transport(transport);
  if (t == nullptr) t = find_transport("inproc");
  params p;
  p.alpha = t->alpha;
  p.beta = t->beta;
  p.gamma = t->gamma;
  p.source = "shipped defaults for " + std::string(transport);
  return p;
}

/// Reads a calibration file; nullopt (and `why`) when it is missing or unusable.
inline std::optional<params> read_calibration(const std::string& path, std::string* why = nullptr) {
  auto fail = [&](std::string w) -> std::optional<params> {
    if (why) *why = std::move(w);
    return std::nullopt;
  };
  if (path.empty()) return fail("no cache directory (neither XDG_CACHE_HOME nor HOME is set)");
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return fail("no calibration at " + path);
  if (!std::filesystem::is_regular_file(path, ec) || std::filesystem::file_size(path, ec) > 65536 || ec)
    return fail(path + " is not a calibration file (not a regular file of at most 64 KiB)");
  std::ifstream f(path);
  if (!f) return fail("cannot read " + path);
  // std::from_chars: the file's numbers are read the same whatever the program's locale.
  auto number = [](const std::string& t, double& v) {
    const auto r = std::from_chars(t.data(), t.data() + t.size(), v);
    return r.ec == std::errc() && r.ptr == t.data() + t.size() && std::isfinite(v);
  };
  params p;
  bool a = false, b = false, g = false;
  std::string line, date;
  int lines = 0;
  while (std::getline(f, line) && ++lines <= 1000) {
    if (const auto h = line.find('#'); h != std::string::npos) line.resize(h);
    std::istringstream in(line);
    std::string key, value;
    if (!(in >> key >> value)) continue;
    if (key == "date") { date = value; continue; }
    if (key == "fit") {  // fit <collective> <policy> <bytes> <measured / predicted>
      std::string pol, b, f;
      if (!(in >> pol >> b >> f)) return fail(path + ": a fit line needs a collective, a policy, bytes and a factor");
      const auto c = parse_collective(value);
      const auto q = parse_policy(pol);
      double bytes = 0, factor = 0;
      if (!c || !q || !number(b, bytes) || !number(f, factor) || bytes < 0 || !(factor >= 0.01 && factor <= 100))
        return fail(path + ": fit '" + value + " " + pol + " " + b + " " + f + "' is not a collective, a policy, bytes and a factor in [0.01, 100]");
      const int i = p.fit.slot(bytes);
      if (i < 0) return fail(path + ": fit lines at more than " + std::to_string(policy_fit::kSizes) + " sizes");
      p.fit.factor[int(*c)][int(*q)][i] = float(factor);
      continue;
    }
    if (key == "step") {  // step <bytes> <one-way> <exchange> <exchange+reduce>
      double b = 0, t1 = 0, tx = 0, tr = 0;
      std::string v2, v3, v4;
      if (!(in >> v2 >> v3 >> v4)) return fail(path + ": a step line needs bytes and three times");
      if (!number(value, b) || !number(v2, t1) || !number(v3, tx) || !number(v4, tr) || b < 0 || t1 < 0 || tx < 0 || tr < 0 || t1 > 100 || tx > 100 || tr > 100)
        return fail(path + ": step '" + value + " " + v2 + " " + v3 + " " + v4 + "' is not bytes and three times in seconds");
      step_curve& c = p.curve;
      if (c.n == step_curve::kMax) return fail(path + ": more than " + std::to_string(step_curve::kMax) + " step lines");
      if (c.n > 0 && !(b > c.bytes[c.n - 1])) return fail(path + ": step sizes must ascend");
      c.bytes[c.n] = b, c.one_way[c.n] = t1, c.exchange[c.n] = tx, c.reduce[c.n] = tr;
      ++c.n;
      continue;
    }
    if (key == "cores" || key == "ranks") {
      const long v = std::strtol(value.c_str(), nullptr, 10);
      if (v >= 1 && v <= 1 << 20) (key == "cores" ? p.cores : p.ranks) = int(v);
      continue;
    }
    if (key == "delta") {
      double v = 0;
      if (!number(value, v) || !(v >= 0 && v <= 1)) return fail(path + ": delta '" + value + "' is not a number in [0, 1]");
      p.delta = v;
      continue;
    }
    if (key != "alpha" && key != "beta" && key != "gamma") continue;
    double v = 0;
    if (!number(value, v) || v < 0 || v > 1.0)
      return fail(path + ": " + key + " '" + value + "' is not a number of seconds in [0, 1]");
    (key == "alpha" ? p.alpha : key == "beta" ? p.beta : p.gamma) = v;
    (key == "alpha" ? a : key == "beta" ? b : g) = true;
  }
  if (!a || !b || !g) return fail(path + " lacks " + std::string(!a ? "alpha" : !b ? "beta" : "gamma"));
  p.source = "calibrated: " + path + (date.empty() ? "" : " (" + date + ")");
  return p;
}

/// Writes a calibration file (creating the directory); returns "" or what went wrong.
inline std::string write_calibration(const std::string& path, std::string_view transport, const params& p, int ranks,
                                     std::string_view comment = {}) {
  if (path.empty()) return "no cache directory (neither XDG_CACHE_HOME nor HOME is set)";
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
  if (ec) return "cannot create " + std::filesystem::path(path).parent_path().string() + ": " + ec.message();
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());  // two calibrations at once: the last rename wins
  std::FILE* f = std::fopen(tmp.c_str(), "w");
  if (!f) return "cannot write " + tmp;
  char date[32] = "?";
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  if (gmtime_r(&now, &tm) != nullptr) std::strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", &tm);
  std::fprintf(f, "# collx calibration%s%.*s\n", comment.empty() ? "" : " ", int(comment.size()), comment.data());
  std::fprintf(f, "transport %.*s\n", int(transport.size()), transport.data());
  std::fprintf(f, "alpha %.6g\nbeta %.6g\ngamma %.6g\ndelta %.4g\nranks %d\n", p.alpha, p.beta, p.gamma, p.delta, ranks);
  if (p.cores > 0) std::fprintf(f, "cores %d\n", p.cores);
  for (collective c : all_collectives)
    for (choice q : all_policies)
      for (int i = 0; i < p.fit.nsizes; ++i)
        if (const float x = p.fit.factor[int(c)][int(q)][i]; x > 0)
          std::fprintf(f, "fit %s %s %.0f %.4g\n", name(c), name(q), p.fit.bytes[i], double(x));
  for (int i = 0; i < p.curve.n; ++i)
    std::fprintf(f, "step %.0f %.6g %.6g %.6g\n", p.curve.bytes[i], p.curve.one_way[i], p.curve.exchange[i], p.curve.reduce[i]);
  std::fprintf(f, "date %s\n", date);
  const bool ok = std::fclose(f) == 0;
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    return "cannot write " + path;
  }
  return {};
}

/// The parameters for `transport` with `ranks` ranks: this machine's calibration for that rank
/// count, else for the nearest calibrated one (fewer ranks first), else the shipped defaults,
/// with `source` saying which (and why no calibration was used).
/// How many times this process has looked for calibration files (params_for): a job's
/// automatic policy does once, on rank 0, however many ranks it has (tests check it).
inline std::atomic<std::uint64_t>& calibration_lookups() {
  static std::atomic<std::uint64_t> n{0};
  return n;
}

inline params params_for(std::string_view transport, int ranks) {
  calibration_lookups().fetch_add(1, std::memory_order_relaxed);
  std::string why;
  if (auto p = read_calibration(calibration_file(transport, ranks), &why)) return *p;
  // Other rank counts calibrated for this transport, nearest first (fewer ranks win ties); the
  // first that reads is used.
  std::vector<int> others;
  const std::string prefix = "calibration-" + std::string(transport) + "-np", dir = cache_dir();
  std::error_code ec;
  if (!dir.empty())
    for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
      const std::string f = it->path().filename().string();
      if (f.rfind(prefix, 0) != 0 || f.size() < prefix.size() + 5 || f.substr(f.size() - 4) != ".txt") continue;
      const std::string num = f.substr(prefix.size(), f.size() - 4 - prefix.size());
      if (num.empty() || num.size() > 5 || num[0] == '0' || num.find_first_not_of("0123456789") != std::string::npos) continue;
      const int r = std::stoi(num);
      if (r != ranks) others.push_back(r);
    }
  const auto dist = [&](int x) { return x > ranks ? 2 * (x - ranks) : 2 * (ranks - x) - 1; };
  std::sort(others.begin(), others.end(), [&](int a, int b) { return dist(a) < dist(b); });
  for (int r : others)
    if (auto p = read_calibration(calibration_file(transport, r))) {
      p->source += ", measured with " + std::to_string(r) + " ranks (none for " + std::to_string(ranks) + ")";
      return *p;
    }
  params p = shipped_defaults(transport);
  const transport_entry* t = find_transport(transport);
  p.source += " (" + why + "; run `collx-perf --calibrate --transport " + std::string(t ? t->flag : transport) + " -np " +
              std::to_string(ranks) + "`)";
  return p;
}

}  // namespace collx::model
