#pragma once
// This machine through hwloc (Debian's libhwloc-dev; CMake: collx::hwloc): the same collx::machine
// as core/machine.hpp reads from sysfs, with the cores and packages hwloc also knows. Not part of
// <collx/collx.hpp>: include it, and link hwloc, where it is wanted (collx-explain --topology).
#include <hwloc.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "machine.hpp"

namespace collx {

struct machine_hwloc {
  machine m;        // NUMA domains, online and allowed CPUs, as core/machine.hpp has them
  int packages = 0;
  int cores = 0;    // physical cores
  int threads = 0;  // hardware threads (hwloc's PUs)
};

/// This machine, as hwloc sees it.
inline machine_hwloc read_machine_hwloc() {
  hwloc_topology_t t;
  if (hwloc_topology_init(&t) != 0) throw std::runtime_error("hwloc_topology_init failed");
  struct guard {
    hwloc_topology_t& t;
    ~guard() { hwloc_topology_destroy(t); }
  } g{t};
  if (hwloc_topology_load(t) != 0) throw std::runtime_error("hwloc_topology_load failed");
  auto cpus_of = [](hwloc_const_bitmap_t set) {
    std::vector<int> v;
    for (int c = hwloc_bitmap_first(set); c != -1; c = hwloc_bitmap_next(set, c)) v.push_back(c);
    return v;
  };
  machine_hwloc r;
  const machine sys = read_machine();  // (host name, allowed CPUs: this process's, as sysfs would say)
  r.m.host = sys.host;
  r.m.allowed = sys.allowed;
  r.m.online = cpus_of(hwloc_topology_get_topology_cpuset(t));
  const int numa = hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_NUMANODE);
  for (int i = 0; i < numa; ++i) {
    hwloc_obj_t o = hwloc_get_obj_by_type(t, HWLOC_OBJ_NUMANODE, unsigned(i));
    numa_domain d;
    d.id = int(o->os_index);
    d.cpus = cpus_of(o->cpuset);
    d.memory_bytes = o->attr != nullptr ? o->attr->numanode.local_memory : 0;
    if (!d.cpus.empty()) r.m.numa.push_back(std::move(d));
  }
  if (r.m.numa.empty()) r.m.numa.push_back({0, r.m.online, 0});
  r.packages = hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_PACKAGE);
  r.cores = hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_CORE);
  r.threads = hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_PU);
  return r;
}

}  // namespace collx
