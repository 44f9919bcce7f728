// gloo-perf: the Gloo baseline for collx-perf over TCP (docs/design.md, "How it is measured": side by side
// with the library a user would otherwise pick; Gloo is PyTorch's CPU backend). One collective
// over a size sweep, Gloo's TCP transport on 127.0.0.1, ranks as forked processes meeting through
// Gloo's file store in a temporary directory:
//
//   gloo-perf -np 4 -b 8 -e 64M -f 4 --op all_reduce --algo all
//
// Same flags, columns and conventions as collx-perf (bench/baseline.hpp). --algo picks Gloo's
// all-reduce: ring (AllreduceRing), ring_chunked (AllreduceRingChunked), halving_doubling
// (AllreduceHalvingDoubling) or all (the three, one sweep each). These algorithms reduce in
// place (Gloo's interface): the input is copied into the output buffer once, outside the timed
// loop, and every timed call reduces that buffer (the check call starts from fresh inputs).
// all_gather, broadcast and all_to_all use Gloo's collectives of the same names (algo "gloo").
#include <gloo/allgather.h>
#include <gloo/allreduce_halving_doubling.h>
#include <gloo/allreduce_ring.h>
#include <gloo/allreduce_ring_chunked.h>
#include <gloo/alltoall.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <memory>

#include "baseline.hpp"

namespace {

using namespace baseline;

struct gloo_backend {
  static constexpr const char* program = "gloo-perf";
  static constexpr const char* transport = "gloo tcp (127.0.0.1)";
  static constexpr const char* ranks_are = "forked processes";
  std::shared_ptr<gloo::Context> ctx;
  std::string algo_name;  // all_reduce: ring | ring_chunked | halving_doubling
  // The all-reduce object of the current size (Gloo builds its schedule and buffers once).
  const float* cached_in = nullptr;
  float* cached_out = nullptr;
  std::size_t cached_count = 0;
  std::unique_ptr<gloo::Algorithm> ar;
  std::uint32_t tag = 0;

  const char* algo() const { return algo_name.c_str(); }
  void barrier() {
    gloo::BarrierOptions o(ctx);
    gloo::barrier(o);
  }
  unsigned long long sum_to_root(unsigned long long bad) {
    // Every count is small: a double carries it exactly through Gloo's float-typed all-reduce.
    std::vector<double> v{double(bad)};
    gloo::AllreduceRing<double> r(ctx, {v.data()}, 1);
    r.run();
    return (unsigned long long)(v[0]);
  }
  void invoke(coll c, const float* in, float* out, const shape& sh, int root) {
    switch (c) {
      case coll::all_reduce: {
        if (in != cached_in || out != cached_out || sh.count != cached_count) {
          std::memcpy(out, in, sh.count * sizeof(float));
          const std::vector<float*> ptrs{out};
          const int count = int(sh.count);
          if (algo_name == "ring") ar = std::make_unique<gloo::AllreduceRing<float>>(ctx, ptrs, count);
          else if (algo_name == "ring_chunked") ar = std::make_unique<gloo::AllreduceRingChunked<float>>(ctx, ptrs, count);
          else ar = std::make_unique<gloo::AllreduceHalvingDoubling<float>>(ctx, ptrs, count);
          cached_in = in;
          cached_out = out;
          cached_count = sh.count;
        }
        ar->run();
        break;
      }
      case coll::all_gather: {
        gloo::AllgatherOptions o(ctx);
        o.setInput(const_cast<float*>(in), sh.k);
        o.setOutput(out, sh.out);
        o.setTag(tag++);
        gloo::allgather(o);
        break;
      }
      case coll::broadcast: {
        gloo::BroadcastOptions o(ctx);
        o.setOutput(out, sh.count);
        o.setRoot(root);
        o.setTag(tag++);
        gloo::broadcast(o);
        break;
      }
      case coll::all_to_all: {
        gloo::AlltoallOptions o(ctx);
        o.setInput(const_cast<float*>(in), sh.in);
        o.setOutput(out, sh.out);
        o.setTag(tag++);
        gloo::alltoall(o);
        break;
      }
      case coll::reduce_scatter: throw std::runtime_error("gloo-perf: reduce_scatter is not measured");
      case coll::reduce: throw std::runtime_error("gloo-perf: reduce is not measured");
    }
  }
  /// The check call must start from fresh inputs: rebuild the all-reduce (it copies in -> out).
  void before_check() { cached_in = nullptr; }
};

void usage(std::FILE* f) {
  std::fprintf(f,
               "usage: gloo-perf [flags]   (collx-perf's flags; ranks are forked processes, Gloo TCP on 127.0.0.1)\n"
               "  -np, --nranks N            ranks (default 2)\n"
               "  --op COLL                  all_reduce|all_gather|broadcast|all_to_all (default all_reduce)\n"
               "  --algo A                   all_reduce: ring|ring_chunked|halving_doubling|all (default all)\n"
               "  -r, --root R               root of broadcast (default 0)\n"
               "%s"
               "  -h, --help                 this text\n"
               "Exit status: 0, or 1 when any #wrong > 0, 2 for bad flags, 3 when a call fails.\n", bench_cli::kSweepHelp);
}

/// One rank: connect, then one sweep per algorithm. Returns the wrong elements (rank 0).
unsigned long long rank_main(const config& cfg, const coll_info& ci, int rank, int n, const std::string& dir) {
  gloo::transport::tcp::attr attr;
  attr.hostname = "127.0.0.1";
  auto dev = gloo::transport::tcp::CreateDevice(attr);
  auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, n);
  gloo::rendezvous::FileStore store(dir);
  ctx->connectFullMesh(store, dev);
  std::vector<std::string> algos{"gloo"};
  if (ci.c == coll::all_reduce)
    algos = cfg.algo.empty() || cfg.algo == "all" ? std::vector<std::string>{"ring", "ring_chunked", "halving_doubling"}
                                                  : std::vector<std::string>{cfg.algo};
  unsigned long long wrong = 0;
  for (const std::string& a : algos) {
    gloo_backend be;
    be.ctx = ctx;
    be.algo_name = a;
    wrong += sweep(be, cfg, ci, rank, n);
  }
  return wrong;
}

}  // namespace

