#pragma once
// barrier: the dissemination algorithm. At step i every rank signals rank + 2^i and waits for
// rank - 2^i (mod n); after ceil(log2 n) steps every rank has heard, through some chain, from
// every other, so none leaves before all have arrived. Messages carry no data, only the call's
// signature, so a rank that is in a different call is still caught (errc::mismatch).
#include "common.hpp"

namespace collx {

template <class T>
void barrier(communicator<T>& comm) {
  const detail::call_queue::turn turn(detail::queue_of(comm, "barrier"), "barrier");
  auto call = detail::make_call<std::byte, no_op>(comm, "barrier", "dissemination", 0);
  const int n = comm.size(), r = comm.rank();
  schedule s;
  for (int d = 1; d < n; d *= 2) {
    s.next_step();
    s.send(algo::mod(r + d, n), {});
    s.recv(algo::mod(r - d, n), {});
  }
  detail::execute(comm, call, s, static_cast<const std::byte*>(nullptr), static_cast<std::byte*>(nullptr), no_op{});
}

}  // namespace collx
