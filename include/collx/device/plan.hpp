#pragma once
// A device plan: one rank's schedule (core/schedule.hpp) lowered to the flat array of operations a
// kernel walks, and the walk itself (run_plan), written once for the host and the device.
//
// The protocol is single copy and pull-based, as between threads of one process: a sender
// *posts* a message (where its data is, how many bytes, the call's signature) into a mailbox
// slot of the (sender, receiver) pair and raises the pair's `posted` counter; the receiver waits
// for that counter, reads the sender's memory directly (peer-mapped memory on a GPU, the same
// address space for threads) and combines it into its own, chunk by chunk, raising the pair's
// `taken` counter once per chunk; the sender waits for `taken` before it lets a later step
// overwrite what it sent. Counters are monotonic 64-bit (they never wrap) and count from the
// communicator's first call: a plan holds offsets from the call's start, and the caller passes
// where each pair's counters stood when the call began.
//
// A step becomes phases; the workers of one rank (the blocks of its kernel; one thread on the
// host) share each phase's work, chunk by chunk, and meet at a barrier after it:
//   copies | barrier, posts, pulls ... | barrier, pulls that read what earlier pulls wrote | ...,
//   awaits | barrier
// (a receive whose local operand an earlier receive of the step writes, a tree node summing
// two children, runs in a later phase than it). Posts and awaits are worker 0's.
//
// Nothing here includes CUDA: the file compiles as plain C++ (the lowering, and the host
// interpreter the tests run: transport/planned.hpp), and under nvcc its walk is __host__
// __device__ (cuda/plan_kernel.cuh runs it in a kernel).
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "../core/schedule.hpp"
#include "layout.hpp"

#if defined(__CUDACC__)
#define COLLX_HD __host__ __device__
#else
#define COLLX_HD
#endif

