// libFuzzer target: random bytes as a stream of store requests, as the rendezvous store's
// server receives them from one client, delivered in pieces. The server logic must answer,
// wait or drop the client, never crash, and never buffer more than one maximal request.
#include <collx/transport/tcp/store.hpp>

#include <cstdlib>

namespace w = collx::transport::tcp_wire;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 2) return 0;
  // The first byte picks whether the store has a token and how the stream is cut.
  const bool with_token = data[0] & 1;
  const std::size_t piece = 1 + data[1] % 97;
  collx::transport::store_core core(with_token ? "secret" : "");
  collx::transport::store_core::session s;
  const char* p = reinterpret_cast<const char*>(data + 2);
  std::size_t left = size - 2;
  while (left > 0) {
    const std::size_t k = std::min(piece, left);
    s.in.append(p, k);
    p += k;
    left -= k;
    bool dropped = false;
    for (const auto& r : core.feed(s)) {
      if (r.drop && r.why.empty()) std::abort();  // a dropped client is logged with a reason
      dropped = dropped || r.drop;
    }
    if (dropped) return 0;
    if (s.in.size() > sizeof(w::store_req_header) + w::kMaxKey + w::kMaxValue + piece) std::abort();
  }
  return 0;
}
