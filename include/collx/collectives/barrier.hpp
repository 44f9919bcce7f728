#pragma once
// barrier: the dissemination algorithm. At step i every rank signals rank + 2^i and waits for
// rank - 2^i (mod n); after ceil(log2 n) steps every rank has heard, through some chain, from
// every other, so none leaves before all have arrived. Messages carry no data, only the call's
// signature, so a rank that is in a different call is still caught (errc::mismatch).
#include "gather_scatter.hpp"

namespace collx {

template <class T, class Algo = algo::automatic>
void barrier(communicator<T>& comm, Algo = {}) {
  static_assert(detail::check_direct_policy<Algo>());
  const detail::call_queue::turn turn(detail::queue_of(comm, "barrier"), "barrier");
  auto call = detail::make_call<std::byte, no_op>(comm, "barrier", "dissemination", 0);
  const int n = comm.size(), r = comm.rank();
  const auto s = detail::cached<3>(comm, algo::automatic{}, detail::direct_shape{r, n, 0, 0}, [&] {
    schedule b;
    for (int d = 1; d < n; d *= 2) {
      b.next_step();
      b.send(algo::mod(r + d, n), {});
      b.recv(algo::mod(r - d, n), {});
    }
    return b;
  });
  detail::execute(comm, call, *s, static_cast<const std::byte*>(nullptr), static_cast<std::byte*>(nullptr), no_op{});
}
}  // namespace collx
