// collx-nodes-perf: all_reduce on a job laid out on several nodes (transport::two_level: shm within
// each node, tcp across), the node-aware policy against the flat ones, side by side in one run.
//
//   collx-nodes-perf --nodes 2,2 [--round-robin] [-b 8] [-e 64M] [-f 8] [--reps 5]
//       forks the ranks here, each node a group of them (COLLX_NODE), tcp over 127.0.0.1
//   collx-nodes-perf --from-env [...]
//       one rank, started by a launcher (torchrun's, mpirun's or srun's variables: tcp::from_env),
//       its node from COLLX_NODE or its host name (bench/netns_nodes.sh starts one per namespace)
//
// Each size runs every policy `--reps` times, the policies in turn within each repetition; a
// figure is the median over the repetitions of the slowest rank's mean time per call.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include <collx/collx.hpp>

#include "cli.hpp"

namespace {

using bench_cli::usage_error;
namespace algo = collx::algo;

struct flags {
  std::vector<int> nodes{2, 2};
  bool round_robin = false, from_env = false;
  std::size_t min_bytes = 8, max_bytes = 64 << 20;
  int factor = 8, reps = 5;
  double budget_s = 0.25;  // per size, policy and repetition, at most
};

const char* const kPolicies[] = {"two_level", "ring", "recursive_halving", "tree", "recursive_doubling"};
constexpr int kP = 5;

template <class Comm, class F>
void with_policy(int k, F&& f) {
  switch (k) {
    case 0: return f(algo::two_level{});
    case 1: return f(algo::ring{});
    case 2: return f(algo::recursive_halving{});
    case 3: return f(algo::tree{});
    default: return f(algo::recursive_doubling{});
  }
}

template <class Comm>
void run(Comm& comm, const flags& fl) {
  const bool lead = comm.rank() == 0;
  if (lead) {
    std::printf("# collx-nodes-perf: %d ranks; %s; shm within each node, tcp across\n", comm.size(),
                comm.transport().nodes().describe().c_str());
    std::printf("# median of %d repetitions of the slowest rank's mean time per all_reduce (us); float sum\n", fl.reps);
    std::printf("%12s", "bytes");
    for (const char* p : kPolicies) std::printf(" %19s", p);
    std::printf("   best flat / two_level\n");
  }
  for (std::size_t bytes = fl.min_bytes; bytes <= fl.max_bytes; bytes *= std::size_t(fl.factor)) {
    const std::size_t count = std::max<std::size_t>(1, bytes / sizeof(float));
    std::vector<float> buf(count, 1.0f);
    std::vector<std::vector<double>> t(kP);
    int iters = 0;
    for (int rep = 0; rep < fl.reps; ++rep)
      for (int k = 0; k < kP; ++k)
        with_policy<Comm>(k, [&](auto pol) {
          collx::all_reduce(comm, std::span{buf}, collx::ops::sum{}, pol);  // warm: its schedule built
          if (iters == 0) {  // as many calls as fit the budget, by the first policy's time
            const auto a = std::chrono::steady_clock::now();
            collx::all_reduce(comm, std::span{buf}, collx::ops::sum{}, pol);
            double one = std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count();
            collx::all_reduce(comm, std::span{&one, 1}, collx::ops::max{});
            iters = int(std::clamp(fl.budget_s / std::max(one, 1e-7), 2.0, 2000.0));
          }
          collx::barrier(comm);
          const auto a = std::chrono::steady_clock::now();
          for (int i = 0; i < iters; ++i) collx::all_reduce(comm, std::span{buf}, collx::ops::sum{}, pol);
          double mean = std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count() / iters;
          collx::all_reduce(comm, std::span{&mean, 1}, collx::ops::max{});
          t[std::size_t(k)].push_back(mean * 1e6);
        });
    if (lead) {
      std::printf("%12zu", count * sizeof(float));
      double best_flat = 1e300, two = 0;
      for (int k = 0; k < kP; ++k) {
        auto v = t[std::size_t(k)];
        std::nth_element(v.begin(), v.begin() + std::ptrdiff_t(v.size() / 2), v.end());
        const double med = v[v.size() / 2];
        if (k == 0) two = med;
        else best_flat = std::min(best_flat, med);
        std::printf(" %19.1f", med);
      }
      std::printf("   %.2f\n", best_flat / two);
      std::fflush(stdout);
    }
  }
}

flags parse(int argc, char** argv) {
  flags f;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw usage_error(a + " needs a value");
      return argv[++i];
    };
    if (a == "--nodes") {
      f.nodes.clear();
      const std::string v = value();
      for (std::size_t at = 0; at <= v.size();) {
        const std::size_t c = std::min(v.find(',', at), v.size());
        f.nodes.push_back(int(bench_cli::parse_int("--nodes", v.substr(at, c - at), 1, 256)));
        at = c + 1;
      }
    } else if (a == "--round-robin") f.round_robin = true;
    else if (a == "--from-env") f.from_env = true;
    else if (a == "-b") f.min_bytes = bench_cli::parse_size(a, value());
    else if (a == "-e") f.max_bytes = bench_cli::parse_size(a, value());
    else if (a == "-f") f.factor = int(bench_cli::parse_int(a, value(), 2, 1024));
    else if (a == "--reps") f.reps = int(bench_cli::parse_int(a, value(), 1, 1000));
    else throw usage_error("unknown flag " + a +
                           " (collx-nodes-perf [--nodes 2,2] [--round-robin] [--from-env] [-b 8] [-e 64M] [-f 8] [--reps 5])");
  }
  return f;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const flags fl = parse(argc, argv);
    if (fl.from_env) {
      collx::communicator comm{collx::transport::two_level<collx::transport::shm, collx::transport::tcp>::from_env()};
      run(comm, fl);
    } else {
      collx::launch_node_processes(collx::node_map::of_sizes(fl.nodes, fl.round_robin), [&](auto& comm) { run(comm, fl); });
    }
  } catch (const usage_error& e) {
    std::fprintf(stderr, "collx-nodes-perf: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "collx-nodes-perf: %s\n", e.what());
    return 1;
  }
}
