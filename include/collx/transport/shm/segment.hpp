#pragma once
// The segment's memory in /dev/shm: reserving it up front, and saying clearly when it does not fit.
//
// tmpfs hands out pages on first touch, and a page it cannot supply (a container's 64 MiB
// /dev/shm is Docker's default) is a SIGBUS in whichever rank touches it first, mid-collective.
// So the creating rank reserves every page at attach (posix_fallocate), and a segment that does
// not fit is an error at attach, on every rank, naming the bytes it needs, the bytes free, and
// the settings that change either.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

namespace collx::transport::shm_detail {

/// "73.2 MiB"
inline std::string human_bytes(std::uint64_t b) {
  char s[32];
  if (b < 1024) std::snprintf(s, sizeof s, "%llu B", static_cast<unsigned long long>(b));
  else if (b < (std::uint64_t(1) << 20)) std::snprintf(s, sizeof s, "%.1f KiB", double(b) / 1024);
  else if (b < (std::uint64_t(1) << 30)) std::snprintf(s, sizeof s, "%.1f MiB", double(b) / double(1 << 20));
  else std::snprintf(s, sizeof s, "%.2f GiB", double(b) / double(1 << 30));
  return s;
}

struct fs_space {
  std::uint64_t free = 0, total = 0;
  bool known = false;
};

/// Free and total bytes of the file system that holds the segment `fd` (tmpfs: /dev/shm).
inline fs_space space_of(int fd) {
  struct statvfs v {};
  if (fstatvfs(fd, &v) != 0) return {};
  return {std::uint64_t(v.f_bavail) * v.f_frsize, std::uint64_t(v.f_blocks) * v.f_frsize, true};
}

/// Reserves bytes [0, bytes) of `fd` (the file already has that size): 0, or the errno.
inline int reserve(int fd, std::size_t bytes) {
  int r;
  do r = posix_fallocate(fd, 0, off_t(bytes));
  while (r == EINTR);
  return r;
}

/// The message of a segment that does not fit: what it needs, what is free, what to change.
inline std::string does_not_fit(int n, std::size_t need, std::size_t per_rank, const fs_space& sp, int err,
                                std::uint32_t slots, std::size_t slot_bytes) {
  std::string s = "cannot reserve the job's shared memory: " + std::to_string(n) + " ranks need " + human_bytes(need) + " (" +
                  human_bytes(per_rank) + " per rank: " + std::to_string(slots) + " slots of " + human_bytes(slot_bytes) +
                  " each, and the channels)";
  if (sp.known) s += ", but /dev/shm has " + human_bytes(sp.free) + " free of " + human_bytes(sp.total);
  s += std::string(" (") + std::strerror(err) + "). Give /dev/shm more room (docker run --shm-size=" +
       std::to_string((need * 2 + (std::size_t(1) << 20) - 1) >> 20) +
       "m, or mount -o remount,size=... /dev/shm), or shrink the footprint: COLLX_SHM_SLOTS=" +
       std::to_string(slots > 4 ? slots / 2 : 1) + " (data slots per rank, now " + std::to_string(slots) +
       "), COLLX_SHM_SLOT_BYTES=" + std::to_string(slot_bytes > 8192 ? slot_bytes / 2 : 4096) + " (now " +
       std::to_string(slot_bytes) + "); docs/shm-footprint.md lists the footprint by rank count";
  return s;
}

/// A mapping of a shared-memory object; unmapped on every path.
class mapping {
 public:
  mapping() = default;
  mapping(const mapping&) = delete;
  mapping& operator=(const mapping&) = delete;
  mapping(mapping&& o) noexcept : p_(o.p_), n_(o.n_) { o.p_ = nullptr; o.n_ = 0; }
  mapping& operator=(mapping&& o) noexcept {
    if (this != &o) {
      reset();
      p_ = o.p_;
      n_ = o.n_;
      o.p_ = nullptr;
      o.n_ = 0;
    }
    return *this;
  }
  ~mapping() { reset(); }
  /// Maps [0, bytes) of fd read-write and shared; false (errno set) when it cannot.
  bool map(int fd, std::size_t bytes) {
    reset();
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) return false;
    p_ = static_cast<std::byte*>(p);
    n_ = bytes;
    return true;
  }
  void reset() noexcept {
    if (p_ != nullptr) munmap(p_, n_);
    p_ = nullptr;
    n_ = 0;
  }
  std::byte* get() const noexcept { return p_; }
  std::size_t size() const noexcept { return n_; }
  /// Gives up ownership (the caller unmaps).
  std::byte* release() noexcept {
    std::byte* p = p_;
    p_ = nullptr;
    n_ = 0;
    return p;
  }

 private:
  std::byte* p_ = nullptr;
  std::size_t n_ = 0;
};

/// An owned descriptor of a shared-memory object.
struct shm_fd {
  int f = -1;
  shm_fd() = default;
  explicit shm_fd(int x) : f(x) {}
  shm_fd(const shm_fd&) = delete;
  shm_fd& operator=(const shm_fd&) = delete;
  ~shm_fd() { reset(); }
  void reset() noexcept {
    if (f >= 0) ::close(f);
    f = -1;
  }
};

}  // namespace collx::transport::shm_detail
