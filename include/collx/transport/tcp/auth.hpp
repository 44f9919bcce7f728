#pragma once
// Admission without sending the secret: both ends of a new connection prove that they hold the
// job's secret by a challenge-response over fresh nonces from both sides, and the secret itself
// never crosses the wire (docs/security.md).
//
//   connector -> acceptor   a hello that names what the connection is for and carries the
//                           connector's nonce Nc (tcp_wire::hello, the store's auth_begin)
//   acceptor  -> connector  the acceptor's nonce Na and MAC(K, "accept", context, hello, Na)
//   connector -> acceptor   MAC(K, "connect", context, hello, Na), once it has checked the first
//   acceptor  -> connector  the verdict
//
// MAC is HMAC-SHA-256 (OpenSSL's libcrypto), its inputs length-prefixed so that no two lists of
// parts read alike. The context binds the proofs to the job (its name), to both ranks and to the
// direction (the labels differ), and each proof covers both nonces: a captured exchange replayed
// meets a new Na, and the acceptor's proof is useless as the connector's. A job without a secret
// runs the same exchange with an empty key: nothing is then proven (tcp/secret.hpp says when a job
// has none, and says so).
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/params.h>
#include <sys/random.h>

#include <array>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <span>
#include <string>
#include <string_view>

#include "../../core/error.hpp"

namespace collx::transport::tcp_auth {

inline constexpr std::size_t kNonce = 32, kMac = 32;
using nonce = std::array<std::byte, kNonce>;
using mac = std::array<std::byte, kMac>;

/// `n` bytes from the kernel's random source (getrandom: blocks only before the pool is
/// first seeded, at boot).
inline void random_bytes(void* out, std::size_t n) {
  auto* p = static_cast<unsigned char*>(out);
  std::size_t got = 0;
  while (got < n) {
    const ssize_t k = ::getrandom(p + got, n - got, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) throw error(errc::transport_error, std::string("tcp: getrandom failed: ") + std::strerror(errno));
    got += std::size_t(k);
  }
}

inline nonce fresh_nonce() {
  nonce n;
  random_bytes(n.data(), n.size());
  return n;
}

/// A part of a MAC's input: any bytes.
struct part {
  const void* p;
  std::size_t n;
  part(std::string_view s) : p(s.data()), n(s.size()) {}
  part(const char* s) : part(std::string_view(s)) {}
  part(const std::string& s) : part(std::string_view(s)) {}
  template <class T, std::size_t N>
  part(const std::array<T, N>& a) : p(a.data()), n(sizeof(T) * N) {}
  part(std::span<const std::byte> s) : p(s.data()), n(s.size()) {}
  static part of(const void* p, std::size_t n) { return part(std::span<const std::byte>(static_cast<const std::byte*>(p), n)); }
};

/// HMAC-SHA-256 (RFC 2104) keyed with `key` over the bytes `parts` hold one after another.
inline mac hmac_sha256(std::string_view key, std::initializer_list<part> parts) {
  EVP_MAC* m = EVP_MAC_fetch(nullptr, "HMAC", nullptr);
  EVP_MAC_CTX* c = m != nullptr ? EVP_MAC_CTX_new(m) : nullptr;
  char digest[] = "SHA256";
  const OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string("digest", digest, 0), OSSL_PARAM_construct_end()};
  static const unsigned char empty = 0;
  mac out{};
  std::size_t len = 0;
  bool ok = c != nullptr && EVP_MAC_init(c, key.empty() ? &empty : reinterpret_cast<const unsigned char*>(key.data()), key.size(), params) == 1;
  for (const part& x : parts) ok = ok && (x.n == 0 || EVP_MAC_update(c, static_cast<const unsigned char*>(x.p), x.n) == 1);
  ok = ok && EVP_MAC_final(c, reinterpret_cast<unsigned char*>(out.data()), &len, out.size()) == 1 && len == out.size();
  EVP_MAC_CTX_free(c);
  EVP_MAC_free(m);
  if (!ok) throw error(errc::transport_error, "tcp: HMAC-SHA-256 failed in OpenSSL's libcrypto");
  return out;
}

/// A MAC keyed with `secret` over a list of parts: HMAC-SHA-256 over each part preceded by its
/// length (8 bytes, little-endian), so that no two lists of parts read alike.
inline mac compute(std::string_view secret, std::initializer_list<part> parts) {
  std::string framed;
  for (const part& x : parts) {
    std::uint64_t n = x.n;
    for (int i = 0; i < 8; ++i, n >>= 8) framed += char(n & 0xff);
    framed.append(static_cast<const char*>(x.p), x.n);
  }
  return hmac_sha256(secret, {std::string_view(framed)});
}

/// Constant-time comparison (CRYPTO_memcmp): a stranger learns nothing from how long it takes.
inline bool same(std::span<const std::byte> a, std::span<const std::byte> b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

/// The two proofs of one exchange: `hello` is the connector's first message as sent (its nonce
/// inside), `context` what both ends know the connection is for (the job, the ranks).
inline mac accept_proof(std::string_view secret, std::string_view context, std::span<const std::byte> hello, const nonce& na) {
  return compute(secret, {"collx/accept/1", context, hello, na});
}
inline mac connect_proof(std::string_view secret, std::string_view context, std::span<const std::byte> hello, const nonce& na) {
  return compute(secret, {"collx/connect/1", context, hello, na});
}

/// A short public name of a secret (the first 16 hex digits of a MAC keyed with it): lets a
/// rank check that a secret it found is the one its job uses, without revealing it.
inline std::string fingerprint(std::string_view secret) {
  const mac m = compute(secret, {"collx/fingerprint/1"});
  static const char* hex = "0123456789abcdef";
  std::string s;
  for (std::size_t i = 0; i < 8; ++i) {
    const auto b = static_cast<unsigned char>(m[i]);
    s += hex[b >> 4];
    s += hex[b & 15];
  }
  return s;
}

}  // namespace collx::transport::tcp_auth
