#pragma once
// transport::tcp's configuration: where ranks meet, which interface they listen on, the job's
// secret, and the sockets' buffer sizes.
#include <chrono>
#include <memory>
#include <string>

#include "../../core/options.hpp"
#include "../../core/settings.hpp"

namespace collx::transport {

class store;  // tcp/store.hpp

struct tcp_config {
  /// How long rendezvous (store, addresses, connections) may take in all.
  std::chrono::nanoseconds rendezvous_timeout = detail::default_timeout();
  /// The store: a directory every rank sees (file store), else the TCP store at master_addr:master_port.
  std::string store_path = detail::env_string("COLLX_STORE_PATH");
  std::string master_addr;
  int master_port = 0;
  /// A store the caller already has (a framework's: torch's c10d store), used instead of the two
  /// above; master_addr, when given too, only picks the interface that routes to it.
  std::shared_ptr<store> external_store;
  /// Interface to listen on (COLLX_SOCKET_IFNAME); empty: the one that routes to master_addr.
  std::string ifname = detail::env_string("COLLX_SOCKET_IFNAME");
  /// The job's secret (COLLX_JOB_TOKEN): every rank the same, at most 64 bytes. Empty: read from
  /// token_file, else drawn for the job and passed through a private channel, else none
  /// (tcp/secret.hpp). It never crosses the wire (tcp/auth.hpp).
  std::string token = detail::env_string("COLLX_JOB_TOKEN");
  /// Every connection between two ranks encrypted and authenticated by TLS 1.3, keyed with the
  /// job's secret (COLLX_TCP_TLS=1; tcp/tls.hpp): for a network you do not trust.
  bool tls = detail::env_int("COLLX_TCP_TLS", 0ll, 1ll, 0) != 0;
  /// A file only this user can read that holds the secret (COLLX_JOB_TOKEN_FILE).
  std::string token_file = detail::env_string("COLLX_JOB_TOKEN_FILE");
  /// Socket buffer sizes (SO_SNDBUF/SO_RCVBUF; COLLX_TCP_BUFFER_BYTES overrides, 0 keeps the
  /// kernel's autotuning). Measured on 127.0.0.1, 2 processes on 2 cores, 64 MiB all-reduce
  /// (tree), eight runs of `COLLX_TCP_BUFFER_BYTES=<b> collx-perf --transport tcp -np 2 -b 64M
  /// -e 64M --algo tree -n 3`: autotuning gave 1.9 GB/s in 3 runs of 8 and 3.0 in the others
  /// (a run keeps the windows it settles on); fixed 2, 4 and 8 MiB gave 2.9-3.1 in 8 of 8.
  /// Ring and 8-byte latency do not move with it.
  int socket_buffer_bytes = int(detail::env_bytes("COLLX_TCP_BUFFER_BYTES", 0, std::uint64_t(1) << 30, 4 << 20));
  /// For launch_processes: rank 0 serves the store on this already-listening socket.
  int serve_store_fd = -1;
};

}  // namespace collx::transport
