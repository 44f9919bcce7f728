// collx-nodes-perf: a collective on a job laid out on several nodes (transport::two_level: shm
// within each node, tcp across), the node-aware policy against the flat ones, side by side in one
// run.
//
//   collx-nodes-perf --nodes 2,2 [--round-robin] [-c all_reduce] [-b 8] [-e 64M] [-f 8] [--reps 5]
//       forks the ranks here, each node a group of them (COLLX_NODE), tcp over 127.0.0.1
//   collx-nodes-perf --from-env --check
//       instead of timing: every collective with two_level, automatic and ring at counts of every
//       kind, checked against the reference (tests/CMakeLists.txt runs it on hosts as namespaces)
//   collx-nodes-perf --from-env [...]
//       one rank, started by a launcher (torchrun's, mpirun's or srun's variables: tcp::from_env;
//       under mpirun no MASTER_ADDR: tcp meets through its PMIx store), its node from COLLX_NODE
//       or its host name (bench/netns_nodes.sh starts one per namespace)
//   collx-nodes-perf --from-env --link [--expect-rate GBIT] [--expect-delay MS]
//       the link between nodes as automatic measured it at its first call (α, rate, δ: the
//       model's numbers between nodes); with --expect-*: exit 1 unless the rate is within
//       0.5-1.1 of GBIT and α at least 0.9 of MS (netns_nodes.sh --rate --delay set them)
//   mpirun ... collx-nodes-perf --mpi --check
//       (built where MPI is found) the same check over transport::mpi: flat on MPI_COMM_WORLD,
//       then two_level<shm, mpi>, the nodes from the host names; then two_level<shm, tcp> from
//       the launcher's variables, as --from-env (bench/netns_nodes.sh --mpirun)
//
// -c: all_reduce (the default), reduce_scatter, all_gather, broadcast or reduce (root 0); a size
// is the whole buffer's (reduce_scatter's input, all_gather's output). A policy with no schedule
// for the collective prints "-".
// Each size runs every policy `--reps` times, the policies in turn within each repetition; a
// figure is the median over the repetitions of the slowest rank's mean time per call.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include <collx/collx.hpp>
#if defined(COLLX_NODES_MPI)
#include <collx/transport/mpi.hpp>
#endif

#include "cli.hpp"

