#pragma once
// send / recv / sendrecv: point to point, for pipelines.
//
// The rule, the same on every transport and at every size: a send returns once its receiver has
// called the matching recv (synchronous, as MPI_Ssend; NCCL's send blocks the same way). So the
// buffer may be reused on return, and two ranks that send to each other at once wait for each
// other, whatever the size: each gets errc::timeout at its deadline, naming the other, instead
// of a program that works for small messages and hangs for large ones. An exchange between two
// ranks is one sendrecv (both directions in one step), or a send on one side and a recv first
// on the other.
//
// The receiver must expect exactly the sender's byte count and element size (errc::mismatch
// otherwise). Point-to-point calls do not advance the collective sequence number: they are not
// collective. Zero elements still make a (empty) message, so the rule holds for them too.
#include "common.hpp"

namespace collx {

namespace detail {
template <class E, class T>
call_info p2p_call(communicator<T>& comm) {
  call_info c;
  set_name(c.sig.collective, "send/recv");
  set_name(c.sig.policy, "direct");
  c.sig.count = 0;  // the receiver checks the byte count of each message instead (a sendrecv's two may differ)
  c.sig.elem_size = std::uint32_t(sizeof(E));
  c.sig.comm = comm.identity().hash;
  c.comm = &comm.identity();
  c.rank = comm.rank();
  c.timeout = comm.opts().timeout;
  c.call_timeout = comm.opts().call_timeout;
  c.synchronous = true;
  open_record(comm, c);
  return c;
}

template <class T>
void check_peer(communicator<T>& comm, const call_info& c, int peer, const char* what) {
  COLLX_REQUIRE(peer >= 0 && peer < comm.size() && peer != comm.rank(), comm, c,
                std::string(what) + ": peer " + std::to_string(peer) + " is not another rank of [0, " +
                    std::to_string(comm.size()) + ")");
}
}  // namespace detail

/// Sends `data` to rank `peer`; returns once `peer` has called the matching recv.
template <class T, class E>
void send(communicator<T>& comm, std::span<const E> data, int peer) {
  const detail::call_queue::turn turn(detail::queue_of(comm, "send/recv"), "send/recv");
  const call_info call = detail::p2p_call<E>(comm);
  detail::check_peer(comm, call, peer, "send");
  schedule s;
  s.send(peer, {buf::in, 0, data.size()});
  detail::execute(comm, call, s, data.data(), static_cast<E*>(nullptr), no_op{});
}

template <class T, class E>
void send(communicator<T>& comm, std::span<E> data, int peer) {
  send(comm, std::span<const E>(data), peer);
}

/// Receives `data.size()` elements from rank `peer`.
template <class T, class E>
void recv(communicator<T>& comm, std::span<E> data, int peer) {
  const detail::call_queue::turn turn(detail::queue_of(comm, "send/recv"), "send/recv");
  const call_info call = detail::p2p_call<E>(comm);
  detail::check_peer(comm, call, peer, "recv");
  schedule s;
  s.recv(peer, {buf::out, 0, data.size()});
  detail::execute(comm, call, s, static_cast<const E*>(nullptr), data.data(), no_op{});
}

/// Receives `data.size()` elements from whichever rank of `from` (every other rank when it is
/// empty) has a message for this rank first, and returns that rank: MPI_ANY_SOURCE, torch's
/// recv without a source. The message is an ordinary send, under the rule above; when several
/// are there, the first rank in `from` wins. It waits up to the communicator's timeout; a
/// rank that failed ends the wait (errc::peer_lost), ranks that left only once all of `from` have.
template <class T, class E>
int recv_any(communicator<T>& comm, std::span<E> data, std::span<const int> from = {}) {
  static_assert(requires(T& t, std::span<const int> p, const call_info& c) { t.probe(p, c); },
                "collx: recv_any needs a transport that can receive from any source (a probe member: inproc, shm, tcp, any)");
  const detail::call_queue::turn turn(detail::queue_of(comm, "send/recv"), "send/recv");
  const call_info call = detail::p2p_call<E>(comm);
  std::vector<int> peers(from.begin(), from.end());
  if (peers.empty())
    for (int q = 0; q < comm.size(); ++q)
      if (q != comm.rank()) peers.push_back(q);
  COLLX_REQUIRE(!peers.empty(), comm, call, "recv_any: there is no other rank to receive from");
  for (int p : peers) detail::check_peer(comm, call, p, "recv_any");
  int src = -1;
  try {
    src = comm.transport().probe(std::span<const int>(peers), call);
  } catch (const std::exception& e) {
    comm.transport().abort(e.what());  // as a failed step does (collectives/executor.hpp)
    throw;
  }
  schedule s;
  s.recv(src, {buf::out, 0, data.size()});
  detail::execute(comm, call, s, static_cast<const E*>(nullptr), data.data(), no_op{});
  return src;
}

/// Sends `send` to rank `dst` and receives into `recv` from rank `src` in one step (both at
/// once, so two ranks may sendrecv with each other, or a ring of ranks pass data along, without
/// waiting for one another). `dst` and `src` may be the same rank; the buffers must not overlap.
template <class T, class E>
void sendrecv(communicator<T>& comm, std::span<const std::type_identity_t<E>> send, int dst, std::span<E> recv, int src) {
  const detail::call_queue::turn turn(detail::queue_of(comm, "send/recv"), "send/recv");
  const call_info call = detail::p2p_call<E>(comm);
  detail::check_peer(comm, call, dst, "sendrecv");
  detail::check_peer(comm, call, src, "sendrecv");
  COLLX_REQUIRE(!detail::partially_overlap(send, recv) && !(send.data() == recv.data() && !recv.empty()), comm, call,
                "sendrecv: the buffer sent and the buffer received into overlap");
  schedule s;
  s.send(dst, {buf::in, 0, send.size()});
  s.recv(src, {buf::out, 0, recv.size()});
  detail::execute(comm, call, s, send.data(), recv.data(), no_op{});
}

}  // namespace collx
