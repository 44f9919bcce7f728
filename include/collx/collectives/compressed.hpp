#pragma once
// algo::compressed's all_reduce (algo/compressed.hpp): float data on the wire in a compressed
// format, summed in float at every receiver. Built from two collectives' exchanges, run under
// the all_reduce's own call: pairwise's all-to-all of the encoded blocks, then Gather's
// all-gather of the encoded sums. (One rank alone rounds through the format as well: a result
// does not change its kind with the rank count.)
#include <algorithm>
#include <cstddef>
#include <vector>

#include "all_gather.hpp"
#include "all_to_all.hpp"
#include "../algo/compressed.hpp"
#include "../algo/pairwise.hpp"

namespace collx::detail {

template <class T, class Op, class W, class G>
void compressed_all_reduce(communicator<T>& comm, const call_info& call, const float* in, float* out, std::size_t count,
                           const algo::compressed<W, G>& a) {
  static_assert(std::is_same_v<Op, ops::sum> || std::is_same_v<Op, ops::avg>,
                "collx: algo::compressed sums (ops::sum, ops::avg): its receivers add what arrives in float");
  using U = typename W::unit;
  const std::size_t n = std::size_t(comm.size());
  const std::size_t r = std::size_t(comm.rank());
  // Each segment cut into n blocks of B elements, B a multiple of the format's group (a scale's
  // 32 values stay in one block); the last blocks may be shorter, or empty.
  auto round_up = [](std::size_t x, std::size_t m) { return (x + m - 1) / m * m; };
  const std::size_t seg = std::max(a.segment, n * W::group);
  const std::size_t most = std::min(seg, count);
  const std::size_t bmax = round_up((most + n - 1) / n, W::group), wmax = W::units(bmax);
  // (the communicator's wire buffer, reused across calls)
  const std::size_t units = n * wmax, lines = (units * sizeof(U) + 63) / 64 * 64;
  std::byte* mem = comm.wire_buffer(3 * lines + bmax * sizeof(float));
  U* const sent = reinterpret_cast<U*>(mem);
  U* const got = reinterpret_cast<U*>(mem + lines);
  U* const all = reinterpret_cast<U*>(mem + 2 * lines);
  float* const acc = reinterpret_cast<float*>(mem + 3 * lines);
  for (std::size_t off = 0; off < count; off += seg) {
    const std::size_t len = std::min(seg, count - off);
    const std::size_t b = round_up((len + n - 1) / n, W::group), wb = W::units(b);
    auto lo = [&](std::size_t q) { return std::min(q * b, len); };
    auto hi = [&](std::size_t q) { return std::min(q * b + b, len); };
    for (std::size_t q = 0; q < n; ++q) {  // (a short block's tail zeroed: it travels, and is not read)
      W::encode(in + off + lo(q), hi(q) - lo(q), sent + q * wb);
      std::fill(sent + q * wb + W::units(hi(q) - lo(q)), sent + (q + 1) * wb, U(0));
    }
    // the direct exchange: rank q's block from every rank, in rank order
    all_to_all_uniform(comm, call, static_cast<const U*>(sent), got, wb, algo::pairwise{});
    const std::size_t m = hi(r) - lo(r);
    std::fill(acc, acc + m, 0.0f);
    for (std::size_t q = 0; q < n; ++q) W::add(got + q * wb, m, acc);
    if constexpr (has_finalize_v<Op, float>)
      for (std::size_t i = 0; i < m; ++i) acc[i] = Op::finalize(acc[i], int(n));
    // the sum encoded once, in place in the all-gather's buffer, and gathered
    W::encode(acc, m, all + r * wb);
    std::fill(all + r * wb + W::units(m), all + (r + 1) * wb, U(0));
    all_gather_blocks(comm, call, static_cast<const U*>(all + r * wb), all, partition(n * wb, int(n)), true, a.gather);
    for (std::size_t q = 0; q < n; ++q) W::decode(all + q * wb, hi(q) - lo(q), out + off + lo(q));
  }
}

}  // namespace collx::detail
