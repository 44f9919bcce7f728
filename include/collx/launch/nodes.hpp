#pragma once
// Launching a job laid out on several nodes (transport/two_level.hpp), on this machine: each
// "node" a group of ranks, as core/topology.hpp's node_map says.
//
//   collx::launch_node_threads(collx::node_map::of_sizes({3, 2}), [](auto& comm) { ... });
//       thread-ranks: inproc within each node, inproc across (two_level<inproc, inproc>)
//   collx::launch_node_processes(collx::node_map::of_sizes({2, 2}, true), [](auto& comm) { ... });
//       processes: shm within each node, tcp across (two_level<shm, tcp>); each rank's node is
//       its COLLX_NODE, and the map is gathered over tcp as from_env() gathers it on a cluster
//
// The ranks of different nodes share this machine's memory and /dev/shm all the same; hosts
// that cannot reach each other but over the network are network namespaces (tests/netns).
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "../transport/two_level.hpp"
#include "processes.hpp"
#include "threads.hpp"

namespace collx {

/// (Decorator wraps each rank's transport: transport::as_any gives a communicator<any> that
/// holds the two-level transport, as the torch backend's does.)
template <template <class> class Decorator, class F>
void launch_node_threads(const node_map& nm, F&& f, options opts = {}) {
  const int n = nm.size();
  if (n < 1) throw error(errc::invalid_argument, "launch_node_threads: the node map has no ranks");
  auto g = std::make_shared<transport::inproc::group>(n);
  std::vector<std::shared_ptr<transport::inproc::group>> node;
  for (const auto& m : nm.members) node.push_back(std::make_shared<transport::inproc::group>(int(m.size())));
  using two = transport::two_level<transport::inproc, transport::inproc>;
  auto at = [&](int r) { return std::pair{node[std::size_t(nm.node_of[std::size_t(r)])], nm.local_of[std::size_t(r)]}; };
  detail::run_thread_ranks(
      n, g,
      [&](int r) {
        auto [ng, l] = at(r);
        return Decorator<two>{two(transport::inproc{ng, l}, transport::inproc{g, r}, nm)};
      },
      [&](int r, bool failed, const std::string& why) {
        auto [ng, l] = at(r);
        ng->leave(l, failed, why);
        g->leave(r, failed, why);
      },
      std::forward<F>(f), opts);
}

template <class F>
void launch_node_threads(const node_map& nm, F&& f, options opts = {}) {
  launch_node_threads<detail::no_decorator>(nm, std::forward<F>(f), opts);
}

template <template <class> class Decorator, class F>
void launch_node_processes(const node_map& nm, F&& f, options opts = {}, transport::tcp_config cfg = {}, transport::shm::config scfg = {}) {
  const int n = nm.size();
  if (n < 1) throw error(errc::invalid_argument, "launch_node_processes: the node map has no ranks");
  const std::string job = detail::unique_job_name();
  detail::shm_job_cleanup cleanup{transport::shm::segment_name(job)};  // (each node's is named after it)
  detail::launch_tcp_processes<Decorator>(
      n, job, std::forward<F>(f), opts, std::move(cfg), [&](transport::tcp t, const std::string& j, int r) {
        ::setenv("COLLX_NODE", ("node" + std::to_string(nm.node_of[std::size_t(r)])).c_str(), 1);
        return transport::two_level<transport::shm, transport::tcp>::connect(std::move(t), j, scfg);
      });
}

template <class F>
void launch_node_processes(const node_map& nm, F&& f, options opts = {}, transport::tcp_config cfg = {}, transport::shm::config scfg = {}) {
  launch_node_processes<detail::no_decorator>(nm, std::forward<F>(f), std::move(opts), std::move(cfg), std::move(scfg));
}

}  // namespace collx
