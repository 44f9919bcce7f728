#pragma once
// Every environment variable collx reads, and the one reader of them. Each is listed in
// `collx::env::variables` (the README's table is this list; tests/test_env.cpp checks that every
// COLLX_* name the headers read is here and in the README), and read through one of the
// functions below, which turn a value that does not parse into errc::invalid_argument naming the
// variable and what it must be: a typo never silently means "default".
#include <cerrno>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "error.hpp"

namespace collx::env {

struct variable {
  const char* name;
  const char* value;    // what it takes
  const char* meaning;  // what it does, and its default
};

inline constexpr variable variables[] = {
    {"COLLX_TIMEOUT_S", "seconds (> 0, may be fractional)",
     "the longest any single wait may take before a call fails with errc::timeout (options::timeout); default 300"},
    {"COLLX_CALL_TIMEOUT_S", "seconds (> 0, may be fractional)",
     "the longest a whole call may wait, from its first wait on, however its data trickles in (options::call_timeout); default none"},
    {"COLLX_ALGO", "policy, or collective=policy,...",
     "overrides algo::automatic's choice: `ring`, or `all_reduce=tree,all_gather=ring`; `two_level` where the communicator is on several nodes (algo/automatic.hpp)"},
    {"COLLX_AUTOTUNE", "0 or 1",
     "1: algo::automatic learns from its calls: a new shape's first calls try the model's closest candidates, timed, and the "
     "ranks keep the fastest (algo/automatic.hpp); default 0 (the model alone)"},
    {"COLLX_PROBE_LINK", "0 or 1",
     "transport::two_level on several nodes: algo::automatic's first call measures the link between nodes (α, β, δ: "
     "collectives/common.hpp, docs/nodes.md); 0: the transport's calibration file or shipped numbers instead (rank 0's value counts; the probe's calls have the communicator's deadlines); default 1"},
    {"COLLX_DETERMINISTIC", "0 or 1",
     "1: every all_reduce, reduce_scatter and reduce of floating-point elements gives the ranks' inputs reduced in rank order, "
     "bit for bit the same whatever the policy, size, layout and transport (options::deterministic, algo/deterministic.hpp); "
     "default 0"},
    {"COLLX_RANK", "integer", "this process's rank (with COLLX_WORLD_SIZE; wins over the launchers' variables)"},
    {"COLLX_WORLD_SIZE", "integer", "the job's rank count"},
    {"COLLX_LOCAL_RANK", "integer", "the rank among the job's ranks on this host; default COLLX_RANK"},
    {"COLLX_JOB", "name",
     "names the job (shared-memory segment, rendezvous keys); default from the launcher (PMIX_NAMESPACE, SLURM_JOB_ID, "
     "TORCHELASTIC_RUN_ID and MASTER_ADDR:MASTER_PORT, ...)"},
    {"COLLX_NODE", "name", "transport::two_level: the node this rank is on (ranks with the same name share one); default the host name"},
    {"COLLX_PIN", "0 or 1",
     "transport::two_level: 1 (default) pins each rank its launcher did not pin to its NUMA domain (local rank l of L: "
     "domain l*D/L); 0 leaves every rank where it is"},
    {"COLLX_TOPO_DUMP", "file",
     "transport::two_level: rank 0 writes the job's topology there as JSON (the nodes, the ranks on each, each node's "
     "NUMA domains, CPUs and memory, the transport of each level), as NCCL_TOPO_DUMP does"},
    {"COLLX_STORE_PATH", "directory", "tcp: rendezvous through files in this shared directory instead of rank 0's TCP store"},
    {"COLLX_SOCKET_IFNAME", "interface name", "tcp: listen on this interface; default the one that routes to MASTER_ADDR"},
    {"COLLX_LOCAL_WORLD_SIZE", "integer", "the job's rank count on this host (equal to COLLX_WORLD_SIZE: every rank on one host)"},
    {"COLLX_JOB_TOKEN", "up to 64 characters",
     "tcp: the job's secret, the same on every rank: peers and store clients prove they hold it (HMAC-SHA-256 "
     "challenge-response), it is never sent; unset: COLLX_JOB_TOKEN_FILE, else one drawn for the job and passed privately "
     "where that is possible (docs/security.md)"},
    {"COLLX_JOB_TOKEN_FILE", "path", "tcp: a file of mode 0600, this user's, that holds the job's secret"},
    {"COLLX_TCP_TLS", "0 or 1", "tcp: 1 encrypts every connection between ranks with TLS 1.3, keyed with the job's secret (docs/security.md); default 0"},
    {"COLLX_REQUIRE_SECRET", "0 or 1", "tcp: 1 makes a job that would run without a secret (across hosts, none given) fail instead of warning"},
    {"COLLX_PRIVATE_DIR", "directory",
     "tcp: where a job on one host keeps the secret it drew for its ranks (mode 0700, this user's); default /tmp/collx-<uid>"},
    {"COLLX_TCP_BUFFER_BYTES", "bytes (0 .. 1G; K, M, G suffixes)",
     "tcp: SO_SNDBUF/SO_RCVBUF of every connection, 0 keeps the kernel's autotuning; default 4M"},
    {"COLLX_SHM_SINGLE_COPY_BYTES", "bytes (K, M, G suffixes), or 0",
     "shm: every data-moving message of at least this size is read straight from the sender (process_vm_readv); 0: "
     "never; unset: the measured rules of shm_config"},
    {"COLLX_SHM_SLOTS", "integer (1 .. 4096)",
     "shm: data slots each rank stages its sends in (its share of the segment); default 16"},
    {"COLLX_SHM_SLOT_BYTES", "bytes (4K .. 64M, a multiple of 64; K, M suffixes)", "shm: bytes per data slot; default 64K"},
    {"COLLX_SCHEDULE_CACHE_BYTES", "bytes (0 .. 64G; K, M, G suffixes)",
     "the schedules a communicator keeps for reuse, at most this many bytes (least recently used go first); default 64M"},
    {"COLLX_FLIGHT_RECORDER", "integer (0 .. 1048576)",
     "calls each communicator's flight recorder keeps (comm/flight.hpp), and its wait tables; 0: off; default 512"},
    {"COLLX_DUMP_DIR", "directory",
     "where the flight recorder writes collx-rank<R>.json on a failed call, on SIGUSR2 and on flight::dump; unset: no dump on failure"},
    {"COLLX_DUMP_ON_SIGUSR2", "0 or 1", "1: SIGUSR2 dumps every communicator of the process into COLLX_DUMP_DIR (else .)"},
    {"COLLX_DEBUG", "WARN, INFO, TRACE or OFF",
     "debug lines (core/debug.hpp): WARN failed calls; INFO also communicators made and automatic's choices; TRACE also every "
     "call with its timing; default OFF"},
    {"COLLX_DEBUG_FILE", "path (%r job rank, %p pid, %h host)", "where COLLX_DEBUG's lines go (log.%r: one file per rank); default stderr"},
    {"COLLX_CUDA_DEVICE", "integer (0 .. 1023)",
     "cuda: the device of a process-rank (cuda::from_env, launch_processes); default its local rank modulo the devices"},
    {"COLLX_CUDA_IPC", "auto, vmm or legacy",
     "cuda: how process-ranks map each other's memory: the VMM API with POSIX descriptors, or cudaIpc handles; default auto (vmm where supported)"},
    {"COLLX_BOOTSTRAP", "shm or tcp", "cuda::from_env: the host communicator process-ranks are bootstrapped over; default shm"},
};

inline const variable* find(std::string_view name) noexcept {
  for (const variable& v : variables)
    if (name == v.name) return &v;
  return nullptr;
}

}  // namespace collx::env

