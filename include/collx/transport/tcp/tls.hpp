#pragma once
// transport::tcp's optional encryption (tcp_config::tls, COLLX_TCP_TLS=1): every connection
// between two ranks, once admitted (tcp/auth.hpp), becomes a TLS 1.3 channel (OpenSSL's libssl).
// Both ends authenticate by an external pre-shared key derived from the job's secret and bound
// to the job and the pair of ranks, with an ephemeral key exchange (psk_dhe_ke: forward
// secrecy). No certificates: the job's secret is the credential, as it is for admission. The
// lower rank of a pair is the server. docs/security.md says what it costs.
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <chrono>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "../../core/error.hpp"
#include "auth.hpp"
#include "socket.hpp"

namespace collx::transport::tcp_detail {

/// One end of a TLS channel (null: the connection is plain). Owns its SSL.
class tls_link {
 public:
  tls_link() = default;
  explicit tls_link(SSL* s) noexcept : ssl_(s) {}
  tls_link(tls_link&& o) noexcept : ssl_(std::exchange(o.ssl_, nullptr)) {}
  tls_link& operator=(tls_link&& o) noexcept {
    if (this != &o) {
      reset();
      ssl_ = std::exchange(o.ssl_, nullptr);
    }
    return *this;
  }
  tls_link(const tls_link&) = delete;
  tls_link& operator=(const tls_link&) = delete;
  ~tls_link() { reset(); }
  void reset() noexcept {
    if (ssl_ != nullptr) SSL_free(ssl_);
    ssl_ = nullptr;
  }
  SSL* get() const noexcept { return ssl_; }
  explicit operator bool() const noexcept { return ssl_ != nullptr; }

