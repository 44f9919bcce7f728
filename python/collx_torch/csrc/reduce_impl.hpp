#pragma once
// The definitions behind reduce.hpp; reduce_floating.cpp, reduce_narrow.cpp and
// reduce_integer.cpp instantiate them, three element types each.
#include <stdexcept>
#include <type_traits>

#include "reduce.hpp"

namespace collx_torch {

/// Calls f with the collx op for r, or throws for an op the element type has not (bitwise ops on
/// floating point: the backend refuses those before they get here, naming the tensor's dtype).
template <class E, class F>
void with_op(op_spec o, F&& f) {
  const red r = o.r;
  switch (r) {
    case red::sum: return f(collx::ops::sum{});
    case red::prod: return f(collx::ops::prod{});
    case red::min: return f(collx::ops::min{});
    case red::max: return f(collx::ops::max{});
    case red::avg: return f(collx::ops::avg{});
    default: break;
  }
  if constexpr (!std::is_integral_v<E>) {
    if (r == red::premul_sum) return f(collx::ops::premul_sum{o.factor});
  } else {
    switch (r) {
      case red::band: return f(collx::ops::band{});
      case red::bor: return f(collx::ops::bor{});
      case red::bxor: return f(collx::ops::bxor{});
      default: break;
    }
  }
  throw std::invalid_argument(std::string("collx: op ") + red_name(r) + " is not defined for this element type");
}

/// For float32 SUM and AVG under a wire format: calls f(op, policy) with the compressed policy
/// and returns true; false otherwise (the call runs as it is).
template <class E, class F>
bool with_wire(op_spec o, F&& f) {
  if constexpr (std::is_same_v<E, float>) {
    if (o.wire == wire_format::none || (o.r != red::sum && o.r != red::avg)) return false;
    auto format = [&](auto op) {
      if (o.wire == wire_format::bf16) f(op, collx::algo::compressed<collx::wire::bf16>{});
      else f(op, collx::algo::compressed<collx::wire::mxfp8>{});
    };
    if (o.r == red::sum) format(collx::ops::sum{});
    else format(collx::ops::avg{});
    return true;
  } else {
    return false;
  }
}

template <class E>
void reducer<E>::all_reduce(comm_t& c, E* buf, std::size_t n, op_spec o) {
  if (with_wire<E>(o, [&](auto op, auto pol) { collx::all_reduce(c, std::span<E>(buf, n), op, pol); })) return;
  with_op<E>(o, [&](auto op) { collx::all_reduce(c, std::span<E>(buf, n), op); });
}

template <class E>
void reducer<E>::reduce(comm_t& c, const E* in, E* out, std::size_t n, op_spec o, int root) {
  with_op<E>(o, [&](auto op) {
    collx::reduce(c, std::span<const E>(in, n), std::span<E>(out, out ? n : 0), op, root);
  });
}

template <class E>
void reducer<E>::reduce_scatter(comm_t& c, const E* in, E* out, std::size_t n_out, op_spec o) {
  with_op<E>(o, [&](auto op) {
    collx::reduce_scatter(c, std::span<const E>(in, n_out * std::size_t(c.size())), std::span<E>(out, n_out), op);
  });
}

template <class E>
void reducer<E>::all_reduce_many(comm_t& c, const std::vector<std::pair<E*, std::size_t>>& bufs, op_spec o) {
  if (with_wire<E>(o, [&](auto op, auto pol) {
        collx::fused<collx::transport::any> f(c);
        for (const auto& [p, n] : bufs) f.all_reduce(std::span<E>(p, n), op, pol);
        f.run();
      }))
    return;
  with_op<E>(o, [&](auto op) {
    collx::fused<collx::transport::any> f(c);
    for (const auto& [p, n] : bufs) f.all_reduce(std::span<E>(p, n), op);
    f.run();
  });
}

}  // namespace collx_torch
