// mpi-perf: the Open MPI baseline for collx-perf (docs/design.md, "How it is measured": side by side with the
// library a user would otherwise pick). One collective over a size sweep, through the MPI C API:
//
//   mpirun -np 4 --oversubscribe --mca pml ob1 --mca btl vader,self mpi-perf -b 8 -e 64M -f 4 --op all_reduce
//
// Same flags, columns and conventions as bench/collx_perf.cpp (bench/baseline.hpp), so rows compare
// line by line; the algo column says "mpi" (whatever Open MPI's tuned/basic coll component chose).
// Buffers are out of place (separate send and receive buffers; MPI_Bcast has one).
//
// With --collx the same sweep runs collx's collectives over transport::mpi instead (algo column
// "collx": COLLX_ALGO picks the policy, automatic by default), in the same processes over the
// same MPI path, so the two compare line by line (docs/mpi.md).
// With --bf16-vs-user-op SIZE, a bfloat16 all_reduce of SIZE bytes: MPI has no bfloat16, so an MPI
// user writes a 2-byte type and a user-defined MPI_Op that widens to float, adds and rounds;
// against it collx's all_reduce of collx::bfloat16 over transport::mpi, in the same processes,
// alternating, medians of --reps (default 5) of the slowest rank's mean time (docs/mpi.md).
// The MPI C API only: skip the deprecated C++ bindings (and their -Wcast-function-type noise).
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <vector>

#include "baseline.hpp"
#ifdef COLLX_PERF_MPI_TRANSPORT
#include <collx/collx.hpp>
#include <collx/transport/mpi.hpp>
#endif

