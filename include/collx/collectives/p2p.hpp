#pragma once
// send / recv: point to point, for pipelines. A send completes when the receiver has taken the
// data (rendezvous), so the buffer may be reused on return. The receiver must expect exactly
// the sender's element count and size (errc::mismatch otherwise). Point-to-point calls do not
// advance the collective sequence number: they are not collective.
#include "common.hpp"

namespace collx {

namespace detail {
template <class E, class T>
call_info p2p_call(communicator<T>& comm, std::size_t count, int peer, const char* what) {
  call_info c;
  set_name(c.sig.collective, "send/recv");
  set_name(c.sig.policy, "direct");
  c.sig.count = count;
  c.sig.elem_size = std::uint32_t(sizeof(E));
  c.rank = comm.rank();
  c.timeout = comm.opts().timeout;
  COLLX_REQUIRE(peer >= 0 && peer < comm.size() && peer != comm.rank(), c,
          std::string(what) + ": peer " + std::to_string(peer) + " is not another rank of [0, " +
              std::to_string(comm.size()) + ")");
  return c;
}
}  // namespace detail

template <class T, class E>
void send(communicator<T>& comm, std::span<const E> data, int peer) {
  const call_info call = detail::p2p_call<E>(comm, data.size(), peer, "send");
  schedule s;
  s.send(peer, {buf::in, 0, data.size()});
  detail::execute(comm, call, s, data.data(), static_cast<E*>(nullptr), no_op{});
}

template <class T, class E>
void send(communicator<T>& comm, std::span<E> data, int peer) {
  send(comm, std::span<const E>(data), peer);
}

template <class T, class E>
void recv(communicator<T>& comm, std::span<E> data, int peer) {
  const call_info call = detail::p2p_call<E>(comm, data.size(), peer, "recv");
  schedule s;
  s.recv(peer, {buf::out, 0, data.size()});
  detail::execute(comm, call, s, static_cast<const E*>(nullptr), data.data(), no_op{});
}

}  // namespace collx
