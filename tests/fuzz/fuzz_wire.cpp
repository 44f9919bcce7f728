// libFuzzer target: random bytes as the frames a tcp rank reads from a peer (message header,
// hello, verdict, store reply, shrink hello and view, position query and answer). Every parser must reject or accept without reading out of
// bounds, and what it accepts must be safe to use: names terminated, sizes within the limits.
#include <collx/transport/tcp/wire.hpp>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace w = collx::transport::tcp_wire;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto* b = reinterpret_cast<const std::byte*>(data);
  if (size >= sizeof(w::msg_header)) {
    std::string why;
    if (auto h = w::parse_header(std::span<const std::byte, sizeof(w::msg_header)>(b, sizeof(w::msg_header)), why)) {
      // Accepted: the signature can be printed (bounded names) and the sizes obey the kind.
      const std::string d = h->sig.describe();
      if (d.empty()) std::abort();
      if (h->kind == w::msg_kind::abort && h->bytes > w::kMaxAbortReason) std::abort();
      if (h->kind == w::msg_kind::bye && h->bytes != 0) std::abort();
      if (h->kind == w::msg_kind::cts && h->bytes != 0) std::abort();
      collx::call_info me;
      try {
        me.check_match(1, h->sig, std::size_t(h->bytes), 64);
      } catch (const collx::error&) {
      }
    } else if (why.empty()) {
      std::abort();  // a refusal always says why
    }
  }
  if (size >= sizeof(w::hello)) {
    int peer = -2;
    const auto v = w::check_hello(std::span<const std::byte, sizeof(w::hello)>(b, sizeof(w::hello)), 0, 4, peer);
    if (v == w::verdict_code::admitted && (peer < 1 || peer > 3)) std::abort();
    if (v != w::verdict_code::admitted && peer != -1) std::abort();
  }
  if (size >= sizeof(w::shrink_hello)) {
    int peer = -2;
    const bool mac_ok = size % 2 == 0;  // (the MAC is checked by the caller: either way)
    const auto v = w::check_shrink_hello(std::span<const std::byte, sizeof(w::shrink_hello)>(b, sizeof(w::shrink_hello)), 2, 5, 1, 7,
                                         mac_ok, peer);
    if (v == w::verdict_code::admitted && !mac_ok) std::abort();
    if (v == w::verdict_code::admitted && (peer < 0 || peer > 4 || peer == 2)) std::abort();
    if (v != w::verdict_code::admitted && peer != -1) std::abort();
  }
  // A view frame of a 5-rank communicator: the size decides whether it can be one at all.
  if (size >= 1) {
    const int n = 1 + int(b[0]) % 8;
    std::vector<char> alive;
    std::string where, why;
    if (w::parse_shrink_view(std::span<const std::byte>(b, size), 1, 0, n, alive, where, why)) {
      if (alive.size() != std::size_t(n) || where.empty() || where.size() >= w::kShrinkWhere) std::abort();
      for (char f : alive)
        if (f != 0 && f != 1) std::abort();
    } else if (why.empty()) {
      std::abort();
    }
  }
  if (size >= sizeof(w::position_query)) {
    (void)w::check_query(std::span<const std::byte, sizeof(w::position_query)>(b, sizeof(w::position_query)), 1, 4, 9);
  }
  if (size >= sizeof(w::position_answer)) {
    if (auto a = w::parse_answer(std::span<const std::byte, sizeof(w::position_answer)>(b, sizeof(w::position_answer)), 4)) {
      if (a->waiting_for < -1 || a->waiting_for >= 4) std::abort();
      for (const char* f : {a->name, a->else_comm, a->else_call})
        for (int i = 0; i < 16; ++i)
          if (f[i] != 0 && (static_cast<unsigned char>(f[i]) < 32 || static_cast<unsigned char>(f[i]) > 126)) std::abort();
    }
  }
  if (size >= sizeof(w::verdict)) (void)w::parse_verdict(std::span<const std::byte, sizeof(w::verdict)>(b, sizeof(w::verdict)));
  if (size >= sizeof(w::store_rep_header)) {
    if (auto r = w::parse_store_reply(std::span<const std::byte, sizeof(w::store_rep_header)>(b, sizeof(w::store_rep_header))))
      if (r->value_len > w::kMaxValue) std::abort();
  }
  return 0;
}
