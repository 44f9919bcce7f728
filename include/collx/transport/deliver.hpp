#pragma once
// The delivery of received bytes, shared by every host transport: a piece of a message, wherever
// it arrived (the sender's own memory over threads or single copy, a shared-memory slot, a
// socket's bounce buffer), is either copied into its destination or reduced with the local
// operand, in the order the schedule asks for (schedule.hpp, combine). Transports call this and
// nothing else to put received data in place, so the three cases are written once.
#include <cstddef>
#include <cstring>

#include "../concepts.hpp"

namespace collx::detail {

/// Delivers `nb` received bytes at `src` to bytes [off, off + nb) of receive `d`. For a
/// reduction `nb` is a whole number of elements (comb.elem_size each).
inline void deliver(const recv_desc& d, std::size_t off, const std::byte* src, std::size_t nb, const combiner& comb) {
  if (nb == 0) return;
  switch (d.how) {
    case combine::copy: std::memcpy(d.dst + off, src, nb); return;
    case combine::received_left: comb(d.dst + off, src, d.with + off, nb / comb.elem_size); return;
    case combine::received_right: comb(d.dst + off, d.with + off, src, nb / comb.elem_size); return;
  }
}

}  // namespace collx::detail
