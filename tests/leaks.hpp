#pragma once
// What a process holds, for tests that check nothing is left behind: its open descriptors, its
// threads, the collx segments it has mapped, and the names in /dev/shm.
#include <dirent.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <set>
#include <string>

namespace collx_test {

/// This process's open descriptors, as what they point to (a socket's inode, a file), so one
/// closed and another opened under the same number still differ.
inline std::set<std::string> open_fds() {
  std::set<std::string> out;
  if (DIR* d = ::opendir("/proc/self/fd")) {
    while (dirent* e = ::readdir(d)) {
      if (e->d_name[0] == '.') continue;
      char target[512] = {};
      const std::string link = std::string("/proc/self/fd/") + e->d_name;
      const ssize_t k = ::readlink(link.c_str(), target, sizeof target - 1);
      if (k > 0 && std::strstr(target, "/proc/") == nullptr) out.insert(std::string(target, std::size_t(k)));  // not opendir's own
    }
    ::closedir(d);
  }
  return out;
}

/// The threads of a process (`proc`: its /proc folder; this process's by default).
inline int thread_count(const std::string& proc = "/proc/self") {
  int k = 0;
  if (DIR* d = ::opendir((proc + "/task").c_str())) {
    while (dirent* e = ::readdir(d)) k += e->d_name[0] != '.';
    ::closedir(d);
  }
  return k;
}

/// The collx segments this process has mapped (a segment unlinked once attached shows as
/// "(deleted)").
inline std::set<std::string> mapped_segments() {
  std::set<std::string> out;
  if (FILE* f = std::fopen("/proc/self/maps", "r")) {
    char line[1024];
    while (std::fgets(line, sizeof line, f) != nullptr)
      if (const char* at = std::strstr(line, "/dev/shm/collx-")) out.insert(at);
    std::fclose(f);
  }
  return out;
}

/// How many names in /dev/shm start with `prefix`.
inline int shm_names(const std::string& prefix) {
  int k = 0;
  if (DIR* d = ::opendir("/dev/shm")) {
    while (dirent* e = ::readdir(d))
      if (std::strncmp(e->d_name, prefix.c_str(), prefix.size()) == 0) ++k;
    ::closedir(d);
  }
  return k;
}

}  // namespace collx_test
