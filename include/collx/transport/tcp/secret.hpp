#pragma once
// Where a tcp job's secret comes from. The secret only travels through private channels, never
// through a network store (docs/security.md); in order:
//   1. COLLX_JOB_TOKEN (tcp_config::token), or what the launcher hands its ranks in memory
//      (launch_processes draws one before it forks);
//   2. COLLX_JOB_TOKEN_FILE: a file only this user can read;
//   3. a file store (COLLX_STORE_PATH) whose directory only this user can read: rank 0 draws one
//      and writes it there (mode 0600); or the store a PMIx launcher keeps for the job's
//      processes alone (tcp/pmix_store.hpp): rank 0 draws one and puts it there;
//   4. every rank on one host (the launcher says so, or MASTER_ADDR is a loopback address): rank 0
//      draws one and writes it into a file in this user's private directory (private_dir()),
//      where the other ranks read it; another local user can read neither;
//   5. none: a job across hosts that was given no secret runs, and rank 0 says once on stderr
//      what that risks and how to fix it; COLLX_REQUIRE_SECRET=1 makes it an error.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>

#include "../../core/error.hpp"
#include "../../core/settings.hpp"
#include "auth.hpp"
#include "socket.hpp"
#include "wire.hpp"

namespace collx::transport::tcp_detail {

/// 64 hex digits from the kernel's random source.
inline std::string random_secret() {
  unsigned char b[32];
  tcp_auth::random_bytes(b, sizeof b);
  static const char* hex = "0123456789abcdef";
  std::string s;
  for (unsigned char c : b) {
    s += hex[c >> 4];
    s += hex[c & 15];
  }
  return s;
}

inline std::string mode_text(mode_t m) {
  char b[8];
  std::snprintf(b, sizeof b, "%04o", unsigned(m & 07777));
  return b;
}

/// Throws unless `st` (of `what`, a directory or a file) belongs to this user and grants nothing
/// to group or others.
inline void check_private(const struct stat& st, const std::string& what, const char* fix) {
  if (st.st_uid != ::geteuid())
    throw error(errc::invalid_argument, "tcp: " + what + " belongs to uid " + std::to_string(st.st_uid) + ", not to this user (uid " +
                                            std::to_string(::geteuid()) + "): collx keeps no secret there (" + fix + ")");
  if ((st.st_mode & 077) != 0)
    throw error(errc::invalid_argument, "tcp: " + what + " has mode " + mode_text(st.st_mode) +
                                            ": other users may read it, so collx keeps no secret there (" + fix + ")");
}

/// A directory only this user can use: created 0700 when missing; an existing one must be a
/// directory (not a link), this user's, and closed to group and others.
inline void ensure_private_dir(const std::string& dir, const char* fix) {
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST)
    throw error(errc::invalid_argument, "tcp: cannot create the directory " + dir + ": " + std::strerror(errno));
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0)
    throw error(errc::invalid_argument, "tcp: cannot look at " + dir + ": " + std::strerror(errno));
  if (!S_ISDIR(st.st_mode)) throw error(errc::invalid_argument, "tcp: " + dir + " is not a directory (a link or a file is not followed)");
  check_private(st, "the directory " + dir, fix);
}

/// This user's private directory on this host: COLLX_PRIVATE_DIR, else /tmp/collx-<uid>
/// (created 0700; one that another user made first is refused, never used).
inline std::string private_dir() {
  std::string d = detail::env_string("COLLX_PRIVATE_DIR");
  if (d.empty()) d = "/tmp/collx-" + std::to_string(::geteuid());
  ensure_private_dir(d, "remove it, or point COLLX_PRIVATE_DIR at a directory of mode 0700");
  return d;
}

