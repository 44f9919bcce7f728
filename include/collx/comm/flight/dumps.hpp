#pragma once
// The flight recorder's dump files: written on a failed call, on demand and on a signal. Part of comm/flight.hpp, which includes it
// after the recorder; include comm/flight.hpp, not this file.

namespace collx {

namespace detail {

inline std::string dump_dir() { return env_string("COLLX_DUMP_DIR"); }

/// Writes the dump of `job_rank` to dir/collx-rank<R>.json (through a temporary file, so a
/// reader never sees half of one). Returns the path.
inline std::string write_dump(const std::string& dir, int job_rank, const char* reason) {
  const std::string body = job_rank_json(job_rank, reason);
  const std::string path = dir + "/collx-rank" + std::to_string(job_rank) + ".json";
  const std::string tmp = path + ".tmp" + std::to_string(::getpid()) + "." +
                          std::to_string(std::hash<std::thread::id>{}(std::this_thread::get_id()));
  std::FILE* f = std::fopen(tmp.c_str(), "w");
  if (f == nullptr)
    throw error(errc::invalid_argument, "collx flight recorder: cannot write " + tmp + " (COLLX_DUMP_DIR=" + dir + ")");
  const bool ok = std::fwrite(body.data(), 1, body.size(), f) == body.size();
  if (std::fclose(f) != 0 || !ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    throw error(errc::invalid_argument, "collx flight recorder: cannot write " + path);
  }
  return path;
}

inline void dump_job_rank_noexcept(int job_rank, const char* reason) noexcept {
  try {
    const std::string dir = dump_dir();
    if (!dir.empty()) write_dump(dir, job_rank, reason);
  } catch (...) {
    // a dump that cannot be written must not hide the call's own error
  }
}

/// Every job rank of this process dumped (the signal's thread).
inline void dump_all_noexcept(const char* reason) noexcept {
  try {
    std::vector<int> ranks;
    {
      auto& r = flight_recorders();
      std::lock_guard g(r.mu);
      for (const flight_recorder* f : r.all) ranks.push_back(f->job_rank());
    }
    std::sort(ranks.begin(), ranks.end());
    ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
    std::string dir = dump_dir();
    if (dir.empty()) dir = ".";
    for (int j : ranks) write_dump(dir, j, reason);
  } catch (...) {
  }
}

}  // namespace detail

namespace flight {

/// Writes every communicator of job rank `job_rank` in this process to
/// `dir`/collx-rank<R>.json (dir: COLLX_DUMP_DIR, else the current directory); returns the path.
inline std::string dump(int job_rank, std::string dir = {}) {
  if (dir.empty()) dir = detail::dump_dir();
  if (dir.empty()) dir = ".";
  return detail::write_dump(dir, job_rank, "asked for (collx::flight::dump)");
}

/// From now on, SIGUSR2 (or `sig`) dumps every job rank of this process into COLLX_DUMP_DIR
/// (else the current directory): a handler writes one byte to a pipe, and a thread started here
/// does the dumping (a handler may not allocate or lock). Idempotent.
inline void dump_on_signal(int sig = SIGUSR2) {
  auto& r = detail::flight_recorders();
  if (r.signal_thread.exchange(true)) return;
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    r.signal_thread = false;
    throw error(errc::transport_error, "collx flight recorder: pipe2 failed for the dump signal");
  }
  r.pipe_w = fds[1];
  std::thread([rd = fds[0]] {
    char c;
    while (::read(rd, &c, 1) == 1) detail::dump_all_noexcept("signal");
  }).detach();
  struct sigaction sa {};
  sa.sa_handler = [](int) {
    const int saved = errno;
    const char c = 1;
    [[maybe_unused]] auto n = ::write(detail::flight_recorders().pipe_w, &c, 1);
    errno = saved;
  };
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  ::sigaction(sig, &sa, nullptr);
}

}  // namespace flight

}  // namespace collx