int main(int argc, char** argv) {
  config cfg;
  const coll_info* ci = nullptr;
  try {
    cfg = parse(argc, argv, 0);
    if (!cfg.help && !(ci = find_coll(cfg.op)))
      throw usage_error("unknown --op '" + cfg.op + "'; choose one of all_reduce|all_gather|broadcast|all_to_all");
    if (ci && ci->c == coll::reduce_scatter) throw usage_error("--op reduce_scatter: Gloo's is not measured here");
    if (!cfg.algo.empty() && cfg.algo != "all" && cfg.algo != "ring" && cfg.algo != "ring_chunked" && cfg.algo != "halving_doubling")
      throw usage_error("--algo '" + cfg.algo + "': ring, ring_chunked, halving_doubling or all");
  } catch (const usage_error& e) {
    std::fprintf(stderr, "gloo-perf: %s\n(gloo-perf --help lists the flags)\n", e.what());
    return 2;
  }
  if (cfg.help) {
    usage(stdout);
    return 0;
  }
  const int n = cfg.ranks;
  char tmpl[] = "/tmp/gloo-perf-XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  // Rank 0's verdict comes back through shared memory; the other ranks report by exit status.
  auto* wrong0 = static_cast<unsigned long long*>(
      mmap(nullptr, sizeof(unsigned long long), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  *wrong0 = 0;
  std::fflush(nullptr);
  std::vector<pid_t> kids;
  for (int r = 0; r < n; ++r) {
    const pid_t p = fork();
    if (p == 0) {
      int code = 0;
      try {
        const unsigned long long w = rank_main(cfg, *ci, r, n, dir);
        if (r == 0) *wrong0 = w;
      } catch (const std::exception& e) {
        std::fflush(stdout);
        std::fprintf(stderr, "gloo-perf (rank %d): %s\n", r, e.what());
        code = 3;
      }
      std::fflush(nullptr);
      _exit(code);
    }
    kids.push_back(p);
  }
  int rc = 0;
  for (pid_t p : kids) {
    int st = 0;
    waitpid(p, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) rc = 3;
  }
  std::filesystem::remove_all(dir);
  if (rc == 0 && *wrong0 > 0) {
    std::fprintf(stderr, "gloo-perf: %llu wrong elements\n", *wrong0);
    rc = 1;
  }
  return rc;
}