 private:
  SSL* ssl_ = nullptr;
};

namespace tls {

/// OpenSSL's error queue as text (emptied).
inline std::string errors() {
  std::string s;
  while (const unsigned long e = ERR_get_error()) {
    char b[256];
    ERR_error_string_n(e, b, sizeof b);
    s += (s.empty() ? "" : "; ") + std::string(b);
  }
  return s.empty() ? "no detail from OpenSSL" : s;
}

/// The pre-shared key of a connection: 32 bytes, kept with its SSL (ex data) for the callbacks.
struct psk {
  unsigned char key[32];
};
/// Frees a psk kept as ex data when its SSL goes.
inline void free_psk(void*, void* p, CRYPTO_EX_DATA*, int, long, void*) {
  if (p == nullptr) return;
  OPENSSL_cleanse(static_cast<psk*>(p)->key, sizeof(psk::key));
  delete static_cast<psk*>(p);
}
inline int psk_index() {
  static const int i = SSL_get_ex_new_index(0, nullptr, nullptr, nullptr, free_psk);
  return i;
}
inline constexpr unsigned char kIdentity[] = "collx/1";
inline constexpr unsigned char kAes128GcmSha256[] = {0x13, 0x01};

inline SSL_SESSION* session_of(SSL* ssl) {
  const psk* k = static_cast<const psk*>(SSL_get_ex_data(ssl, psk_index()));
  const SSL_CIPHER* c = SSL_CIPHER_find(ssl, kAes128GcmSha256);
  if (k == nullptr || c == nullptr) return nullptr;
  SSL_SESSION* s = SSL_SESSION_new();
  if (s == nullptr) return nullptr;
  if (SSL_SESSION_set1_master_key(s, k->key, sizeof k->key) != 1 || SSL_SESSION_set_cipher(s, c) != 1 ||
      SSL_SESSION_set_protocol_version(s, TLS1_3_VERSION) != 1) {
    SSL_SESSION_free(s);
    return nullptr;
  }
  return s;
}
inline int use_session(SSL* ssl, const EVP_MD* md, const unsigned char** id, std::size_t* idlen, SSL_SESSION** sess) {
  SSL_SESSION* s = session_of(ssl);
  if (s == nullptr) return 0;
  if (md != nullptr && md != SSL_CIPHER_get_handshake_digest(SSL_SESSION_get0_cipher(s))) {
    SSL_SESSION_free(s);
    *sess = nullptr;
    return 1;  // (no PSK for this digest)
  }
  *id = kIdentity;
  *idlen = sizeof kIdentity - 1;
  *sess = s;
  return 1;
}
inline int find_session(SSL* ssl, const unsigned char* id, std::size_t idlen, SSL_SESSION** sess) {
  *sess = nullptr;
  if (idlen != sizeof kIdentity - 1 || std::memcmp(id, kIdentity, idlen) != 0) return 1;  // unknown: refused
  *sess = session_of(ssl);
  return *sess != nullptr ? 1 : 0;
}

/// The socket under a TLS channel, read and written as collx's own streams are: nonblocking, and
/// never SIGPIPE (OpenSSL's socket BIO writes with write(2), which raises it when the peer has
/// gone: a library must not change what a signal does to the process).
inline BIO_METHOD* socket_method() {
  static BIO_METHOD* const m = [] {
    BIO_METHOD* b = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK, "collx socket");
    if (b == nullptr) return b;
    BIO_meth_set_write_ex(b, [](BIO* bio, const char* data, std::size_t n, std::size_t* written) -> int {
      BIO_clear_retry_flags(bio);
      const ssize_t k = ::send(int(reinterpret_cast<std::intptr_t>(BIO_get_data(bio))), data, n, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (k >= 0) {
        *written = std::size_t(k);
        return 1;
      }
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) BIO_set_retry_write(bio);
      return 0;
    });
    BIO_meth_set_read_ex(b, [](BIO* bio, char* data, std::size_t n, std::size_t* got) -> int {
      BIO_clear_retry_flags(bio);
      const ssize_t k = ::recv(int(reinterpret_cast<std::intptr_t>(BIO_get_data(bio))), data, n, MSG_DONTWAIT);
      if (k > 0) {
        *got = std::size_t(k);
        return 1;
      }
      if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) BIO_set_retry_read(bio);
      if (k == 0) errno = 0;  // (the end of the stream: SSL_ERROR_SYSCALL with errno 0)
      return 0;
    });
    BIO_meth_set_ctrl(b, [](BIO*, int cmd, long, void*) -> long { return cmd == BIO_CTRL_FLUSH ? 1 : 0; });
    BIO_meth_set_create(b, [](BIO* bio) -> int {
      BIO_set_init(bio, 1);
      return 1;
    });
    return b;
  }();
  if (m == nullptr) throw error(errc::transport_error, "tcp: TLS: cannot make a BIO method: " + errors());
  return m;
}

/// The process's two contexts (client, server): TLS 1.3 only, external PSK, no tickets. Made
/// once, never freed (a communicator may outlive statics).
inline SSL_CTX* context(bool server) {
  static SSL_CTX* const made[2] = {[] {
                                     SSL_CTX* c = SSL_CTX_new(TLS_client_method());
                                     if (c != nullptr) SSL_CTX_set_psk_use_session_callback(c, use_session);
                                     return c;
                                   }(),
                                   [] {
                                     SSL_CTX* c = SSL_CTX_new(TLS_server_method());
                                     if (c != nullptr) SSL_CTX_set_psk_find_session_callback(c, find_session);
                                     return c;
                                   }()};
  static const bool set = [] {
    for (SSL_CTX* c : made) {
      if (c == nullptr) continue;
      SSL_CTX_set_min_proto_version(c, TLS1_3_VERSION);
      SSL_CTX_set_max_proto_version(c, TLS1_3_VERSION);
      SSL_CTX_set_ciphersuites(c, "TLS_AES_128_GCM_SHA256");
      SSL_CTX_set_num_tickets(c, 0);
      SSL_CTX_set_mode(c, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
      // A peer's connection ending without TLS's farewell reads as the stream's end: collx's
      // frames carry their lengths, so a cut stream is a lost peer (as without TLS), never data
      SSL_CTX_set_options(c, SSL_OP_NO_TICKET | SSL_OP_IGNORE_UNEXPECTED_EOF);
      // Read what the socket has, not one record's header and then its body: two system calls
      // a 16 KiB record otherwise (what is read ahead is looked for before a poll: tcp/stream.hpp)
      SSL_CTX_set_read_ahead(c, 1);
      SSL_CTX_set_default_read_buffer_len(c, std::size_t(256) << 10);
    }
    return true;
  }();
  (void)set;
  SSL_CTX* c = made[server ? 1 : 0];
  if (c == nullptr) throw error(errc::transport_error, "tcp: TLS: cannot make an OpenSSL context: " + errors());
  return c;
}

}  // namespace tls

