#pragma once
// Sockets for transport::tcp and its rendezvous store: an owning descriptor, addresses
// (IPv4 and IPv6), the interface to listen on, and blocking-with-deadline helpers used during
// setup. The data path (tcp.hpp) drives non-blocking sockets itself.
#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <string>
#include <utility>

#include "../../core/error.hpp"

namespace collx::transport::net {

using clock = std::chrono::steady_clock;

/// An owned file descriptor: closed on every path.
class fd {
 public:
  fd() = default;
  explicit fd(int f) noexcept : f_(f) {}
  fd(fd&& o) noexcept : f_(std::exchange(o.f_, -1)) {}
  fd& operator=(fd&& o) noexcept {
    if (this != &o) {
      reset();
      f_ = std::exchange(o.f_, -1);
    }
    return *this;
  }
  fd(const fd&) = delete;
  fd& operator=(const fd&) = delete;
  ~fd() { reset(); }
  int get() const noexcept { return f_; }
  explicit operator bool() const noexcept { return f_ >= 0; }
  void reset() noexcept {
    if (f_ >= 0) ::close(f_);
    f_ = -1;
  }
  /// Gives the descriptor up (the caller closes it).
  int release() noexcept { return std::exchange(f_, -1); }

 private:
  int f_ = -1;
};

[[noreturn]] inline void sys_fail(const std::string& what) {
  throw error(errc::transport_error, what + ": " + std::strerror(errno));
}

/// A socket address, IPv4 or IPv6.
struct address {
  sockaddr_storage ss{};
  socklen_t len = 0;

  int family() const noexcept { return ss.ss_family; }
  int port() const noexcept {
    if (family() == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in&>(ss).sin_port);
    if (family() == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6&>(ss).sin6_port);
    return 0;
  }
  void set_port(int p) noexcept {
    if (family() == AF_INET) reinterpret_cast<sockaddr_in&>(ss).sin_port = htons(std::uint16_t(p));
    if (family() == AF_INET6) reinterpret_cast<sockaddr_in6&>(ss).sin6_port = htons(std::uint16_t(p));
  }
  /// "10.0.0.2:29500" or "[fe80::1]:29500"
  std::string str() const {
    char host[INET6_ADDRSTRLEN] = "?";
    if (family() == AF_INET) inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in&>(ss).sin_addr, host, sizeof host);
    if (family() == AF_INET6) inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6&>(ss).sin6_addr, host, sizeof host);
    std::string s;
    s.reserve(64);
    if (family() == AF_INET6) s += '[';
    s += host;
    if (family() == AF_INET6) s += ']';
    s += ':';
    s += std::to_string(port());
    return s;
  }
  /// 127.0.0.0/8 or ::1 (or ::ffff:127.x): this host only.
  bool is_loopback() const noexcept {
    if (family() == AF_INET) return (ntohl(reinterpret_cast<const sockaddr_in&>(ss).sin_addr.s_addr) >> 24) == 127;
    if (family() == AF_INET6) {
      const in6_addr& a = reinterpret_cast<const sockaddr_in6&>(ss).sin6_addr;
      return IN6_IS_ADDR_LOOPBACK(&a) || (IN6_IS_ADDR_V4MAPPED(&a) && a.s6_addr[12] == 127);
    }
    return false;
  }
  const sockaddr* sa() const noexcept { return reinterpret_cast<const sockaddr*>(&ss); }
  sockaddr* sa() noexcept { return reinterpret_cast<sockaddr*>(&ss); }
};

/// Resolves "host" (a name or a literal address) and a port. Throws invalid_argument when the
/// name does not resolve.
inline address resolve(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
  if (rc != 0 || res == nullptr)
    throw error(errc::invalid_argument, "tcp: cannot resolve \"" + host + "\": " + gai_strerror(rc));
  address a;
  // Prefer IPv4 when a name has both (what MASTER_ADDR=localhost users expect).
  const addrinfo* pick = res;
  for (const addrinfo* p = res; p != nullptr; p = p->ai_next)
    if (p->ai_family == AF_INET) {
      pick = p;
      break;
    }
  std::memcpy(&a.ss, pick->ai_addr, pick->ai_addrlen);
  a.len = socklen_t(pick->ai_addrlen);
  freeaddrinfo(res);
  return a;
}

