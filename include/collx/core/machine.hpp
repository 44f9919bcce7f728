#pragma once
// This machine as collx places ranks on it: its NUMA domains, the CPUs and memory of each, and the
// CPUs this process may run on. Read from Linux's sysfs (/sys/devices/system/node), which is what
// hwloc reads too (collx/topology/hwloc.hpp reads the same through hwloc, and the tests check
// that the two agree); one domain of every online CPU where sysfs has none.
//
// Placement (transport/two_level.hpp): a node's local rank l of L goes to domain l·D/L of the D
// domains, so consecutive local ranks share a domain and every domain gets its share. A process
// whose launcher pinned it (its allowed CPUs are not all the online ones) is left where it is.
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace collx {

struct numa_domain {
  int id = 0;
  std::vector<int> cpus;          // OS indices
  std::uint64_t memory_bytes = 0;  // 0 when not known
};

struct machine {
  std::string host;
  std::vector<numa_domain> numa;
  std::vector<int> online;   // every online CPU
  std::vector<int> allowed;  // those this process may run on (its affinity)

  /// Whether something (a launcher: mpirun --bind-to, srun --cpu-bind, taskset) restricted this
  /// process's CPUs.
  bool pinned() const { return !online.empty() && allowed.size() < online.size(); }
  /// The domain local rank l of L ranks on this machine is placed in.
  int domain_of(int l, int L) const {
    const int D = std::max<int>(1, int(numa.size()));
    return L <= 0 ? 0 : int(std::int64_t(l) * D / L);
  }
};

namespace detail_machine {
/// "0-3,8,10-11" -> {0, 1, 2, 3, 8, 10, 11}.
inline std::vector<int> parse_list(const std::string& s) {
  std::vector<int> v;
  std::stringstream in(s);
  std::string part;
  while (std::getline(in, part, ',')) {
    if (part.empty() || part == "\n") continue;
    int a = 0, b = 0;
    if (std::sscanf(part.c_str(), "%d-%d", &a, &b) == 2) {
      for (int x = a; x <= b; ++x) v.push_back(x);
    } else if (std::sscanf(part.c_str(), "%d", &a) == 1) {
      v.push_back(a);
    }
  }
  return v;
}
inline std::string read_line(const std::string& path) {
  std::ifstream f(path);
  std::string s;
  std::getline(f, s);
  return s;
}
/// "0-3,8" from {0, 1, 2, 3, 8}.
inline std::string format_list(const std::vector<int>& v) {
  std::string s;
  for (std::size_t i = 0; i < v.size();) {
    std::size_t j = i;
    while (j + 1 < v.size() && v[j + 1] == v[j] + 1) ++j;
    s += (s.empty() ? "" : ",") + std::to_string(v[i]) + (j > i ? "-" + std::to_string(v[j]) : "");
    i = j + 1;
  }
  return s;
}
}  // namespace detail_machine

/// This machine, read from sysfs (`root`: where /sys is, for tests).
inline machine read_machine(const std::string& root = "/sys/devices/system") {
  using namespace detail_machine;
  machine m;
  char h[256] = {};
  ::gethostname(h, sizeof h - 1);
  m.host = h;
  m.online = parse_list(read_line(root + "/cpu/online"));
  if (m.online.empty())
    for (long c = 0; c < ::sysconf(_SC_NPROCESSORS_ONLN); ++c) m.online.push_back(int(c));
  for (int id : parse_list(read_line(root + "/node/online"))) {
    numa_domain d;
    d.id = id;
    const std::string dir = root + "/node/node" + std::to_string(id);
    d.cpus = parse_list(read_line(dir + "/cpulist"));
    std::ifstream mi(dir + "/meminfo");
    for (std::string line; std::getline(mi, line);) {
      unsigned long long kb = 0;
      if (line.find("MemTotal:") != std::string::npos && std::sscanf(line.substr(line.find(':') + 1).c_str(), "%llu", &kb) == 1)
        d.memory_bytes = kb * 1024;
    }
    if (!d.cpus.empty()) m.numa.push_back(std::move(d));  // (domains of memory alone take no ranks)
  }
  if (m.numa.empty()) m.numa.push_back({0, m.online, 0});
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof set, &set) == 0) {
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &set)) m.allowed.push_back(c);
  } else {
    m.allowed = m.online;
  }
  return m;
}

/// Pins this process to domain d's CPUs (memory then comes from there by first touch). False,
/// and nothing changed, where the domain has no CPUs or the kernel refuses.
inline bool pin_to_domain(const machine& m, int d) {
  if (d < 0 || d >= int(m.numa.size()) || m.numa[std::size_t(d)].cpus.empty()) return false;
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : m.numa[std::size_t(d)].cpus)
    if (c >= 0 && c < CPU_SETSIZE) CPU_SET(c, &set);
  return ::sched_setaffinity(0, sizeof set, &set) == 0;
}

/// The machine as JSON (COLLX_TOPO_DUMP: transport/two_level.hpp).
inline std::string to_json(const machine& m) {
  using detail_machine::format_list;
  std::string s = "{\"host\": \"" + m.host + "\", \"cpus_online\": \"" + format_list(m.online) + "\", \"numa\": [";
  for (std::size_t i = 0; i < m.numa.size(); ++i) {
    const numa_domain& d = m.numa[i];
    s += std::string(i ? ", " : "") + "{\"id\": " + std::to_string(d.id) + ", \"cpus\": \"" + format_list(d.cpus) +
         "\", \"memory_bytes\": " + std::to_string(d.memory_bytes) + "}";
  }
  return s + "]}";
}

}  // namespace collx
