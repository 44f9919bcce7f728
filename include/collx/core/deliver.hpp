#pragma once
// The movement of a message's bytes, shared by every host transport: a piece of a message,
// wherever it arrived (the sender's own memory over threads or single copy, a shared-memory slot,
// a socket's bounce buffer), is either copied into its destination or reduced with the local
// operand, in the order the schedule asks for (core/schedule.hpp, combine); and a send's bytes are
// read out of its buffer. Transports call these and nothing else to touch a message's operands,
// so an operand spread over several buffers (core/concepts.hpp: pieces, a fused batch) is handled
// here once.
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "concepts.hpp"

namespace collx::detail {

/// Where byte `off` of an operand is (`p`, or the pieces of `s`), shortening len to the
/// contiguous bytes that follow it; `hint` carries the part found from one run to the next.
template <class B>
B* operand_at(B* p, const operand& s, std::size_t off, std::size_t& len, std::size_t& hint) {
  if (s.of == nullptr) return p + off;
  return s.of->locate(s.at + off, len, hint);
}
template <class B>
B* operand_at(B* p, const operand& s, std::size_t off, std::size_t& len) {
  std::size_t hint = SIZE_MAX;
  return operand_at(p, s, off, len, hint);
}

/// Calls f(pointer, length) for each contiguous run of bytes [off, off + nb) of send d.
template <class F>
void send_runs(const send_desc& d, std::size_t off, std::size_t nb, F&& f) {
  std::size_t hint = SIZE_MAX;
  while (nb != 0) {
    std::size_t len = nb;
    const std::byte* p = operand_at(d.data, d.spread, off, len, hint);
    f(p, len);
    off += len;
    nb -= len;
  }
}

/// Copies bytes [off, off + nb) of send d to `to`.
inline void gather(std::byte* to, const send_desc& d, std::size_t off, std::size_t nb) {
  if (d.spread.of == nullptr) {
    if (nb != 0) std::memcpy(to, d.data + off, nb);
    return;
  }
  send_runs(d, off, nb, [&](const std::byte* p, std::size_t len) {
    std::memcpy(to, p, len);
    to += len;
  });
}

/// Delivers `nb` received bytes at `src` to bytes [off, off + nb) of receive `d`. For a
/// reduction `nb` is a whole number of elements (comb.elem_size each).
inline void deliver(const recv_desc& d, std::size_t off, const std::byte* src, std::size_t nb, const combiner& comb) {
  std::size_t dh = SIZE_MAX, wh = SIZE_MAX;
  while (nb != 0) {
    std::size_t len = nb;
    std::byte* dst = operand_at(d.dst, d.dst_spread, off, len, dh);
    const std::byte* with = d.how == combine::copy ? nullptr : operand_at(d.with, d.with_spread, off, len, wh);
    switch (d.how) {
      case combine::copy: std::memcpy(dst, src, len); break;
      case combine::received_left: comb(dst, src, with, len / comb.elem_size); break;
      case combine::received_right: comb(dst, with, src, len / comb.elem_size); break;
    }
    off += len;
    src += len;
    nb -= len;
  }
}

/// Delivers bytes [off, off + nb) of a message that lies in the sender's memory (send s) to
/// receive d, run by run of the sender's buffer.
inline void deliver_from(const recv_desc& d, std::size_t off, const send_desc& s, std::size_t nb, const combiner& comb) {
  send_runs(s, off, nb, [&](const std::byte* p, std::size_t len) {
    deliver(d, off, p, len, comb);
    off += len;
  });
}

/// The contiguous destination of a plain-copy receive at byte off, and how many bytes fit
/// there (at most nb): where a transport may read straight into the user's memory.
inline std::byte* recv_target(const recv_desc& d, std::size_t off, std::size_t& nb) {
  return operand_at(d.dst, d.dst_spread, off, nb);
}

}  // namespace collx::detail
