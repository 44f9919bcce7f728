// The strategy programs' launch and check (common.hpp), compiled once for all of them.
#include "common.hpp"

namespace strategies {

int launch(const cli& c, const std::function<void(comm_t&)>& body) {
  try {
    if (c.transport == "threads") collx::launch_threads<counted>(c.np, body);
    else if (c.transport == "shm") collx::launch_processes<counted>(c.np, body);
    else collx::launch_processes<counted>(c.np, body, {}, collx::transport::tcp_config{});
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "FAILED: %s\n", e.what());
    return 1;
  }
  return 0;
}

void report(comm_t& comm, match m, const std::string& what, const std::string& why) {
  // The worst over the ranks (each compared its own part).
  double v[2] = {m.diff, m.scale};
  collx::all_reduce(comm, std::span<double>(v, 2), collx::ops::max{});
  m.diff = v[0];
  m.scale = v[1];
  if (comm.rank() == 0) {
    std::printf("check: %s: largest relative difference %.3g, tolerance %.3g (%s): %s\n", what.c_str(), m.rel(), m.tol, why.c_str(),
                m.ok() ? "MATCH" : "MISMATCH");
    std::fflush(stdout);
  }
  if (!m.ok()) throw std::runtime_error(what + ": the distributed run differs from one process by " + std::to_string(m.rel()));
}

}  // namespace strategies