/// Parses "host:port" or "[v6]:port" as published in the store.
inline address parse_host_port(const std::string& s) {
  const auto colon = s.rfind(':');
  if (colon == std::string::npos || colon + 1 >= s.size())
    throw error(errc::transport_error, "tcp: \"" + s + "\" is not host:port");
  std::string host = s.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  char* end = nullptr;
  const long port = std::strtol(s.c_str() + colon + 1, &end, 10);
  if (*end != 0 || port < 1 || port > 65535) throw error(errc::transport_error, "tcp: bad port in \"" + s + "\"");
  return resolve(host, int(port));
}

/// The first address of interface `ifname` (IPv4 preferred). Throws invalid_argument naming the
/// interfaces that exist when it has none.
inline address interface_address(const std::string& ifname) {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) sys_fail("tcp: getifaddrs");
  address found;
  std::string names;
  for (ifaddrs* p = list; p != nullptr; p = p->ifa_next) {
    if (p->ifa_addr == nullptr) continue;
    const int fam = p->ifa_addr->sa_family;
    if (fam != AF_INET && fam != AF_INET6) continue;
    if (names.find(std::string(" ") + p->ifa_name + ",") == std::string::npos) names += std::string(" ") + p->ifa_name + ",";
    if (ifname != p->ifa_name) continue;
    if (found.len == 0 || (fam == AF_INET && found.family() != AF_INET)) {
      found.len = fam == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
      std::memcpy(&found.ss, p->ifa_addr, found.len);
    }
  }
  freeifaddrs(list);
  if (found.len == 0) {
    if (!names.empty()) names.pop_back();
    throw error(errc::invalid_argument, "tcp: COLLX_SOCKET_IFNAME=" + ifname + ": no such interface with an address (have:" + names + ")");
  }
  found.set_port(0);
  return found;
}

/// The local address this host uses to reach `peer` (what the routing table picks).
inline address route_to(const address& peer) {
  fd s(::socket(peer.family(), SOCK_DGRAM | SOCK_CLOEXEC, 0));
  if (!s) sys_fail("tcp: socket");
  if (::connect(s.get(), peer.sa(), peer.len) != 0) sys_fail("tcp: no route to " + peer.str());
  address me;
  me.len = sizeof me.ss;
  if (getsockname(s.get(), me.sa(), &me.len) != 0) sys_fail("tcp: getsockname");
  me.set_port(0);
  return me;
}

inline void set_nonblocking(int f) {
  const int fl = fcntl(f, F_GETFL, 0);
  if (fl < 0 || fcntl(f, F_SETFL, fl | O_NONBLOCK) != 0) sys_fail("tcp: fcntl O_NONBLOCK");
}