/// Makes each connection in `socks` (peer q's at [q], none at this rank's) a TLS 1.3 channel,
/// all at once in one poll loop: `links[q]` gets its end. The key of the pair (this rank,
/// q) is MAC(secret, "tls", context_of(q)): `context_of` names what both ends agree the
/// connection is for. `who(q)` names peer q in errors. Throws at `deadline`, or when a
/// handshake fails (another secret: the peer's proof does not hold).
template <class Context, class Who>
void secure_all(const std::vector<int>& socks, std::vector<tls_link>& links, int rank, const std::string& secret, Context context_of,
                Who who, net::clock::time_point deadline) {
  links.clear();
  links.resize(socks.size());
  struct pending {
    int q;
    bool server;
    short want = POLLIN | POLLOUT;
  };
  std::vector<pending> todo;
  for (std::size_t q = 0; q < socks.size(); ++q) {
    if (socks[q] < 0 || int(q) == rank) continue;
    const bool server = rank < int(q);
    SSL* s = SSL_new(tls::context(server));
    if (s == nullptr) throw error(errc::transport_error, "tcp: TLS: SSL_new failed: " + tls::errors());
    links[q] = tls_link(s);
    tcp_auth::mac m = tcp_auth::compute(secret, {"collx/tls-psk/1", context_of(int(q))});
    auto* k = new tls::psk;
    std::memcpy(k->key, m.data(), sizeof k->key);
    OPENSSL_cleanse(m.data(), m.size());
    if (SSL_set_ex_data(s, tls::psk_index(), k) != 1) {
      delete k;
      throw error(errc::transport_error, "tcp: TLS: cannot attach the key: " + tls::errors());
    }
    net::set_nonblocking(socks[q]);
    BIO* bio = BIO_new(tls::socket_method());
    if (bio == nullptr) throw error(errc::transport_error, "tcp: TLS: BIO_new failed: " + tls::errors());
    BIO_set_data(bio, reinterpret_cast<void*>(std::intptr_t(socks[q])));
    SSL_set_bio(s, bio, bio);
    if (server) SSL_set_accept_state(s);
    else SSL_set_connect_state(s);
    todo.push_back({int(q), server});
  }
  std::vector<pollfd> pf;
  while (!todo.empty()) {
    for (pending& t : todo) {
      SSL* s = links[std::size_t(t.q)].get();
      const int r = SSL_do_handshake(s);
      if (r == 1) {
        t.want = 0;
        continue;
      }
      const int e = SSL_get_error(s, r);
      if (e == SSL_ERROR_WANT_READ) t.want = POLLIN;
      else if (e == SSL_ERROR_WANT_WRITE) t.want = POLLOUT;
      else
        throw error(errc::invalid_argument, "tcp: TLS handshake with " + who(t.q) + " failed (" + tls::errors() +
                                                "): does it hold the same secret, with TLS on as here (COLLX_TCP_TLS)?");
    }
    std::erase_if(todo, [](const pending& t) { return t.want == 0; });
    if (todo.empty()) break;
    if (net::clock::now() >= deadline) {
      std::string names;
      for (const pending& t : todo) names += (names.empty() ? "" : ", ") + who(t.q);
      throw error(errc::timeout, "tcp: TLS handshake timed out with " + names + " (is TLS on there too: COLLX_TCP_TLS?)");
    }
    pf.clear();
    for (const pending& t : todo) pf.push_back({socks[std::size_t(t.q)], t.want, 0});
    ::poll(pf.data(), pf.size(), std::clamp(net::ms_until(deadline), 1, 100));
  }
}

}  // namespace collx::transport::tcp_detail
