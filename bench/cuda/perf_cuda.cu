// collx-perf-cuda: what `collx-perf --transport cuda` runs (collx-perf hands its arguments to
// this program, its sibling, built where nvcc is). One collective over an nccl-tests-style size
// sweep on -np thread-ranks, each bound to a GPU (--devices, default 0: every rank on device 0,
// as on a one-GPU machine), buffers in device memory, transport::cuda:
//
//   collx-perf --transport cuda -np 4 -b 8 -e 1G -f 4 --op all_reduce --algo ring
//
// Same flags, columns and conventions as collx-perf and the baselines (bench/baseline.hpp):
// time is the average per call on rank 0 between two barriers (a blocking call returns when its
// result is in place), busbw as nccl-tests, #wrong from one more call on small-integer inputs
// against a serial reference, copied back to the host. float and sum only, as the baselines;
// the dtypes x ops are checked by test_cuda. Exit status: 0, 1 when any #wrong > 0, 2 for bad
// flags, 3 when a call fails, 77 when there is no CUDA device.
#include <collx/collx.hpp>
#include <collx/cuda/transport.cuh>
#include <collx/algo/model.hpp>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "../baseline.hpp"

namespace {

using namespace baseline;
namespace al = collx::algo;

/// Whether policy A has a schedule for c (automatic: for every collective here).
template <class A>
constexpr bool serves(coll c) {
  if constexpr (std::is_same_v<A, al::automatic>) {
    return true;
  } else {
    return collx::model::supports<A>(c, true);  // (baseline's coll is collx's own list)
  }
}

/// The policy --algo names: automatic (nullopt), or one of algo::policies (model::parse_policy).
/// False when there is none of that name.
bool parse_algo(const std::string& name, std::optional<collx::model::choice>& policy) {
  policy.reset();
  if (name.empty() || name == al::automatic::name) return true;
  policy = collx::model::parse_policy(name);
  return policy.has_value();
}

/// Calls f with the policy object: automatic{}, or the one `policy` names (model::visit).
template <class F>
void with_policy(const std::optional<collx::model::choice>& policy, F&& f) {
  if (!policy) f(al::automatic{});
  else collx::model::visit(*policy, [&](const auto& a) { f(a); });
}

std::string policy_names() {
  std::string s = al::automatic::name;
  for (collx::model::choice p : collx::model::all_policies) s += std::string("|") + collx::model::name(p);
  return s;
}

/// Rank 0's tally of the wrong elements: the ranks are threads of this process.
struct tally {
  std::atomic<unsigned long long> total{0};
};

/// A device buffer of floats on the calling rank's stream-ordered pool (a cudaMalloc may wait for
/// the whole device, where other ranks' kernels wait for this rank).
struct device_floats {
  float* p = nullptr;
  std::size_t cap = 0;
  void reserve(std::size_t n) {
    if (n <= cap) return;
    release();
    collx::cuda::check(cudaMallocAsync(&p, n * sizeof(float), cudaStreamPerThread), "cudaMallocAsync");
    cap = n;
  }
  void release() {
    if (p != nullptr) cudaFreeAsync(p, cudaStreamPerThread);
    p = nullptr;
    cap = 0;
  }
  ~device_floats() {
    release();
    cudaStreamSynchronize(cudaStreamPerThread);
  }
};

template <class Comm>
struct cuda_backend {
  static constexpr const char* program = "collx-perf";
  static constexpr const char* transport = "cuda";
  static constexpr const char* ranks_are = "thread-ranks on GPUs, buffers in device memory";
  Comm& comm;
  std::string algo_name;
  std::optional<collx::model::choice> policy;  // (parsed once: invoke is timed)
  tally& wrong;
  device_floats in, out;