namespace {

using namespace baseline;

int as_int(std::size_t v) {
  if (v > std::size_t(INT_MAX)) throw std::runtime_error("count " + std::to_string(v) + " exceeds MPI's int counts");
  return int(v);
}

struct mpi_backend {
  static constexpr const char* program = "mpi-perf";
  static constexpr const char* transport = "mpi";
  static constexpr const char* ranks_are = "MPI processes";
  const char* algo() const { return "mpi"; }
  void barrier() { MPI_Barrier(MPI_COMM_WORLD); }
  unsigned long long sum_to_root(unsigned long long bad) {
    unsigned long long total = 0;
    MPI_Reduce(&bad, &total, 1, MPI_UNSIGNED_LONG_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
    return total;
  }
  void invoke(coll c, const float* in, float* out, const shape& sh, int root) {
    switch (c) {
      case coll::all_reduce:
        MPI_Allreduce(in, out, as_int(sh.count), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        break;
      case coll::reduce_scatter:
        MPI_Reduce_scatter_block(in, out, as_int(sh.k), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        break;
      case coll::all_gather:
        MPI_Allgather(in, as_int(sh.k), MPI_FLOAT, out, as_int(sh.k), MPI_FLOAT, MPI_COMM_WORLD);
        break;
      case coll::broadcast:
        MPI_Bcast(out, as_int(sh.count), MPI_FLOAT, root, MPI_COMM_WORLD);
        break;
      case coll::all_to_all:
        MPI_Alltoall(in, as_int(sh.k), MPI_FLOAT, out, as_int(sh.k), MPI_FLOAT, MPI_COMM_WORLD);
        break;
      case coll::reduce:
        MPI_Reduce(in, out, as_int(sh.count), MPI_FLOAT, MPI_SUM, root, MPI_COMM_WORLD);
        break;
    }
  }
};

#ifdef COLLX_PERF_MPI_TRANSPORT
/// collx's collectives over transport::mpi, on the same processes.
struct collx_backend : mpi_backend {  // (its barrier and count of wrong elements)
  static constexpr const char* program = "mpi-perf --collx";
  static constexpr const char* transport = "mpi (collx's transport::mpi)";
  collx::communicator<collx::transport::mpi> comm{collx::transport::mpi(MPI_COMM_WORLD)};
  const char* algo() const { return "collx"; }
  void invoke(coll c, const float* in, float* out, const shape& sh, int root) {
    const int n = comm.size();
    switch (c) {
      case coll::all_reduce:
        collx::all_reduce(comm, std::span<const float>(in, sh.count), std::span<float>(out, sh.count), collx::ops::sum{});
        break;
      case coll::reduce_scatter:
        collx::reduce_scatter(comm, std::span<const float>(in, sh.k * std::size_t(n)), std::span<float>(out, sh.k), collx::ops::sum{});
        break;
      case coll::all_gather:
        collx::all_gather(comm, std::span<const float>(in, sh.k), std::span<float>(out, sh.k * std::size_t(n)));
        break;
      case coll::broadcast:
        collx::broadcast(comm, std::span<float>(out, sh.count), root);
        break;
      case coll::all_to_all:
        collx::all_to_all(comm, std::span<const float>(in, sh.k * std::size_t(n)), std::span<float>(out, sh.k * std::size_t(n)));
        break;
      case coll::reduce:
        collx::reduce(comm, std::span<const float>(in, sh.count), std::span<float>(out, comm.rank() == root ? sh.count : 0), collx::ops::sum{}, root);
        break;
    }
  }
};
#endif

#ifdef COLLX_PERF_MPI_TRANSPORT
/// bfloat16 as an MPI user converts it: the top half of a float, rounded to nearest even.
float bf16_to_float(std::uint16_t h) {
  const std::uint32_t u = std::uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
std::uint16_t float_to_bf16(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return std::uint16_t((u >> 16) | 0x40);  // NaN stays NaN
  return std::uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
/// The user-defined MPI_Op: inout[i] = in[i] + inout[i], in float, rounded once.
void bf16_sum(void* in, void* inout, int* len, MPI_Datatype*) {
  const auto* a = static_cast<const std::uint16_t*>(in);
  auto* b = static_cast<std::uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = float_to_bf16(bf16_to_float(a[i]) + bf16_to_float(b[i]));
}

/// --bf16-vs-user-op: see the top. Returns the number of wrong elements (on rank 0).
unsigned long long bf16_vs_user_op(std::size_t bytes, int reps, int rank, int n) {
  const std::size_t count = std::max<std::size_t>(1, bytes / 2);
  MPI_Datatype bf16;
  MPI_Type_contiguous(2, MPI_BYTE, &bf16);
  MPI_Type_commit(&bf16);
  MPI_Op sum;
  MPI_Op_create(&bf16_sum, 1, &sum);
  collx::communicator<collx::transport::mpi> comm{collx::transport::mpi(MPI_COMM_WORLD)};
  // small whole numbers: every sum is exact in bfloat16, whichever order adds them
  std::vector<collx::bfloat16> in(count), out(count);
  for (std::size_t i = 0; i < count; ++i) in[i] = collx::bfloat16(float(rank + 1 + int(i % 5)));
  auto want = [&](std::size_t i) { return float(n * (n + 1) / 2 + n * int(i % 5)); };
  unsigned long long wrong = 0;
  auto check = [&] {
    for (std::size_t i = 0; i < count; ++i) wrong += float(out[i]) != want(i);
    std::fill(out.begin(), out.end(), collx::bfloat16(0.0f));
  };
  auto mpi_call = [&] { MPI_Allreduce(in.data(), out.data(), as_int(count), bf16, sum, MPI_COMM_WORLD); };
  auto collx_call = [&] { collx::all_reduce(comm, std::span<const collx::bfloat16>{in}, std::span{out}, collx::ops::sum{}); };
  mpi_call();
  check();
  collx_call();
  check();
  // as many calls as fit ~0.5 s, by MPI's time
  MPI_Barrier(MPI_COMM_WORLD);
  auto a = std::chrono::steady_clock::now();
  mpi_call();
  double one = std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count();
  MPI_Allreduce(MPI_IN_PLACE, &one, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  const int iters = int(std::clamp(0.5 / std::max(one, 1e-7), 2.0, 1000.0));
  std::vector<double> tm, tc;
  auto time = [&](auto&& call) {
    MPI_Barrier(MPI_COMM_WORLD);
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) call();
    double mean = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iters;
    MPI_Allreduce(MPI_IN_PLACE, &mean, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return mean;
  };
  for (int r = 0; r < reps; ++r) {  // alternating, MPI first and collx first in turn
    if (r % 2 == 0) {
      tm.push_back(time(mpi_call));
      tc.push_back(time(collx_call));
    } else {
      tc.push_back(time(collx_call));
      tm.push_back(time(mpi_call));
    }
  }
  check();  // the last call's result
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  unsigned long long total = 0;
  MPI_Reduce(&wrong, &total, 1, MPI_UNSIGNED_LONG_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
  if (rank == 0) {
    const double m = median(tm), c = median(tc);
    std::printf("# bfloat16 all_reduce, %d ranks, %zu bytes: MPI_Allreduce with a user-defined MPI_Op (2-byte type; widen, add,\n"
                "# round) against collx over transport::mpi; median of %d alternating repetitions of %d calls, slowest rank\n",
                n, count * 2, reps, iters);
    std::printf("%12s %16s %16s %10s %8s\n", "bytes", "MPI user op, us", "collx, us", "speedup", "#wrong");
    std::printf("%12zu %16.1f %16.1f %9.2fx %8llu\n", count * 2, m * 1e6, c * 1e6, m / c, total);
  }
  MPI_Op_free(&sum);
  MPI_Type_free(&bf16);
  return total;
}
#endif

void usage(std::FILE* f) {
  std::fprintf(f,
               "usage: mpirun -np N mpi-perf [flags]   (collx-perf's flags; ranks come from mpirun)\n"
               "  --op COLL                  all_reduce|reduce_scatter|all_gather|broadcast|all_to_all\n"
               "                             (default all_reduce)\n"
               "  -d, --datatype T           float (the only one)\n"
               "  -o, --redop OP             sum (the only one)\n"
               "  -r, --root R               root of broadcast (default 0)\n"
               "  --collx                    collx's collectives over transport::mpi instead of MPI's\n"
               "  --thread-level L           single (default) or multiple: how MPI is started, for either\n"
               "                             (collx::async needs multiple; Open MPI then locks in every call)\n"
               "  --bf16-vs-user-op SIZE     a bfloat16 all_reduce of SIZE bytes: MPI_Allreduce with a user-defined\n"
               "                             MPI_Op against collx over transport::mpi (--reps K, default 5)\n"
               "%s"
               "  -h, --help                 this text\n"
               "Exit status: 0, or 1 when any #wrong > 0, 2 for bad flags, 3 when a call fails.\n", bench_cli::kSweepHelp);
}

}  // namespace

int main(int argc, char** argv) {
  // --bf16-vs-user-op SIZE [--reps K]: its own comparison (above)
  std::size_t bf16_bytes = 0;
  int bf16_reps = 5;
  try {
    for (int i = 1; i + 1 < argc; ++i) {
      if (std::strcmp(argv[i], "--bf16-vs-user-op") == 0) bf16_bytes = bench_cli::parse_size("--bf16-vs-user-op", argv[i + 1]);
      else if (std::strcmp(argv[i], "--reps") == 0) bf16_reps = int(bench_cli::parse_int("--reps", argv[i + 1], 1, 1000));
    }
  } catch (const usage_error& e) {
    std::fprintf(stderr, "mpi-perf: %s\n", e.what());
    return 2;
  }
  if (bf16_bytes > 0) {
#ifdef COLLX_PERF_MPI_TRANSPORT
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    int rank = 0, n = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    unsigned long long wrong = 0;
    try {
      wrong = bf16_vs_user_op(bf16_bytes, bf16_reps, rank, n);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "mpi-perf (rank %d): %s\n", rank, e.what());
      MPI_Abort(MPI_COMM_WORLD, 3);
    }
    MPI_Finalize();
    return wrong > 0 ? 1 : 0;
#else
    std::fprintf(stderr, "mpi-perf: --bf16-vs-user-op: built without collx's transport::mpi\n");
    return 2;
#endif
  }
  // --collx: collx's transport::mpi. --thread-level single|multiple: the level MPI is started
  // with, the same for MPI's collectives and collx's (default single; collx's calls come from
  // this thread only: collx::async's progress thread is what needs multiple, and Open MPI then
  // locks in every call, MPI's own collectives' too)
  bool use_collx = false;
  int level = MPI_THREAD_SINGLE;
  for (int i = 1; i < argc;) {
    int took = 0;
    if (std::strcmp(argv[i], "--collx") == 0) {
      use_collx = true;
      took = 1;
    } else if (std::strcmp(argv[i], "--thread-level") == 0 && i + 1 < argc) {
      if (std::strcmp(argv[i + 1], "multiple") == 0) level = MPI_THREAD_MULTIPLE;
      else if (std::strcmp(argv[i + 1], "single") != 0) {
        std::fprintf(stderr, "mpi-perf: --thread-level takes single or multiple, not '%s'\n", argv[i + 1]);
        return 2;
      }
      took = 2;
    }
    if (took == 0) {
      ++i;
      continue;
    }
    for (int j = i; j + took < argc; ++j) argv[j] = argv[j + took];
    argc -= took;
  }
  int provided = 0;
  MPI_Init_thread(&argc, &argv, level, &provided);
  int rank = 0, n = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  // Every rank parses the same argv, so every rank takes the same branch below.
  config cfg;
  const coll_info* ci = nullptr;
  try {
    cfg = parse(argc, argv, n);
    if (!cfg.help && !(ci = find_coll(cfg.op)))
      throw usage_error("unknown --op '" + cfg.op + "'; choose one of all_reduce|reduce_scatter|all_gather|broadcast|all_to_all");
  } catch (const usage_error& e) {
    if (rank == 0) std::fprintf(stderr, "mpi-perf: %s\n(mpi-perf --help lists the flags)\n", e.what());
    MPI_Finalize();
    return 2;
  }
  if (cfg.help) {
    if (rank == 0) usage(stdout);
    MPI_Finalize();
    return 0;
  }
  unsigned long long wrong = 0;
  try {
    if (use_collx) {
#ifdef COLLX_PERF_MPI_TRANSPORT
      collx_backend be;
      wrong = sweep(be, cfg, *ci, rank, n);
#else
      throw std::runtime_error("--collx: this mpi-perf was built without collx's transport::mpi");
#endif
    } else {
      mpi_backend be;
      wrong = sweep(be, cfg, *ci, rank, n);
    }
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "mpi-perf (rank %d): %s\n", rank, e.what());
    MPI_Abort(MPI_COMM_WORLD, 3);
  }
  MPI_Finalize();
  if (rank == 0 && wrong > 0) {
    std::fprintf(stderr, "mpi-perf: %llu wrong elements\n", wrong);
    return 1;
  }
  return 0;
}