/// The contents of a file only this user can read (its trailing white space dropped), or
/// nullopt when it does not exist. A link is not followed.
inline std::optional<std::string> read_private_file(const std::string& path, const char* fix) {
  const int f = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (f < 0) {
    if (errno == ENOENT) return std::nullopt;
    throw error(errc::invalid_argument, "tcp: cannot open the secret's file " + path + ": " + std::strerror(errno) +
                                            (errno == ELOOP ? " (a link is not followed)" : ""));
  }
  net::fd hold(f);
  struct stat st {};
  if (::fstat(f, &st) != 0 || !S_ISREG(st.st_mode)) throw error(errc::invalid_argument, "tcp: " + path + " is not a regular file");
  check_private(st, "the secret's file " + path, fix);
  char b[tcp_wire::kTokenBytes + 64];
  std::size_t got = 0;
  for (;;) {
    const ssize_t k = ::read(f, b + got, sizeof b - got);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) break;
    got += std::size_t(k);
    if (got == sizeof b) break;
  }
  std::string s(b, got);
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ' || s.back() == '\t')) s.pop_back();
  if (s.empty() || s.size() > tcp_wire::kTokenBytes)
    throw error(errc::invalid_argument, "tcp: the secret in " + path + " has " + std::to_string(s.size()) + " characters (1.." +
                                            std::to_string(tcp_wire::kTokenBytes) + ")");
  return s;
}

/// Writes `secret` to `path` (mode 0600) whole, replacing what was there (a crashed run's): a
/// new file opened O_EXCL|O_NOFOLLOW under a random name, then renamed into place.
inline void write_private_file(const std::string& path, const std::string& secret) {
  const std::string tmp = path + ".tmp." + random_secret().substr(0, 16);
  const int f = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (f < 0) throw error(errc::transport_error, "tcp: cannot create " + tmp + ": " + std::strerror(errno));
  net::fd hold(f);
  const std::string line = secret + "\n";
  if (::write(f, line.data(), line.size()) != ssize_t(line.size()) || ::fsync(f) != 0) {
    ::unlink(tmp.c_str());
    throw error(errc::transport_error, "tcp: cannot write " + tmp + ": " + std::strerror(errno));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    throw error(errc::transport_error, "tcp: cannot rename " + tmp + ": " + std::strerror(e));
  }
}

/// Whether every rank of this job runs on this host, as far as the launcher says (torchrun's
/// LOCAL_WORLD_SIZE, mpirun's local size, srun's node count, collx's own) or as the rendezvous
/// address shows (a loopback address).
inline bool job_on_one_host(const std::string& master_addr) {
  using detail::env;
  auto same = [&](const char* local, const char* world) {
    return env(local) != nullptr && env(world) != nullptr && std::string(env(local)) == std::string(env(world));
  };
  if (same("LOCAL_WORLD_SIZE", "WORLD_SIZE") || same("OMPI_COMM_WORLD_LOCAL_SIZE", "OMPI_COMM_WORLD_SIZE") ||
      same("COLLX_LOCAL_WORLD_SIZE", "COLLX_WORLD_SIZE"))
    return true;
  for (const char* n : {"SLURM_NNODES", "SLURM_JOB_NUM_NODES"})
    if (env(n) != nullptr && std::string(env(n)) == "1") return true;
  if (master_addr.empty()) return false;
  try {
    return net::resolve(master_addr, 1).is_loopback();
  } catch (const std::exception&) {
    return false;
  }
}

/// COLLX_REQUIRE_SECRET=1: a job that would run without a secret fails instead.
inline bool secret_required() { return detail::env_int("COLLX_REQUIRE_SECRET", 0ll, 1ll, 0) != 0; }

/// What a job across hosts without a secret risks, and the fix (rank 0 prints it once; with
/// COLLX_REQUIRE_SECRET=1 every rank fails with it).
inline std::string no_secret_warning(const std::string& job) {
  return "tcp: job \"" + job + "\" runs across hosts without a secret: anyone who can reach its rendezvous or its ranks' ports "
         "can join it, read and change its data. Give every rank the same secret through COLLX_JOB_TOKEN or "
         "COLLX_JOB_TOKEN_FILE (a file of mode 0600), or a COLLX_STORE_PATH directory only you can read; "
         "COLLX_REQUIRE_SECRET=1 makes this an error (docs/security.md)";
}

}  // namespace collx::transport::tcp_detail