namespace {

using bench_cli::usage_error;
namespace algo = collx::algo;

struct flags {
  std::vector<int> nodes{2, 2};
  bool round_robin = false, from_env = false, check = false, mpi = false, link = false;
  double expect_gbit = 0, expect_delay_ms = 0;  // --link's check (0: none)
  std::size_t min_bytes = 8, max_bytes = 64 << 20;
  int factor = 8, reps = 5;
  std::string coll = "all_reduce";
  double budget_s = 0.25;  // per size, policy and repetition, at most
};

// (then algo::compressed's all_reduce, its data on the wire as bf16 and as MXFP8: all_reduce only)
const char* const kPolicies[] = {"two_level", "ring", "recursive_halving", "tree", "recursive_doubling", "automatic",
                                 "compressed(bf16)", "compressed(mxfp8)"};
constexpr int kP = 8, kAutomatic = 5;

template <class F>
void with_policy(int k, F&& f) {
  switch (k) {
    case 0: return f(algo::two_level{});
    case 1: return f(algo::ring{});
    case 2: return f(algo::recursive_halving{});
    case 3: return f(algo::tree{});
    case 4: return f(algo::recursive_doubling{});
    case kAutomatic: return f(algo::automatic{});
    case 6: return f(algo::compressed<collx::wire::bf16>{});
    default: return f(algo::compressed<collx::wire::mxfp8>{});
  }
}

/// One call of fl.coll over buf (the whole buffer; reduce's output in `out`) with policy pol;
/// false where pol has none.
template <class Comm, class P>
bool call(Comm& comm, const std::string& coll, std::vector<float>& buf, std::vector<float>& out, P pol) {
  const std::size_t n = std::size_t(comm.size()), k = buf.size() / n;
  const std::span<float> all{buf.data(), k * n}, mine{buf.data() + std::size_t(comm.rank()) * k, k};
  if (coll == "all_reduce") {
    collx::all_reduce(comm, std::span{buf}, collx::ops::sum{}, pol);
    return true;
  }
  if constexpr (!std::is_same_v<P, algo::recursive_doubling> && !algo::is_compressed_v<P>) {
    if (coll == "reduce_scatter") collx::reduce_scatter(comm, std::span<const float>{all}, mine, collx::ops::sum{}, pol);
    else if (coll == "all_gather") collx::all_gather(comm, std::span<const float>{mine}, all, pol);
    else if (coll == "broadcast") collx::broadcast(comm, std::span{buf}, 0, pol);
    else collx::reduce(comm, std::span<const float>{buf}, std::span{out}, collx::ops::sum{}, 0, pol);
    return true;
  }
  return false;
}

template <class Comm>
void run(Comm& comm, const flags& fl) {
  const bool lead = comm.rank() == 0;
  if (lead) {
    std::printf("# collx-nodes-perf: %d ranks; %s; shm within each node, tcp across\n", comm.size(),
                comm.transport().nodes().describe().c_str());
    std::printf("# median of %d repetitions of the slowest rank's mean time per %s (us); float%s\n", fl.reps, fl.coll.c_str(),
                fl.coll == "all_gather" || fl.coll == "broadcast" ? "" : " sum");
    std::printf("%12s", "bytes");
    for (const char* p : kPolicies) std::printf(" %19s", p);
    std::printf("   best flat / two_level   automatic / best   best flat / compressed(bf16), (mxfp8)\n");
  }
  for (std::size_t bytes = fl.min_bytes; bytes <= fl.max_bytes; bytes *= std::size_t(fl.factor)) {
    const std::size_t count = std::max<std::size_t>(std::size_t(comm.size()), bytes / sizeof(float));
    std::vector<float> buf(count, 1.0f), out(fl.coll == "reduce" ? count : 0);
        std::vector<std::vector<double>> t(kP);
    int iters = 0;
    for (int rep = 0; rep < fl.reps; ++rep)
      for (int k = 0; k < kP; ++k)
        with_policy(k, [&](auto pol) {
          if (!call(comm, fl.coll, buf, out, pol)) return t[std::size_t(k)].push_back(-1);  // warm: its schedule built
          if (iters == 0) {  // as many calls as fit the budget, by the first policy's time
            const auto a = std::chrono::steady_clock::now();
            call(comm, fl.coll, buf, out, pol);
            double one = std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count();
            collx::all_reduce(comm, std::span{&one, 1}, collx::ops::max{});
            iters = int(std::clamp(fl.budget_s / std::max(one, 1e-7), 2.0, 2000.0));
          }
          collx::barrier(comm);
          const auto a = std::chrono::steady_clock::now();
          for (int i = 0; i < iters; ++i) call(comm, fl.coll, buf, out, pol);
          double mean = std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count() / iters;
          collx::all_reduce(comm, std::span{&mean, 1}, collx::ops::max{});
          t[std::size_t(k)].push_back(mean * 1e6);
        });
    if (lead) {
      std::printf("%12zu", count * sizeof(float));
      double best_flat = 1e300, two = 0, automatic = 0, packed[2] = {-1, -1};
      for (int k = 0; k < kP; ++k) {
        auto v = t[std::size_t(k)];
        std::nth_element(v.begin(), v.begin() + std::ptrdiff_t(v.size() / 2), v.end());
        const double med = v[v.size() / 2];
        if (med < 0) {
          std::printf(" %19s", "-");
          continue;
        }
        if (k == 0) two = med;
        else if (k < kAutomatic) best_flat = std::min(best_flat, med);
        else if (k == kAutomatic) automatic = med;
        else packed[k - kAutomatic - 1] = med;
        std::printf(" %19.1f", med);
      }
      std::printf("   %.2f   %.2f", best_flat / two, automatic / std::min(best_flat, two));
      if (packed[0] > 0) std::printf("   %.2f   %.2f", best_flat / packed[0], best_flat / packed[1]);
      std::printf("\n");
      std::fflush(stdout);
    }
  }
}

/// --check: the five collectives with two_level, automatic and ring, against the reference. A
/// rank's input is small whole numbers in float, so every sum is exact. Returns the number of
/// wrong results, summed over the ranks (rank 0 prints what was wrong and what ran).
template <class Comm>
std::string layout(Comm& comm) {
  if constexpr (requires { comm.transport().nodes(); }) return comm.transport().nodes().describe();
  else return std::string("one level (transport::") + std::remove_cvref_t<decltype(comm.transport())>::name + ")";
}

template <class Comm>
int check(Comm& comm) {
  const int n = comm.size(), r = comm.rank(), root = n - 1;
  auto x = [](int q, std::size_t i) { return float((q + 1) * 3 + int(i % 7)); };
  auto total = [&](std::size_t i) {
    float t = 0;
    for (int q = 0; q < n; ++q) t += x(q, i);
    return t;
  };
  int bad = 0;
  auto expect = [&](bool ok, const char* what, const char* policy, std::size_t count) {
    if (ok) return;
    ++bad;
    std::fprintf(stderr, "collx-nodes-perf --check: rank %d: %s with %s, count %zu: wrong result\n", r, what, policy, count);
  };
  for (std::size_t count : {std::size_t(0), std::size_t(1), std::size_t(n + 1), std::size_t(1001), std::size_t(70001), std::size_t(1000003)}) {
    auto each = [&](auto pol) {
      const char* name = decltype(pol)::name;
      std::vector<float> v(count), out(count);
      for (std::size_t i = 0; i < count; ++i) v[i] = x(r, i);
      collx::all_reduce(comm, std::span{v}, collx::ops::sum{}, pol);
      bool ok = true;
      for (std::size_t i = 0; i < count; ++i) ok = ok && v[i] == total(i);
      expect(ok, "all_reduce", name, count);
      // reduce_scatter and all_gather: blocks of count / n
      const std::size_t k = count / std::size_t(n);
      std::vector<float> in(k * std::size_t(n)), mine(k);
      for (std::size_t i = 0; i < in.size(); ++i) in[i] = x(r, i);
      collx::reduce_scatter(comm, std::span<const float>{in}, std::span{mine}, collx::ops::sum{}, pol);
      ok = true;
      for (std::size_t i = 0; i < k; ++i) ok = ok && mine[i] == total(std::size_t(r) * k + i);
      expect(ok, "reduce_scatter", name, k);
      for (std::size_t i = 0; i < k; ++i) mine[i] = x(r, i);
      collx::all_gather(comm, std::span<const float>{mine}, std::span{in}, pol);
      ok = true;
      for (std::size_t i = 0; i < in.size(); ++i) ok = ok && in[i] == x(int(i / std::max<std::size_t>(k, 1)), i % std::max<std::size_t>(k, 1));
      expect(ok, "all_gather", name, k);
      for (std::size_t i = 0; i < count; ++i) v[i] = r == root ? x(root, i) : -1.0f;
      collx::broadcast(comm, std::span{v}, root, pol);
      ok = true;
      for (std::size_t i = 0; i < count; ++i) ok = ok && v[i] == x(root, i);
      expect(ok, "broadcast", name, count);
      for (std::size_t i = 0; i < count; ++i) v[i] = x(r, i);
      collx::reduce(comm, std::span<const float>{v}, std::span{out}, collx::ops::sum{}, root, pol);
      ok = true;
      for (std::size_t i = 0; i < count && r == root; ++i) ok = ok && out[i] == total(i);
      expect(ok, "reduce", name, count);
    };
    each(algo::two_level{});
    each(algo::automatic{});
    each(algo::ring{});
  }
  collx::all_reduce(comm, std::span{&bad, 1}, collx::ops::sum{});
  if (r == 0)
    std::printf("collx-nodes-perf --check: %d ranks, %s: all_reduce, reduce_scatter, all_gather, broadcast and reduce with "
                "two_level, automatic and ring at 6 counts: %s\n",
                n, layout(comm).c_str(), bad == 0 ? "every result equals the reference" : "WRONG RESULTS");
  return bad;
}

/// --link: one call through automatic (its setup measures the link between nodes), then rank 0
/// prints the numbers the model took and checks them against --expect-rate/--expect-delay.
/// Returns the process's exit status.
template <class Comm>
int link(Comm& comm, const flags& fl) {
  float x = 1;
  collx::all_reduce(comm, std::span{&x, 1}, collx::ops::sum{});
  if (comm.rank() != 0) return 0;
  const auto& st = comm.automatic();
  const double gbit = st.net.beta > 0 ? 8e-9 / st.net.beta : 0, alpha_ms = st.net.alpha * 1e3;
  std::printf("collx-nodes-perf --link: %s\n  between nodes: alpha %.1f us, %.3g Gbit/s, delta %.2f\n  automatic's numbers: %s\n",
              layout(comm).c_str(), st.net.alpha * 1e6, gbit, st.net.delta, st.source.c_str());
  bool ok = true;
  if (fl.expect_gbit > 0 && !(gbit >= 0.5 * fl.expect_gbit && gbit <= 1.1 * fl.expect_gbit)) {
    std::printf("LINK WRONG: %.3g Gbit/s measured, the link has %.3g\n", gbit, fl.expect_gbit);
    ok = false;
  }
  if (fl.expect_delay_ms > 0 && alpha_ms < 0.9 * fl.expect_delay_ms) {
    std::printf("LINK WRONG: alpha %.3f ms measured, under the link's delay of %.3f ms\n", alpha_ms, fl.expect_delay_ms);
    ok = false;
  }
  return ok ? 0 : 1;
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
    else if (a == "--check") f.check = true;
    else if (a == "--mpi") f.mpi = true;
    else if (a == "--link") f.link = true;
    else if (a == "--expect-rate") f.expect_gbit = std::stod(value());
    else if (a == "--expect-delay") f.expect_delay_ms = std::stod(value());
    else if (a == "-b") f.min_bytes = bench_cli::parse_size(a, value());
    else if (a == "-e") f.max_bytes = bench_cli::parse_size(a, value());
    else if (a == "-f") f.factor = int(bench_cli::parse_int(a, value(), 2, 1024));
    else if (a == "--reps") f.reps = int(bench_cli::parse_int(a, value(), 1, 1000));
    else if (a == "-c") {
      f.coll = value();
      if (f.coll != "all_reduce" && f.coll != "reduce_scatter" && f.coll != "all_gather" && f.coll != "broadcast" && f.coll != "reduce")
        throw usage_error("-c " + f.coll + ": all_reduce, reduce_scatter, all_gather, broadcast or reduce");
    }
    else throw usage_error("unknown flag " + a +
                           " (collx-nodes-perf [--nodes 2,2] [--round-robin] [--from-env [--check | --link [--expect-rate GBIT] [--expect-delay MS]]] [--mpi --check] [-c all_reduce] [-b 8] [-e 64M] [-f 8] [--reps 5])");
  }
  return f;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const flags fl = parse(argc, argv);
    if (fl.mpi) {
#if defined(COLLX_NODES_MPI)
      if (!fl.check) throw usage_error("--mpi runs the check only: give --check");
      int bad = 0;
      {
        collx::communicator flat{collx::transport::mpi::world()};
        bad += check(flat);
      }
      using two = collx::transport::two_level<collx::transport::shm, collx::transport::mpi>;
      {
        collx::communicator comm{two::connect(collx::transport::mpi::world())};
        bad += check(comm);
      }
      // and tcp across, from the launcher's variables (under mpirun: its PMIx store)
      collx::communicator comm{collx::transport::two_level<collx::transport::shm, collx::transport::tcp>::from_env()};
      bad += check(comm);
      return bad == 0 ? 0 : 1;
#else
      throw usage_error("--mpi: this collx-nodes-perf was built without MPI");
#endif
    }
    if (fl.from_env) {
      collx::communicator comm{collx::transport::two_level<collx::transport::shm, collx::transport::tcp>::from_env()};
      if (fl.check) return check(comm) == 0 ? 0 : 1;
      if (fl.link) return link(comm, fl);
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
