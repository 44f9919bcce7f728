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
// The MPI C API only: skip the deprecated C++ bindings (and their -Wcast-function-type noise).
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <cstring>

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

void usage(std::FILE* f) {
  std::fprintf(f,
               "usage: mpirun -np N mpi-perf [flags]   (collx-perf's flags; ranks come from mpirun)\n"
               "  --op COLL                  all_reduce|reduce_scatter|all_gather|broadcast|all_to_all\n"
               "                             (default all_reduce)\n"
               "  -d, --datatype T           float (the only one)\n"
               "  -o, --redop OP             sum (the only one)\n"
               "  -r, --root R               root of broadcast (default 0)\n"
               "  --collx                    collx's collectives over transport::mpi instead of MPI's\n"
               "%s"
               "  -h, --help                 this text\n"
               "Exit status: 0, or 1 when any #wrong > 0, 2 for bad flags, 3 when a call fails.\n", bench_cli::kSweepHelp);
}

}  // namespace

int main(int argc, char** argv) {
  // --collx: collx's transport::mpi (its progress thread may call MPI: thread level multiple)
  bool use_collx = false;
  for (int i = 1; i < argc; ++i)
    if (std::strcmp(argv[i], "--collx") == 0) {
      use_collx = true;
      for (int j = i; j + 1 < argc; ++j) argv[j] = argv[j + 1];
      --argc;
      break;
    }
  int provided = 0;
  MPI_Init_thread(&argc, &argv, use_collx ? MPI_THREAD_MULTIPLE : MPI_THREAD_SINGLE, &provided);
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
