#pragma once
// Debug output, as NCCL_DEBUG: COLLX_DEBUG=WARN|INFO|TRACE (unset or OFF: nothing), one line per
// event, to stderr or to COLLX_DEBUG_FILE, whose %r becomes the job rank, %p the pid and %h the
// host (COLLX_DEBUG_FILE=log.%r: a file per rank).
//   WARN    every failed call, with its error
//   INFO    and every communicator made: its transport, rank and size, host, job ranks and what
//           it was split from; and each choice algo::automatic makes, once per shape: the policy,
//           its predicted time and the runner-up's
//   TRACE   and every call as it ends: its shape, how long it took and waited, and on whom
//           (the flight recorder's timings: at TRACE it keeps at least one call)
// A line: "<host>:<pid> collx[<job rank>] INFO <text>". The level and the file are read when a
// communicator is made; a file is open while a communicator writes to it.
#include <unistd.h>

#include <cctype>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "settings.hpp"
#include "error.hpp"

namespace collx {

enum class debug_level : std::uint8_t { off, warn, info, trace };

inline const char* to_string(debug_level l) noexcept {
  switch (l) {
    case debug_level::off: return "OFF";
    case debug_level::warn: return "WARN";
    case debug_level::info: return "INFO";
    case debug_level::trace: return "TRACE";
  }
  return "?";
}

namespace detail {

inline debug_level debug_level_from_env() {
  const char* v = env("COLLX_DEBUG");
  if (v == nullptr) return debug_level::off;
  std::string u(v);
  for (char& c : u) c = char(std::toupper(static_cast<unsigned char>(c)));
  if (u == "OFF") return debug_level::off;
  if (u == "WARN") return debug_level::warn;
  if (u == "INFO") return debug_level::info;
  if (u == "TRACE") return debug_level::trace;
  bad_env("COLLX_DEBUG", v, "WARN, INFO, TRACE or OFF");
}

inline std::string host_name() {
  char h[256] = {};
  ::gethostname(h, sizeof h - 1);
  return h;
}

/// Where one job rank's lines go: a file of COLLX_DEBUG_FILE (shared by every communicator that
/// names it, closed with the last), or stderr.
class debug_sink {
 public:
  /// The sink for `job_rank` at `level`, or nullptr when the level is off.
  static std::shared_ptr<debug_sink> open(debug_level level, int job_rank) {
    if (level == debug_level::off) return nullptr;
    const std::string pattern = env_string("COLLX_DEBUG_FILE");
    const std::string path = expand(pattern, job_rank);
    static std::mutex mu;
    static auto* files = new std::map<std::string, std::weak_ptr<debug_sink>>;  // never destroyed
    std::lock_guard g(mu);
    std::weak_ptr<debug_sink>& slot = (*files)[path];
    auto s = slot.lock();
    if (s == nullptr) {
      std::FILE* f = stderr;
      if (!path.empty() && (f = std::fopen(path.c_str(), "a")) == nullptr)
        throw error(errc::invalid_argument, "COLLX_DEBUG_FILE=\"" + pattern + "\": cannot open " + path + " for writing");
      s = std::shared_ptr<debug_sink>(new debug_sink(f, f != stderr));
      slot = s;
    }
    return s;
  }
  ~debug_sink() {
    if (owned_) std::fclose(f_);
  }
  debug_sink(const debug_sink&) = delete;
  debug_sink& operator=(const debug_sink&) = delete;

  /// One line, written whole.
  void write(debug_level level, int job_rank, const std::string& text) {
    static const std::string prefix = host_name() + ":";
    const std::string line =
        prefix + std::to_string(::getpid()) + " collx[" + std::to_string(job_rank) + "] " + to_string(level) + " " + text + "\n";
    std::lock_guard g(mu_);
    std::fwrite(line.data(), 1, line.size(), f_);
    std::fflush(f_);
  }

  /// COLLX_DEBUG_FILE's pattern for one rank: %r job rank, %p pid, %h host, %% a percent sign.
  static std::string expand(const std::string& pattern, int job_rank) {
    std::string o;
    for (std::size_t i = 0; i < pattern.size(); ++i) {
      if (pattern[i] != '%' || i + 1 == pattern.size()) {
        o += pattern[i];
        continue;
      }
      const char c = pattern[++i];
      if (c == 'r') o += std::to_string(job_rank);
      else if (c == 'p') o += std::to_string(::getpid());
      else if (c == 'h') o += host_name();
      else if (c == '%') o += '%';
      else o += std::string("%") + c;
    }
    return o;
  }

 private:
  debug_sink(std::FILE* f, bool owned) : f_(f), owned_(owned) {}
  std::FILE* f_;
  bool owned_;
  std::mutex mu_;
};

/// A communicator's debug output: its level and sink (null when off).
struct debug_log {
  debug_level level = debug_level::off;
  std::shared_ptr<debug_sink> sink;
  int job_rank = 0;

  bool on(debug_level l) const noexcept { return sink != nullptr && level >= l; }
  void write(debug_level l, const std::string& text) const {
    if (on(l)) sink->write(l, job_rank, text);
  }
};

}  // namespace detail
}  // namespace collx