namespace collx::detail {

/// The variable's value, or nullptr when it is unset or empty.
inline const char* env(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != 0 ? v : nullptr;
}

[[noreturn]] inline void bad_env(const char* name, const char* value, const std::string& must) {
  throw error(errc::invalid_argument, std::string(name) + "=\"" + value + "\" is not " + must);
}

/// An integer in [lo, hi]; `fallback` when unset.
inline long long env_int(const char* name, long long lo, long long hi, long long fallback) {
  const char* v = env(name);
  if (v == nullptr) return fallback;
  char* end = nullptr;
  errno = 0;
  const long long x = std::strtoll(v, &end, 10);
  if (end == v || *end != 0 || errno == ERANGE || x < lo || x > hi)
    bad_env(name, v, "an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return x;
}

/// An integer in [lo, hi] that must be set (the launchers' variables).
inline int env_int(const char* name, int lo, int hi) {
  if (env(name) == nullptr) throw error(errc::invalid_argument, std::string(name) + " is not set");
  return int(env_int(name, lo, hi, 0));
}

/// "65536", "64K", "64KiB", "16M", "1G" (powers of 1024); a value in [lo, hi]; `fallback` when unset.
inline std::uint64_t parse_bytes(const char* name, const char* v, std::uint64_t lo, std::uint64_t hi) {
  auto must = [&] { return "a byte count in [" + std::to_string(lo) + ", " + std::to_string(hi) + "] (K, M, G suffixes)"; };
  char* end = nullptr;
  errno = 0;
  if (*v == '-' || *v == '+') bad_env(name, v, must());
  const unsigned long long x = std::strtoull(v, &end, 10);
  if (end == v || errno == ERANGE) bad_env(name, v, must());
  std::string_view suffix(end);
  unsigned shift = 0;
  if (suffix == "K" || suffix == "KiB" || suffix == "k") shift = 10;
  else if (suffix == "M" || suffix == "MiB") shift = 20;
  else if (suffix == "G" || suffix == "GiB") shift = 30;
  else if (!suffix.empty()) bad_env(name, v, must());
  if (shift != 0 && x > (~0ull >> shift)) bad_env(name, v, must());
  const std::uint64_t b = std::uint64_t(x) << shift;
  if (b < lo || b > hi) bad_env(name, v, must());
  return b;
}

inline std::uint64_t env_bytes(const char* name, std::uint64_t lo, std::uint64_t hi, std::uint64_t fallback) {
  const char* v = env(name);
  return v == nullptr ? fallback : parse_bytes(name, v, lo, hi);
}

/// Seconds > 0 (fractional allowed), at most 1e9; `fallback` when unset.
inline double env_seconds(const char* name, double fallback) {
  const char* v = env(name);
  if (v == nullptr) return fallback;
  char* end = nullptr;
  const double s = std::strtod(v, &end);
  if (end == v || *end != 0 || !(s > 0) || !std::isfinite(s) || s > 1e9) bad_env(name, v, "a positive number of seconds");
  return s;
}

/// A string; `fallback` when unset.
inline std::string env_string(const char* name, std::string fallback = {}) {
  const char* v = env(name);
  return v == nullptr ? std::move(fallback) : std::string(v);
}

}  // namespace collx::detail