  const char* algo() const { return algo_name.c_str(); }
  void barrier() { collx::barrier(comm); }
  unsigned long long sum_to_root(unsigned long long bad) {
    wrong.total.fetch_add(bad);
    barrier();
    const unsigned long long t = comm.rank() == 0 ? wrong.total.exchange(0) : 0;
    barrier();  // read before any rank adds the next size's
    return t;
  }
  void upload(const std::vector<float>& hin, const std::vector<float>& hout) {
    in.reserve(hin.size());
    out.reserve(hout.size());
    if (!hin.empty())
      collx::cuda::check(cudaMemcpyAsync(in.p, hin.data(), hin.size() * sizeof(float), cudaMemcpyHostToDevice, cudaStreamPerThread),
                         "cudaMemcpyAsync");
    if (!hout.empty())
      collx::cuda::check(cudaMemcpyAsync(out.p, hout.data(), hout.size() * sizeof(float), cudaMemcpyHostToDevice, cudaStreamPerThread),
                         "cudaMemcpyAsync");
    collx::cuda::check(cudaStreamSynchronize(cudaStreamPerThread), "cudaStreamSynchronize");
  }
  void download(std::vector<float>& hout) {
    if (!hout.empty())
      collx::cuda::check(cudaMemcpyAsync(hout.data(), out.p, hout.size() * sizeof(float), cudaMemcpyDeviceToHost, cudaStreamPerThread),
                         "cudaMemcpyAsync");
    collx::cuda::check(cudaStreamSynchronize(cudaStreamPerThread), "cudaStreamSynchronize");
  }
  /// One call on the device buffers (upload's), whatever host pointers run_size passes.
  void invoke(coll c, const float*, float*, const shape& sh, int root) {
    const std::span<const float> cin{in.p, sh.in};
    const std::span<float> sout{out.p, sh.out};
    with_policy(policy, [&](auto a) {
      using A = decltype(a);
      switch (c) {
        case coll::all_reduce:
          if constexpr (serves<A>(coll::all_reduce)) collx::all_reduce(comm, cin, sout, collx::ops::sum{}, a);
          break;
        case coll::reduce_scatter:
          if constexpr (serves<A>(coll::reduce_scatter)) collx::reduce_scatter(comm, cin, sout, collx::ops::sum{}, a);
          break;
        case coll::all_gather:
          if constexpr (serves<A>(coll::all_gather)) collx::all_gather(comm, cin, sout, a);
          break;
        case coll::broadcast:
          if constexpr (serves<A>(coll::broadcast)) collx::broadcast(comm, sout, root, a);
          break;
        case coll::all_to_all:
          if constexpr (serves<A>(coll::all_to_all)) collx::all_to_all(comm, cin, sout, a);
          break;
        case coll::reduce: break;  // (not timed: kColls)
      }
    });
  }
};

/// "0,1,2" -> {0, 1, 2}: rank r runs on devices[r % size].
std::vector<int> parse_devices(const std::string& s) {
  std::vector<int> v;
  std::size_t at = 0;
  while (at <= s.size()) {
    const std::size_t comma = std::min(s.find(',', at), s.size());
    v.push_back(int(bench_cli::parse_int("--devices", s.substr(at, comma - at), 0, 1023)));
    at = comma + 1;
  }
  return v;
}

void usage(std::FILE* f) {
  std::fprintf(f,
               "usage: collx-perf --transport cuda [flags]   (collx-perf's flags; ranks are threads, one GPU each)\n"
               "  -np, --nranks N            ranks (default 2)\n"
               "  --devices D[,D...]         rank r runs on device D[r %% count] (default 0: every rank on device 0)\n"
               "  --op COLL                  all_reduce|reduce_scatter|all_gather|broadcast|all_to_all\n"
               "                             (default all_reduce)\n"
               "  --algo POLICY              %s (default automatic)\n"
               "  -d, --datatype T           float (the only one here: test_cuda checks every dtype)\n"
               "  -o, --redop OP             sum (the only one here)\n"
               "  -r, --root R               root of broadcast (default 0)\n"
               "%s"
               "  -h, --help                 this text\n"
               "Exit status: 0, or 1 when any #wrong > 0, 2 for bad flags, 3 when a call fails, 77 without a CUDA device.\n",
               policy_names().c_str(), bench_cli::kSweepHelp);
}

}  // namespace

int main(int argc, char** argv) {
  // Kernels load up front: a lazily loaded kernel may wait for the device, where other ranks'
  // kernels wait for this rank (docs/cuda.md). A user's setting stands.
  ::setenv("CUDA_MODULE_LOADING", "EAGER", 0);
  config cfg;
  const coll_info* ci = nullptr;
  std::vector<int> devices{0};
  std::optional<collx::model::choice> policy;
  try {
    cfg = parse(argc, argv, 0, [&](const std::string& flag, auto&& value) {
      if (flag == "--transport") {
        const std::string t = value();
        if (t != "cuda") throw usage_error("--transport '" + t + "': this is collx-perf's cuda driver (collx-perf runs the others)");
        return true;
      }
      if (flag == "--devices") {
        devices = parse_devices(value());
        return true;
      }
      return false;
    });
    if (!cfg.help && !(ci = find_coll(cfg.op)))
      throw usage_error("unknown --op '" + cfg.op + "'; choose one of all_reduce|reduce_scatter|all_gather|broadcast|all_to_all");
    if (cfg.algo.empty()) cfg.algo = al::automatic::name;
    bool serves_it = false;
    if (!parse_algo(cfg.algo, policy))
      throw usage_error("unknown --algo '" + cfg.algo + "'; choose one of " + policy_names());
    if (ci != nullptr) with_policy(policy, [&](auto a) { serves_it = serves<decltype(a)>(ci->c); });
    if (ci != nullptr && !serves_it) throw usage_error("--algo " + cfg.algo + " has no " + ci->name + " schedule");
  } catch (const usage_error& e) {
    std::fprintf(stderr, "collx-perf --transport cuda: %s\n(collx-perf --transport cuda --help lists the flags)\n", e.what());
    return 2;
  }
  if (cfg.help) {
    usage(stdout);
    return 0;
  }
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::printf("collx-perf --transport cuda: skipped: no CUDA device here\n");
    return 77;
  }
  for (int d : devices)
    if (d >= count) {
      std::fprintf(stderr, "collx-perf --transport cuda: --devices names device %d, but this machine has %d\n", d, count);
      return 2;
    }
  unsigned long long wrong = 0;
  tally t;
  try {
    collx::cuda::launch_threads(cfg.ranks, [&](auto& comm) {
      cuda_backend<std::remove_reference_t<decltype(comm)>> be{comm, cfg.algo, policy, t};
      const unsigned long long w = sweep(be, cfg, *ci, comm.rank(), comm.size());
      if (comm.rank() == 0) wrong = w;
    }, collx::options{}, devices);
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "collx-perf --transport cuda: %s\n", e.what());
    return 3;
  }
  if (wrong > 0) {
    std::fprintf(stderr, "collx-perf --transport cuda: %llu wrong elements\n", wrong);
    return 1;
  }
  return 0;
}
