#pragma once
// The memory a device plan's protocol (device/plan.hpp) runs in, laid out once for every place
// it lives: cuda::transport's thread-ranks (one process, every rank's region in device memory),
// its process-ranks (each region exported and mapped by the peers: features/device_ipc.hpp), and the
// host interpreter the tests run across processes.
//
// - A rank's region: an inbox from every peer (the messages posted to this rank: it polls them),
//   an ack per peer (the chunks the peer has taken of this rank's messages: it polls them), its
//   workers' barrier counter, where each pair's counters stood when its current call began
//   (the bases), and four tables of pointers into the peers' regions, which the rank's walk
//   reads instead of computing where a peer's memory is.
// - The job block: host memory every rank and every kernel reads (mapped): the abort flag, the
//   first rank to fail, and per rank its failure reason, its statuses (why a kernel stopped,
//   one slot per call in flight) and how many of its kernels were launched and have ended.
//
// Plain C++ (trivially copyable structs): the host builds and reads all of it; under nvcc the
// kernel does too.
#include <cstddef>
#include <cstdint>

namespace collx::device {

/// Mailbox slots per ordered pair of ranks: the most messages one step may post to one peer.
inline constexpr std::uint32_t kSlots = 32;

/// A message as posted: where its data is, its size, and the call's signature hash
/// (core/call_info.hpp), which the receiver compares with its own. `addr` is an address the receiver
/// can read (threads of one process), or, between processes, the buffer and offset it is at in
/// the sender's memory (addr_of_buffer): the receiver adds where it mapped that buffer.
struct message {
  std::uint64_t addr;
  std::uint64_t bytes;
  std::uint64_t sig;
};

/// Between processes a posted address names one of the sender's buffers (collx::buf: in, out,
/// tmp) and an offset in it: bit 63 set, the buffer in bits 60-62.
inline constexpr std::uint64_t kBufferAddress = std::uint64_t(1) << 63;
inline constexpr std::uint64_t address_of_buffer(std::uint8_t buf, std::uint64_t off) noexcept {
  return kBufferAddress | (std::uint64_t(buf & 7) << 60) | off;
}
inline constexpr std::uint8_t buffer_of_address(std::uint64_t a) noexcept { return std::uint8_t((a >> 60) & 7); }
inline constexpr std::uint64_t offset_of_address(std::uint64_t a) noexcept { return a & ((std::uint64_t(1) << 60) - 1); }

/// One ordered pair's mailbox side, in the receiver's region: it polls `posted` and reads the slots.
struct alignas(128) inbox {
  std::uint64_t posted;
  std::uint64_t pad_[15];
  message slots[kSlots];
};
/// The other side, in the sender's region: it polls `taken`, which the receiver raises once per chunk.
struct alignas(128) ack {
  std::uint64_t taken;
  std::uint64_t pad_[15];
};

/// Why a kernel stopped early; the host reads it after the stream has passed the kernel.
struct plan_status {
  int code;  // a status_code
  int peer;
  std::uint64_t aux;  // mismatch: the peer's bytes
};
enum status_code : int {
  st_ok = 0,
  st_timeout = 1,
  st_mismatch_bytes = 2,
  st_mismatch_call = 3,
  st_aborted = 4,
  st_bad_address = 5,  // a peer process posted from a buffer it did not announce (aux: the address)
};

/// Where things are in a rank's region of a group of n ranks (byte offsets).
struct region_layout {
  int n = 1;
  constexpr std::size_t inboxes() const noexcept { return 0; }
  constexpr std::size_t acks() const noexcept { return std::size_t(n) * sizeof(inbox); }
  /// A line of the rank's own: its workers' barrier counter (word 0), the counter's value when
  /// the current launch began (word 8: the kernel's block 0 advances it at the end), and the
  /// blocks of its launches that have ended (word 4: the last block out counts the launch as
  /// ended in the job block).
  constexpr std::size_t line() const noexcept { return acks() + std::size_t(n) * sizeof(ack); }
  constexpr std::size_t bases() const noexcept { return line() + 128; }  // [3][n]: sent, taken, received
  constexpr std::size_t tables() const noexcept { return bases() + 3 * std::size_t(n) * sizeof(std::uint64_t); }  // [4][n] pointers
  constexpr std::size_t bytes() const noexcept { return tables() + 4 * std::size_t(n) * sizeof(void*) + 128; }
};

/// Words of a region's own line.
inline constexpr std::size_t kBarrierWord = 0, kExitedWord = 4, kBarrierBaseWord = 8;

/// Status slots per rank: the most calls of one rank whose kernels may be in flight at once (a
/// stream-ordered nonblocking call holds its slot until its work is waited for or tested done).
inline constexpr int kStatusSlots = 64;
/// Bytes of a rank's failure reason kept in the job block (its head and tail when longer).
inline constexpr std::size_t kWhyBytes = 448;

struct alignas(64) job_header {
  std::uint64_t magic;
  std::int32_t n;
  std::int32_t first_failed;  // -1 until a rank fails
  alignas(64) std::int32_t abort;  // nonzero once any rank failed: kernels poll it
};
struct alignas(64) job_rank {
  std::uint64_t launched;  // kernels the rank's host has launched (it raises this before the launch)
  std::uint64_t finished;  // of those, the ones that have ended (the kernel's last block raises it)
  std::uint64_t blocks;    // blocks of those launches (each launch's last block out is the one
                           // that finds the region's exited count at this)
  std::int32_t failed;     // 1 once the rank failed (its reason is in `why`), 2 once it left in order
  std::int32_t pid;
  std::uint32_t doorbell[2];  // host waiters sleep on it (detail::waitable: word, sleepers)
  char why[kWhyBytes];
  plan_status status[kStatusSlots];
};
inline constexpr std::uint64_t kJobMagic = 0x636f6c6c786a6231ull;  // "collxjb1"

/// Where things are in the job block of n ranks.
struct job_layout {
  int n = 1;
  constexpr std::size_t bytes() const noexcept { return sizeof(job_header) + std::size_t(n) * sizeof(job_rank); }
  static job_header* header(void* base) noexcept { return static_cast<job_header*>(base); }
  static job_rank* rank(void* base, int r) noexcept {
    return reinterpret_cast<job_rank*>(static_cast<char*>(base) + sizeof(job_header)) + r;
  }
};

}  // namespace collx::device
