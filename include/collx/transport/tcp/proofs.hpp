#pragma once
// The MACs of the two messages that reach a rank's listener outside a rendezvous (tcp/auth.hpp
// keys them with the job's secret): a timeout's position query (tcp/desync.hpp) and a shrink's
// hello (tcp/shrink.hpp). Each covers the message's fields up to the MAC (its nonce among
// them), the communicator's name and the rank it is sent to.
#include <cstddef>
#include <string>

#include "auth.hpp"
#include "wire.hpp"

namespace collx::transport::tcp_detail {

inline tcp_auth::mac query_mac(const std::string& secret, const std::string& comm, const tcp_wire::position_query& q, int to) {
  return tcp_auth::compute(secret, {"collx/query/1", comm, tcp_auth::part::of(&q, offsetof(tcp_wire::position_query, mac)), std::to_string(to)});
}

inline tcp_auth::mac shrink_mac(const std::string& secret, const std::string& comm, const tcp_wire::shrink_hello& h, int to) {
  return tcp_auth::compute(secret, {"collx/shrink/1", comm, tcp_auth::part::of(&h, offsetof(tcp_wire::shrink_hello, mac)), std::to_string(to)});
}

/// The answer to a shrink hello proves its sender too: a MAC over the whole hello (the
/// connector's fresh nonce in it), the answering rank and its verdict. Whoever holds a dead
/// rank's address without the secret cannot answer in its place.
inline tcp_auth::mac shrink_answer_mac(const std::string& secret, const std::string& comm, const tcp_wire::shrink_hello& h, int from,
                                       std::uint32_t code) {
  return tcp_auth::compute(secret, {"collx/shrink-answer/1", comm, tcp_auth::part::of(&h, sizeof h), std::to_string(from), std::to_string(code)});
}

}  // namespace collx::transport::tcp_detail
