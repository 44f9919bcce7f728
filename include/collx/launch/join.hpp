#pragma once
// join: a transport between processes that collx did not fork (started by torchrun, srun, mpirun
// or a job script). Every rank calls it with the same rendezvous store, its rank and the rank
// count, and gets its transport; the store carries what the ranks must agree on: for shm the
// segment's job name (rank 0 draws it), for tcp the ranks' addresses (tcp's own rendezvous).
//
//   auto t = collx::join_named("shm", store, rank, size, {timeout});   // a transport::any
//   collx::communicator comm{std::move(t), opts};
//
// By name, the list of transports (core/transports.hpp) says which: the torch backend makes its
// communicator so (COLLX_TORCH_TRANSPORT). launch_processes, which forks its ranks, agrees on
// the job before it forks and needs no store.
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "../core/error.hpp"
#include "../core/transports.hpp"
#include "../transport/any.hpp"
#include "../transport/shm.hpp"
#include "../transport/tcp.hpp"
#include "../transport/two_level.hpp"

namespace collx {

struct join_options {
  /// The rendezvous's deadline: how long a rank waits for the others to join.
  std::chrono::nanoseconds timeout = std::chrono::minutes(5);
  /// The store's keys go under it ("<prefix>/job"), so two communicators can share a store.
  std::string prefix = "collx";
  /// tcp: the address this rank listens on is the one that routes to it (MASTER_ADDR's host).
  std::string master_addr;
};

namespace detail {
/// A job name every rank agrees on: rank 0 draws it (getrandom) and publishes it at `key`; the
/// others wait for it no longer than `timeout`.
inline std::string agree_job_name(transport::store& store, const std::string& key, int rank, std::chrono::nanoseconds timeout,
                                  const char* who) {
  if (rank == 0) store.set(key, "j" + transport::tcp_detail::rendezvous::random_token().substr(0, 16));
  const auto job = store.get(key, transport::net::clock::now() + timeout);
  if (!job)
    throw error(errc::timeout, std::string(who) + ": rank " + std::to_string(rank) + " waited " + format_seconds(timeout) +
                                   " for rank 0 to publish the job's name at '" + key + "' in " + store.where());
  return *job;
}
/// shm's settings for a join: attaching waits no longer than the join may.
inline transport::shm::config shm_join_config(const join_options& o) {
  transport::shm::config cfg;
  cfg.attach_timeout = std::min<std::chrono::nanoseconds>(cfg.attach_timeout, o.timeout);
  return cfg;
}
}  // namespace detail

/// Transport T joined through `store` (T: transport::shm or transport::tcp).
template <class T>
T join(const std::shared_ptr<transport::store>& store, int rank, int size, const join_options& o = {});

/// shm: rank 0 draws the job's name and publishes it; every rank attaches the segment of that
/// name, waiting for the others no longer than o.timeout.
template <>
inline transport::shm join<transport::shm>(const std::shared_ptr<transport::store>& store, int rank, int size,
                                           const join_options& o) {
  const std::string job = detail::agree_job_name(*store, o.prefix + "/job", rank, o.timeout, "join (shm)");
  return transport::shm(job, rank, size, detail::shm_join_config(o));
}

/// tcp: the ranks publish and read their addresses through the store (tcp's rendezvous).
template <>
inline transport::tcp join<transport::tcp>(const std::shared_ptr<transport::store>& store, int rank, int size,
                                           const join_options& o) {
  transport::tcp_config cfg;
  cfg.external_store = store;
  cfg.rendezvous_timeout = o.timeout;
  if (!o.master_addr.empty()) cfg.master_addr = o.master_addr;
  return transport::tcp(o.prefix, rank, size, std::move(cfg));
}

/// two_level<shm, tcp>: tcp joined through the store; which ranks share a host gathered over
/// it (COLLX_NODE, else the host name: transport/two_level.hpp); then shm among each host's
/// ranks, under the job's name rank 0 draws and publishes (as join<shm> does).
template <>
inline transport::two_level<transport::shm, transport::tcp> join<transport::two_level<transport::shm, transport::tcp>>(
    const std::shared_ptr<transport::store>& store, int rank, int size, const join_options& o) {
  transport::tcp out = join<transport::tcp>(store, rank, size, o);
  const std::string job = detail::agree_job_name(*store, o.prefix + "/nodes-job", rank, o.timeout, "join (two_level)");
  return transport::two_level<transport::shm, transport::tcp>::connect(std::move(out), job, detail::shm_join_config(o));
}

/// The transport called `name` in the list of transports (core/transports.hpp), joined through
/// `store`: one of those whose ranks are processes or hosts.
inline transport::any join_named(std::string_view name, const std::shared_ptr<transport::store>& store, int rank, int size,
                                 const join_options& o = {}) {
  const transport_entry* t = find_transport(name);
  if (t != nullptr && t->name == transport::shm::name) return transport::any(join<transport::shm>(store, rank, size, o));
  if (t != nullptr && t->name == transport::tcp::name) return transport::any(join<transport::tcp>(store, rank, size, o));
  // (not in the list: a composition of two of its transports)
  if (name == "two_level") return transport::any(join<transport::two_level<transport::shm, transport::tcp>>(store, rank, size, o));
  throw error(errc::invalid_argument, "join_named: no transport between processes is called '" + std::string(name) +
                                          "' (core/transports.hpp: " +
                                          transport_flags(rank_kind::processes, rank_kind::hosts) + ", or two_level)");
}

}  // namespace collx
