#pragma once
// The reducing collectives for the torch backend, three element types per translation unit
// (reduce_floating.cpp, reduce_narrow.cpp, reduce_integer.cpp): the backend dispatches a tensor's
// dtype and op here with raw pointers, so these files include collx only (not torch) and build
// in parallel. The data-moving collectives need no element type: backend.cpp runs them on bytes.
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <collx/collx.hpp>

namespace collx_torch {

using comm_t = collx::communicator<collx::transport::any>;

/// The reduction ops collx runs for torch: each torch ReduceOp is one collx op (AVG is
/// collx::ops::avg, which divides inside the call; PREMUL_SUM is collx::ops::premul_sum, which
/// scales this rank's input by `factor` inside the call); bool tensors reduce as bytes
/// (SUM/MAX = bor, PRODUCT/MIN = band).
enum class red : int { sum, prod, min, max, band, bor, bxor, avg, premul_sum };
const char* red_name(red r) noexcept;

/// How a float32 SUM or AVG all-reduce travels (the process group's `wire`, COLLX_WIRE): as float,
/// or compressed (collx::algo::compressed: bf16 or MXFP8 on the wire, summed in float).
enum class wire_format : int { none, bf16, mxfp8 };
/// COLLX_WIRE's format ("none", "bf16" or "mxfp8"; unset: none); anything else throws naming it.
wire_format parse_wire(const std::string& v, const char* from);

/// An op as the backend passes it: which, PREMUL_SUM's factor (this rank's), and the process
/// group's wire format.
struct op_spec {
  red r = red::sum;
  double factor = 1.0;
  wire_format wire = wire_format::none;
};

template <class E>
struct reducer {
  static void all_reduce(comm_t& c, E* buf, std::size_t n, op_spec o);
  /// out is written on root only (it may be null elsewhere).
  static void reduce(comm_t& c, const E* in, E* out, std::size_t n, op_spec o, int root);
  /// in holds size() blocks of n_out elements; out receives this rank's block, reduced.
  static void reduce_scatter(comm_t& c, const E* in, E* out, std::size_t n_out, op_spec o);
  /// Every buffer all-reduced in place as one fused call (collx::fused).
  static void all_reduce_many(comm_t& c, const std::vector<std::pair<E*, std::size_t>>& bufs, op_spec o);
};

extern template struct reducer<float>;
extern template struct reducer<double>;
extern template struct reducer<collx::half>;
extern template struct reducer<collx::bfloat16>;
extern template struct reducer<std::int8_t>;
extern template struct reducer<std::int16_t>;
extern template struct reducer<std::int32_t>;
extern template struct reducer<std::int64_t>;
extern template struct reducer<std::uint8_t>;

}  // namespace collx_torch
