#pragma once
// A communicator's options and the deadline every wait of collx has by default. On the ground
// floor: a transport's own configuration (shm's attach deadline, tcp's rendezvous deadline)
// defaults to the same deadline as the communicator that will own it.
#include <chrono>
#include <cstdint>

#include "settings.hpp"

namespace collx {

namespace detail {
/// options::timeout's default: COLLX_TIMEOUT_S (seconds, may be fractional) or 300 s.
inline std::chrono::nanoseconds default_timeout() {
  return std::chrono::nanoseconds(static_cast<std::int64_t>(env_seconds("COLLX_TIMEOUT_S", 300) * 1e9));
}
/// options::call_timeout's default: COLLX_CALL_TIMEOUT_S, or none (0).
inline std::chrono::nanoseconds default_call_timeout() {
  return std::chrono::nanoseconds(static_cast<std::int64_t>(env_seconds("COLLX_CALL_TIMEOUT_S", 0) * 1e9));
}
/// options::deterministic's default: COLLX_DETERMINISTIC (0 or 1), or 0.
inline bool default_deterministic() { return env_int("COLLX_DETERMINISTIC", 0ll, 1ll, 0ll) == 1; }
}  // namespace detail

struct options {
  /// The longest any single wait may take before the call fails with errc::timeout: measured
  /// anew after every move of data, so a peer that sends a byte now and then keeps it alive.
  std::chrono::nanoseconds timeout = detail::default_timeout();
  /// The longest a whole call may wait, from its first wait on, however its data trickles in
  /// (errc::timeout too); 0: no such bound. A peer cannot keep a call open by sending a byte
  /// just inside each timeout (docs/security.md).
  std::chrono::nanoseconds call_timeout = detail::default_call_timeout();
  /// Reductions that can be reproduced bit for bit (algo/deterministic.hpp): every all_reduce,
  /// reduce_scatter and reduce of floating-point elements (or a user's op) under any policy runs
  /// as algo::deterministic, that policy doing its all-gather where it has one. The same on every
  /// rank (a rank that differs fails the call as a mismatch). Default COLLX_DETERMINISTIC.
  bool deterministic = detail::default_deterministic();
};

}  // namespace collx