inline void set_nodelay(int f) {
  int one = 1;
  setsockopt(f, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

/// A listening socket on `at` (port 0: any free port). Returns it and the address it got.
inline std::pair<fd, address> listen_on(address at, int backlog = 128) {
  fd s(::socket(at.family(), SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!s) sys_fail("tcp: socket");
  int one = 1;
  setsockopt(s.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (::bind(s.get(), at.sa(), at.len) != 0) sys_fail("tcp: cannot listen on " + at.str());
  if (::listen(s.get(), backlog) != 0) sys_fail("tcp: listen on " + at.str());
  address got;
  got.len = sizeof got.ss;
  if (getsockname(s.get(), got.sa(), &got.len) != 0) sys_fail("tcp: getsockname");
  set_nonblocking(s.get());
  return {std::move(s), got};
}

inline int ms_until(clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock::now()).count();
  return left <= 0 ? 0 : left > 100 ? 100 : int(left) + 1;
}

enum class io { ok, timeout, closed, failed };

/// poll's events that say a connection's peer has hung up (closed or reset: its process died,
/// or it closed the connection); asked for with POLLRDHUP alone, nothing is read.
inline constexpr short kHangUp = POLLRDHUP | POLLHUP | POLLERR;

/// Whether the peer of connected socket `f` has hung up, without reading anything there.
inline bool hung_up(int f) {
  pollfd p{f, POLLRDHUP, 0};
  return ::poll(&p, 1, 0) > 0 && (p.revents & kHangUp) != 0;
}

/// Connects to `to` before `deadline`, retrying while nothing listens there yet (the peer may
/// start later). Returns a non-blocking socket, or an empty fd on timeout; `last` says why.
/// `watch`: a connection to the same peer elsewhere (-1: none); once it hangs up, the peer is
/// gone and no try is made any more: an empty fd, `*gone` set.
inline fd connect_until(const address& to, clock::time_point deadline, std::string& last, int watch = -1, bool* gone = nullptr) {
  std::string before;  // why the tries so far failed
  for (;;) {
    if (watch >= 0 && hung_up(watch)) {
      if (gone != nullptr) *gone = true;
      last = before.empty() ? "its other connection closed" : before;
      return fd{};
    }
    fd s(::socket(to.family(), SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (!s) sys_fail("tcp: socket");
    int rc = ::connect(s.get(), to.sa(), to.len);
    bool cut = false;  // the deadline came while this try was under way
    if (rc != 0 && errno == EINPROGRESS) {
      pollfd p{s.get(), POLLOUT, 0};
      while (clock::now() < deadline) {
        const int k = ::poll(&p, 1, ms_until(deadline));
        if (k > 0 || (k < 0 && errno != EINTR)) break;
      }
      int err = 0;
      socklen_t el = sizeof err;
      if (p.revents == 0) err = ETIMEDOUT, cut = true;
      else getsockopt(s.get(), SOL_SOCKET, SO_ERROR, &err, &el);
      rc = err == 0 ? 0 : -1;
      errno = err;
    }
    if (rc == 0) {
      set_nodelay(s.get());
      return s;
    }
    // (Even on loopback a refused non-blocking connect says EINPROGRESS first: the try the
    // deadline cuts short says "timed out" where every try before it was refused, i.e. nothing
    // listened there all along. That reason is the one to report, as what the tries that
    // ended said: the last one may have been cut short for another reason.)
    if (cut && !before.empty()) {
      last = before + " (every try that ended before the deadline)";
      return fd{};
    }
    last = std::strerror(errno);
    before = last;
    if (clock::now() >= deadline) return fd{};
    ::usleep(10'000);  // refused: the peer is not listening yet
  }
}

/// Starts a non-blocking connect to `to` (TCP_NODELAY set): the socket, connected already
/// (`connected`) or connecting (poll it for POLLOUT, then read SO_ERROR), or an empty fd when
/// the connection was refused at once (nothing listens there: a peer's process that is gone).
inline fd connect_start(const address& to, bool& connected) {
  fd s(::socket(to.family(), SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!s) sys_fail("tcp: socket");
  const int rc = ::connect(s.get(), to.sa(), to.len);
  if (rc != 0 && errno != EINPROGRESS) return fd{};
  set_nodelay(s.get());
  connected = rc == 0;
  return s;
}

/// Writes all of `n` bytes to a non-blocking socket before `deadline`.
inline io write_all(int f, const void* p, std::size_t n, clock::time_point deadline) {
  const char* b = static_cast<const char*>(p);
  while (n > 0) {
    const ssize_t k = ::send(f, b, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (k > 0) {
      b += k;
      n -= std::size_t(k);
      continue;
    }
    if (k < 0 && errno == EINTR) continue;
    if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK) return errno == EPIPE || errno == ECONNRESET ? io::closed : io::failed;
    if (clock::now() >= deadline) return io::timeout;
    pollfd pf{f, POLLOUT, 0};
    ::poll(&pf, 1, ms_until(deadline));
  }
  return io::ok;
}

/// Reads exactly `n` bytes from a non-blocking socket before `deadline`.
inline io read_exact(int f, void* p, std::size_t n, clock::time_point deadline) {
  char* b = static_cast<char*>(p);
  while (n > 0) {
    const ssize_t k = ::recv(f, b, n, MSG_DONTWAIT);
    if (k > 0) {
      b += k;
      n -= std::size_t(k);
      continue;
    }
    if (k == 0) return io::closed;
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return errno == ECONNRESET ? io::closed : io::failed;
    if (clock::now() >= deadline) return io::timeout;
    pollfd pf{f, POLLIN, 0};
    ::poll(&pf, 1, ms_until(deadline));
  }
  return io::ok;
}

}  // namespace collx::transport::net
