#pragma once
// algo::compressed<Wire, Gather>: an all_reduce of float whose data travel in a wire format
// (ops/wire.hpp: bf16, half the bytes; mxfp8, about a quarter), summed in float at every receiver.
//
//   collx::all_reduce(comm, std::span{grads}, collx::ops::sum{}, collx::algo::compressed<collx::wire::bf16>{});
//
// How (collectives/compressed.hpp), per segment (pipelined: a side thread encodes the next
// segment and decodes the one before while this one is exchanged): every rank encodes its buffer, block q for
// rank q; a direct exchange (pairwise's all-to-all) hands rank r the N encoded contributions to
// its block; r adds them in float, in rank order, and encodes the sum once; the all-gather of
// Gather (ring by default) hands every rank every encoded block, which each rank decodes into its
// output, its own block too, so every rank ends with the same bits. Traffic: the ring's,
// 2(N-1)/N of the data per rank, times the format's size against float's (1/2 for bf16,
// 33/128 for mxfp8). Error: each contribution rounded once to the format, the sum rounded once
// more (docs/precision.md bounds it). bf16's result, one element at a time, does not depend on
// where the element sits; mxfp8's does (its scale is shared by 32 neighbours).
#include <array>
#include <cstddef>

#include "../core/concepts.hpp"
#include "../ops/wire.hpp"
#include "ring.hpp"

namespace collx::algo {

template <wire::WireFormat Wire, class Gather = ring>
struct compressed {
  using algorithm_policy_concept = algorithm_policy_tag;
  static constexpr std::array<char, 48> name_chars = policy_name("compressed(", Wire::name, ", ", Gather::name, ")");
  static constexpr const char* name = name_chars.data();
  static constexpr bool keeps_rank_order = true;  // (the receivers add in rank order)
  using wire_format = Wire;

  Gather gather{};
  /// Elements per segment. A call of several segments runs its codec on a side thread beside
  /// the exchanges (collectives/compressed.hpp); 4 MiB of float hides it behind a 1 Gbit/s link
  /// (docs/precision.md). The call's scratch is about 5 segments of the format's values.
  std::size_t segment = std::size_t(1) << 20;  // 4 MiB of float
};

template <class A>
inline constexpr bool is_compressed_v = false;
template <class W, class G>
inline constexpr bool is_compressed_v<compressed<W, G>> = true;

}  // namespace collx::algo
