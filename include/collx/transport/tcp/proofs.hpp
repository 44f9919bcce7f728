#pragma once
// The MACs of the two messages that reach a rank's listener outside a rendezvous (tcp/auth.hpp
// keys them with the job's secret): a timeout's position query (tcp/desync.hpp) and a shrink's
// hello (tcp/shrink.hpp). Each covers the message's fields up to the MAC (its nonce among
// them), the communicator's name and the rank it is sent to.
#include <sys/socket.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
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

/// What a connection accepted on a rank's listener opened with, looked at without reading it:
/// a shrink's hello or a position query whose MAC holds (for this communicator, this run and
/// this rank), one that carries either magic but no proof (`forged`), anything else (`other`:
/// a rendezvous hello, or a stranger's bytes), too few bytes yet (`pending`), or the end.
enum class opening { pending, shrink, query, forged, other, closed };
struct opened {
  opening what;
  long got;  // bytes there (peeked)
};
/// `comm`: the communicator's proven name (job#session); `job`: the hash a query names.
inline opened peek_opening(int f, const std::string& secret, const std::string& comm, int rank, int size, std::uint64_t job) {
  std::byte raw[sizeof(tcp_wire::shrink_hello)];
  static_assert(sizeof raw >= sizeof(tcp_wire::position_query));
  const long got = long(::recv(f, raw, sizeof raw, MSG_PEEK | MSG_DONTWAIT));
  if (got == 0 || (got < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) return {opening::closed, 0};
  if (got < 4) return {opening::pending, got < 0 ? 0 : got};
  std::uint32_t magic = 0;
  std::memcpy(&magic, raw, sizeof magic);
  if (magic == tcp_wire::kShrinkHelloMagic) {
    tcp_wire::shrink_hello h;
    if (got < long(sizeof h)) return {opening::pending, got};
    std::memcpy(static_cast<void*>(&h), raw, sizeof h);
    const bool ok = h.version == tcp_wire::kVersion && tcp_auth::same({h.mac, tcp_wire::kMac}, shrink_mac(secret, comm, h, rank));
    return {ok ? opening::shrink : opening::forged, got};
  }
  if (magic != tcp_wire::kQueryMagic) return {opening::other, got};
  tcp_wire::position_query q;
  if (got < long(sizeof q)) return {opening::pending, got};
  std::memcpy(static_cast<void*>(&q), raw, sizeof q);
  const bool ok = tcp_wire::check_query(std::span<const std::byte, sizeof q>(raw, sizeof q), rank, size, job) &&
                  tcp_auth::same({q.mac, tcp_wire::kMac}, query_mac(secret, comm, q, rank));
  return {ok ? opening::query : opening::forged, got};
}

}  // namespace collx::transport::tcp_detail