namespace collx::device {

enum class op_kind : std::uint8_t {
  copy,   // dst <- src, both local
  post,   // publish src (bytes) as message n to peer
  pull,   // dst <- message n from peer (combined with the local operand `src` unless how == copy)
  await,  // wait until peer has taken n chunks of this call's messages to it
};

/// One operation; offsets and sizes in bytes; buffers are collx::buf values (in, out, tmp).
struct plan_op {
  op_kind kind = op_kind::copy;
  std::uint8_t how = 0;      // collx::combine, for pull
  std::uint8_t dst_buf = 0;  // copy, pull
  std::uint8_t src_buf = 0;  // copy's source, post's data, pull's local operand
  std::int32_t peer = -1;    // post, pull, await
  std::uint64_t dst_off = 0;
  std::uint64_t src_off = 0;
  std::uint64_t bytes = 0;
  std::uint64_t n = 0;  // post, pull: the message's index among this call's to or from peer; await: chunks
};

/// Operations [begin, end) of the plan; a barrier of the rank's workers follows when `barrier`.
struct plan_phase {
  std::uint32_t begin = 0, end = 0;
  std::uint32_t barrier = 1;
};

/// What a kernel reads: trivially copyable pointers into arrays the plan owns (or their device
/// copies).
struct plan_view {
  const plan_op* ops = nullptr;
  const plan_phase* phases = nullptr;
  std::uint32_t n_phases = 0;
  std::uint64_t chunk = 0;  // bytes a worker moves at a time: a multiple of 16 and of the element
};

/// A lowered schedule and what it moves per peer (to advance the pair counters after the call).
struct plan {
  std::vector<plan_op> ops;
  std::vector<plan_phase> phases;
  std::uint64_t chunk = 0;
  std::size_t elem = 1;
  std::vector<std::uint64_t> msgs_to, chunks_to, msgs_from;  // per peer
  std::uint32_t max_posts_per_step = 0;                      // per peer, the largest
  /// Bytes of each buffer (collx::buf: none, in, out, tmp) the plan touches, from its start:
  /// what a transport that stages or exports the buffers must cover.
  std::uint64_t extent[4] = {0, 0, 0, 0};
  /// Bit b set: the plan posts messages from buffer b (its peers read it: between processes it
  /// must be memory they can map).
  unsigned posts_from = 0;
  plan_view view() const { return {ops.data(), phases.data(), std::uint32_t(phases.size()), chunk}; }
  std::size_t memory_bytes() const {
    return sizeof(*this) + ops.capacity() * sizeof(plan_op) + phases.capacity() * sizeof(plan_phase) +
           (msgs_to.capacity() + chunks_to.capacity() + msgs_from.capacity()) * sizeof(std::uint64_t);
  }
};

/// Chunks a message of `bytes` is taken in: at least one (a message of no bytes is still taken).
COLLX_HD inline std::uint64_t chunks_of(std::uint64_t bytes, std::uint64_t chunk) {
  return bytes == 0 ? 1 : (bytes + chunk - 1) / chunk;
}

/// The chunk size for elements of `elem` bytes: `want` rounded down to a multiple of 16 and of
/// elem (16-byte vector loads never straddle an element), at least one such multiple.
inline std::uint64_t chunk_for(std::size_t elem, std::uint64_t want) {
  std::uint64_t a = 16, b = elem == 0 ? 1 : elem;
  while (b != 0) {
    const std::uint64_t t = a % b;
    a = b;
    b = t;
  }
  const std::uint64_t unit = 16 / a * (elem == 0 ? 1 : elem);  // lcm(16, elem)
  return want < unit ? unit : want / unit * unit;
}

/// Lowers rank's schedule `s` over `nranks` ranks for elements of `elem` bytes.
inline plan lower(const schedule& s, int nranks, std::size_t elem, std::uint64_t chunk_want) {
  if (!s.folds().empty())
    throw std::invalid_argument("collx: the deterministic mode's folds (algo::deterministic) run on host transports; "
                                "a device plan has none yet");
  plan p;
  p.elem = elem;
  p.chunk = chunk_for(elem, chunk_want);
  const auto n = std::size_t(nranks);
  p.msgs_to.assign(n, 0);
  p.chunks_to.assign(n, 0);
  p.msgs_from.assign(n, 0);
  std::vector<std::uint32_t> posts_now(n, 0);
  std::vector<int> awaited;
  auto bytes = [&](const region& r) { return std::uint64_t(r.count) * elem; };
  auto off = [&](const region& r) { return std::uint64_t(r.offset) * elem; };
  auto touch = [&](const region& r) {
    const auto b = std::size_t(r.b) & 3;
    if (r.count != 0 && off(r) + bytes(r) > p.extent[b]) p.extent[b] = off(r) + bytes(r);
  };
  for (const copy_op& c : s.copies()) touch(c.dst), touch(c.src);
  for (const send_op& o : s.sends()) touch(o.src), p.posts_from |= 1u << (unsigned(o.src.b) & 3);
  for (const recv_op& r : s.recvs()) touch(r.dst), r.how == combine::copy ? void() : touch(r.with);
  for (const region& r : s.finals()) touch(r);
  auto close = [&](std::uint32_t barrier) {
    const auto at = std::uint32_t(p.ops.size());
    const std::uint32_t begin = p.phases.empty() ? 0 : p.phases.back().end;
    if (at > begin) p.phases.push_back({begin, at, barrier});
  };
  auto overlaps = [&](std::uint8_t b, std::uint64_t o, std::uint64_t len, std::uint8_t b2, std::uint64_t o2, std::uint64_t len2) {
    return b == b2 && o < o2 + len2 && o2 < o + len;
  };
  for (const step& st : s.steps()) {
    // Copies run in order on the host; here a phase's chunks run on many workers at once, so a
    // copy that reads or writes what an earlier copy of its phase writes, or writes what one
    // reads, starts a new phase, and one whose source and destination overlap (memmove) runs
    // whole on worker 0 (how = 1).
    std::uint32_t copies_begin = std::uint32_t(p.ops.size());
    for (auto i = st.copies_begin; i < st.copies_end; ++i) {
      const copy_op& c = s.copies()[i];
      const auto db = std::uint8_t(c.dst.b), sb = std::uint8_t(c.src.b);
      const std::uint64_t len = bytes(c.src);
      bool depends = false;
      for (auto j = copies_begin; j < p.ops.size(); ++j) {
        const plan_op& e = p.ops[j];
        if (overlaps(db, off(c.dst), len, e.dst_buf, e.dst_off, e.bytes) || overlaps(sb, off(c.src), len, e.dst_buf, e.dst_off, e.bytes) ||
            overlaps(db, off(c.dst), len, e.src_buf, e.src_off, e.bytes))
          depends = true;
      }
      if (depends) {
        close(1);
        copies_begin = std::uint32_t(p.ops.size());
      }
      const bool serial = overlaps(db, off(c.dst), len, sb, off(c.src), len);
      p.ops.push_back({op_kind::copy, std::uint8_t(serial ? 1 : 0), db, sb, -1, off(c.dst), off(c.src), len, 0});
    }
    close(1);
    std::fill(posts_now.begin(), posts_now.end(), 0u);
    awaited.clear();
    for (auto i = st.sends_begin; i < st.sends_end; ++i) {
      const send_op& o = s.sends()[i];
      const auto q = std::size_t(o.peer);
      if (o.peer < 0 || q >= n) throw std::invalid_argument("collx: a schedule sends to rank " + std::to_string(o.peer));
      if (++posts_now[q] > kSlots)
        throw std::length_error("collx: a schedule step posts more than " + std::to_string(kSlots) +
                                " messages to one peer (device plans hold that many per pair)");
      if (posts_now[q] > p.max_posts_per_step) p.max_posts_per_step = posts_now[q];
      p.ops.push_back({op_kind::post, 0, 0, std::uint8_t(o.src.b), o.peer, 0, off(o.src), bytes(o.src), p.msgs_to[q]++});
      p.chunks_to[q] += chunks_of(bytes(o.src), p.chunk);
      if (posts_now[q] == 1) awaited.push_back(o.peer);
    }
    // Receives, in phases: one that reads or writes what an earlier one of its phase writes
    // starts a new phase (after a barrier, so every worker's chunks of the earlier are done).
    std::uint32_t phase_begin = std::uint32_t(p.ops.size());
    for (auto i = st.recvs_begin; i < st.recvs_end; ++i) {
      const recv_op& r = s.recvs()[i];
      const auto q = std::size_t(r.peer);
      if (r.peer < 0 || q >= n) throw std::invalid_argument("collx: a schedule receives from rank " + std::to_string(r.peer));
      const auto db = std::uint8_t(r.dst.b);
      const auto wb = std::uint8_t(r.how == combine::copy ? buf::none : r.with.b);
      const std::uint64_t len = bytes(r.dst);
      bool depends = false;
      for (auto j = phase_begin; j < p.ops.size(); ++j) {
        const plan_op& e = p.ops[j];
        if (e.kind != op_kind::pull) continue;
        // It writes or reads what an earlier one writes, or writes what an earlier one reads.
        if (overlaps(db, off(r.dst), len, e.dst_buf, e.dst_off, e.bytes) ||
            (wb != std::uint8_t(buf::none) && overlaps(wb, off(r.with), len, e.dst_buf, e.dst_off, e.bytes)) ||
            (e.how != 0 && overlaps(db, off(r.dst), len, e.src_buf, e.src_off, e.bytes)))
          depends = true;
      }
      if (depends) {
        close(1);
        phase_begin = std::uint32_t(p.ops.size());
      }
      p.ops.push_back({op_kind::pull, std::uint8_t(r.how), db, wb, r.peer, off(r.dst), r.how == combine::copy ? 0 : off(r.with),
                       len, p.msgs_from[q]++});
    }
    for (int q : awaited) p.ops.push_back({op_kind::await, 0, 0, 0, q, 0, 0, 0, p.chunks_to[std::size_t(q)]});
    close(1);
  }
  p.ops.shrink_to_fit();
  p.phases.shrink_to_fit();
  return p;
}

/// Where each pair's counters stood when the call began (per peer): messages this rank had
/// posted to it, chunks of them it had taken, messages this rank had received from it.
struct bases {
  const std::uint64_t* sent = nullptr;
  const std::uint64_t* taken = nullptr;
  const std::uint64_t* received = nullptr;
};

/// Walks plan `p` for one worker of a rank. `env` moves data and waits (the host's in
/// transport/planned.hpp, the device's in cuda/plan_kernel.cuh):
///   int worker(), workers()               this worker and how many share the rank's work
///   bool reversed()                       take a phase's copies and receives last to first
///                                         (the host's test of the phase split: the result must
///                                         not depend on the order within a phase)
///   std::byte* base(std::uint8_t buf)     this rank's in, out, tmp
///   void post(int peer, uint64_t index, std::uint8_t buf, uint64_t off, uint64_t bytes)
///                                         publishes bytes at `off` of this rank's buffer `buf`
///                                         (an address, or the buffer and offset between
///                                         processes: layout.hpp, address_of_buffer)
///   bool arrived(int peer, uint64_t index, uint64_t bytes, const std::byte*& data)
///                                         waits for message `index` from peer, checks it
///                                         matches (signature, size), says where its data is
///   void copy(std::byte* d, const std::byte* s, uint64_t bytes)
///   void move(std::byte* d, const std::byte* s, uint64_t bytes)   overlapping: memmove, one worker
///   void combine(int peer, std::byte* d, const std::byte* with, const std::byte* recv,
///                uint64_t bytes, std::uint8_t how)
///   void take(int peer)                   one more chunk of peer's messages is taken
///   bool taken(int peer, uint64_t chunks) waits until peer has taken that many of ours
///   bool barrier()                        every worker of this rank meets
/// A wait that fails (deadline, a lost peer, a mismatch) returns false; the walk stops and the
/// env knows why. Returns true when the plan ran to its end.
///
/// Within a phase: worker 0 posts first, then every worker takes its share of the copies' and
/// receives' chunks (chunk c of operation i belongs to worker (i + c) % workers), then worker 0
/// awaits.
#if defined(__CUDACC__)
#pragma nv_exec_check_disable
#endif
template <class Env>
COLLX_HD bool run_plan(const plan_view& p, const bases& b, Env& env) {
  const int w = env.worker(), nw = env.workers();
  const bool rev = env.reversed();
  for (std::uint32_t ph = 0; ph < p.n_phases; ++ph) {
    const std::uint32_t begin = p.phases[ph].begin, end = p.phases[ph].end;
    if (w == 0)
      for (std::uint32_t i = begin; i < end; ++i) {
        const plan_op& o = p.ops[i];
        if (o.kind == op_kind::post) env.post(o.peer, b.sent[o.peer] + o.n, o.src_buf, o.src_off, o.bytes);
      }
    for (std::uint32_t x = begin; x < end; ++x) {
      const std::uint32_t i = rev ? end - 1 - (x - begin) : x;
      const plan_op& o = p.ops[i];
      if (o.kind == op_kind::copy) {
        if (o.how != 0) {  // source and destination overlap: whole, in order, on worker 0
          if (w == 0 && o.bytes != 0) env.move(env.base(o.dst_buf) + o.dst_off, env.base(o.src_buf) + o.src_off, o.bytes);
          continue;
        }
        const std::uint64_t k = chunks_of(o.bytes, p.chunk);
        for (std::uint64_t y = 0; y < k; ++y) {
          const std::uint64_t c = rev ? k - 1 - y : y;
          if ((i + c) % std::uint64_t(nw) != std::uint64_t(w) || o.bytes == 0) continue;
          const std::uint64_t at = c * p.chunk, len = o.bytes - at < p.chunk ? o.bytes - at : p.chunk;
          env.copy(env.base(o.dst_buf) + o.dst_off + at, env.base(o.src_buf) + o.src_off + at, len);
        }
      } else if (o.kind == op_kind::pull) {
        const std::uint64_t k = chunks_of(o.bytes, p.chunk);
        for (std::uint64_t y = 0; y < k; ++y) {
          const std::uint64_t c = rev ? k - 1 - y : y;
          if ((i + c) % std::uint64_t(nw) != std::uint64_t(w)) continue;
          const std::byte* data = nullptr;
          if (!env.arrived(o.peer, b.received[o.peer] + o.n, o.bytes, data)) return false;
          const std::uint64_t at = c * p.chunk, len = o.bytes - at < p.chunk ? o.bytes - at : p.chunk;
          if (len != 0) {
            std::byte* d = env.base(o.dst_buf) + o.dst_off + at;
            const std::byte* with = o.how == 0 ? nullptr : env.base(o.src_buf) + o.src_off + at;
            env.combine(o.peer, d, with, data + at, len, o.how);
          }
          env.take(o.peer);
        }
      }
    }
    if (w == 0)
      for (std::uint32_t i = begin; i < end; ++i) {
        const plan_op& o = p.ops[i];
        if (o.kind == op_kind::await && !env.taken(o.peer, b.taken[o.peer] + o.n)) return false;
      }
    if (p.phases[ph].barrier && !env.barrier()) return false;
  }
  return true;
}

}  // namespace collx::device
