#pragma once
// launch_named(name, n, f, options): runs f(comm) on n ranks over the transport called `name`
// in the list of transports (core/transports.hpp: "threads", "shm", "tcp"), as launch_threads
// and launch_processes start them. What tools that take --transport use.
//
//   collx::launch_named<collx::transport::as_any>("shm", 8, [](auto& comm) { ... });
#include <string>
#include <string_view>

#include "../core/error.hpp"
#include "../core/transports.hpp"
#include "processes.hpp"
#include "threads.hpp"

namespace collx {

template <template <class> class Decorator, class F>
void launch_named(std::string_view name, int n, F&& f, options opts = {}) {
  const transport_entry* t = find_transport(name);
  if (t == nullptr)
    throw error(errc::invalid_argument, "launch_named: no transport is called '" + std::string(name) + "' (core/transports.hpp: " +
                                            transport_flags(rank_kind::threads, rank_kind::processes, rank_kind::hosts) + ")");
  if (t->name == transport::inproc::name) return launch_threads<Decorator>(n, std::forward<F>(f), opts);
  if (t->name == transport::shm::name) return launch_processes<Decorator>(n, std::forward<F>(f), opts);
  if (t->name == transport::tcp::name) return launch_processes<Decorator>(n, std::forward<F>(f), opts, transport::tcp_config{});
  throw error(errc::invalid_argument, "launch_named: the " + std::string(t->words) + " transport ('" + std::string(t->flag) +
                                          "') is not started by a launcher of this host's ranks");
}

template <class F>
void launch_named(std::string_view name, int n, F&& f, options opts = {}) {
  launch_named<detail::no_decorator>(name, n, std::forward<F>(f), opts);
}

}  // namespace collx
