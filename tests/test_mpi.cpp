// transport::mpi under mpirun (tests/CMakeLists.txt runs it with each of Open MPI's
// point-to-point paths: ob1 over vader, ob1 over tcp, ucx). Every process runs every case; a
// case's ranks are the first n of the world (a communicator of their own, split off
// MPI_COMM_WORLD), and every rank of the case learns every rank's outcome, as launch_processes
// reports a job's (detail::job_failure): the same assertions as over shm and tcp.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <collx/collx.hpp>
#include <collx/transport/mpi.hpp>

#include <signal.h>

#include <cmath>
#include <cstring>
#include <numeric>

#include "matrix.hpp"

namespace algo = collx::algo;
using Catch::Matchers::Contains;

namespace {

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
int world_size() {
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

/// One rank's outcome, as every rank of the case learns it.
struct outcome {
  int failed = 0;
  int code = 0;
  char what[2000] = {};
};

/// The first n ranks of the world run f(comm) over transport::mpi; the others wait. Every process
/// of the world throws the case's failure when any of its ranks failed (launch/processes.hpp,
/// job_failure), as launch_processes throws it.
/// `Nodes`: over transport::two_level<shm, mpi> instead, the world's ranks in nodes of two
/// (COLLX_NODE: ranks 0-1, 2-3, ...; shm within each, mpi across).
template <bool Nodes = false>
struct mpi_ranks_t {
  template <class F>
  void operator()(int n, F&& f, collx::options o = {}) const {
    const int me = world_rank();
    // (made once for each n and never freed, as a program keeps its communicators: collx keeps
    // its duplicate on it, and a failed case's leftovers stay there, never in a reused context)
    static std::vector<MPI_Comm> subs(std::size_t(world_size() + 1), MPI_COMM_NULL);
    static std::vector<bool> made(std::size_t(world_size() + 1), false);
    if (!made[std::size_t(n)]) {
      MPI_Comm_split(MPI_COMM_WORLD, me < n ? 0 : MPI_UNDEFINED, me, &subs[std::size_t(n)]);
      made[std::size_t(n)] = true;
    }
    const MPI_Comm sub = subs[std::size_t(n)];
    outcome mine;
    if (sub != MPI_COMM_NULL) {
      try {
        if constexpr (Nodes) {
          ::setenv("COLLX_NODE", ("node" + std::to_string(me / 2)).c_str(), 1);
          // (no job named: rank 0 draws one, as under MPICH's mpiexec, whose environment names none)
          using two = collx::transport::two_level<collx::transport::shm, collx::transport::mpi>;
          collx::communicator<two> comm{two::connect(collx::transport::mpi(sub)), o};
          f(comm);
        } else {
          collx::communicator<collx::transport::mpi> comm{collx::transport::mpi(sub), o};
          f(comm);
        }
      } catch (const collx::error& e) {
        mine.failed = 1;
        mine.code = e.code().value();
        std::strncpy(mine.what, e.what(), sizeof mine.what - 1);
      } catch (const std::exception& e) {
        mine.failed = 1;
        mine.code = int(collx::errc::peer_lost);
        std::strncpy(mine.what, e.what(), sizeof mine.what - 1);
      }
    }
    // (every process of the world learns the case's outcome, those outside it too)
    std::vector<outcome> all(static_cast<std::size_t>(world_size()));
    MPI_Allgather(&mine, int(sizeof mine), MPI_BYTE, all.data(), int(sizeof mine), MPI_BYTE, MPI_COMM_WORLD);
    std::vector<collx::detail::rank_failure> failures;
    for (int r = 0; r < n; ++r)
      if (all[std::size_t(r)].failed) failures.push_back({r, all[std::size_t(r)].code, all[std::size_t(r)].what});
    if (!failures.empty()) throw collx::detail::job_failure(failures, n);
  }
};

using mpi_ranks = mpi_ranks_t<false>;
using mpi_nodes = mpi_ranks_t<true>;

/// Whether the world has n processes for a case.
bool fits(int n) { return n <= world_size(); }
/// The matrix's rank counts (1, 2, 3, 4, 5, 8) the world has.
std::vector<int> world_ranks() {
  std::vector<int> v;
  for (int n : collx_test::process_ranks())
    if (fits(n)) v.push_back(n);
  return v;
}

}  // namespace


TEMPLATE_TEST_CASE("over mpi: reducing collectives equal the serial reference", "[mpi]", algo::ring, algo::tree,
                   algo::recursive_halving, algo::automatic) {
  collx_test::check_reducing_matrix<mpi_ranks, TestType>(world_ranks());
}

TEMPLATE_TEST_CASE("over mpi: data-moving collectives deliver every block", "[mpi]", algo::ring, algo::tree, algo::recursive_halving,
                   algo::pairwise, algo::automatic) {
  collx_test::check_moving_matrix<mpi_ranks, TestType>(world_ranks());
}

TEST_CASE("over mpi: every dtype and op (half and bfloat16 reduced by collx), and all_to_all_v with uneven blocks", "[mpi]") {
  for (int n : {2, 3, 5, 7})
    if (fits(n)) {
      collx_test::check_dtypes_and_ops<mpi_ranks>(n);
      CHECK(collx_test::run_all_to_all_v<mpi_ranks>(n) == "");
    }
}

TEST_CASE("over mpi: mismatched calls fail with errc::mismatch, both sides named", "[mpi][mismatch]") {
  if (!fits(3)) return;
  collx_test::check_mismatches([](int n, auto f, collx::options o) { mpi_ranks{}(n, f, o); });
}

TEST_CASE("over mpi: send, recv and recv_any, then a split and its own collectives", "[mpi][p2p][split]") {
  const int w = world_size();
  if (w < 2) return;
  mpi_ranks{}(w, [&](auto& comm) {
    const int r = comm.rank(), n = comm.size();
    // every rank but 0 sends its rank, a count of its own (past kInline from rank 2 on); rank 0
    // receives them in turn, last sender first
    auto count_of = [](int q) { return std::size_t(200) + std::size_t(q) * 300; };
    if (r != 0) {
      std::vector<std::int64_t> v(count_of(r), r);
      collx::send(comm, std::span<const std::int64_t>{v}, 0);
    } else {
      for (int q = n - 1; q >= 1; --q) {
        std::vector<std::int64_t> in(count_of(q));
        collx::recv(comm, std::span{in}, q);
        for (std::int64_t x : in)
          if (x != q) throw std::runtime_error("recv: wrong data from rank " + std::to_string(q));
      }
    }
    // recv_any: every rank but 0 sends one int; rank 0 takes them in whatever order they come
    if (r != 0) {
      std::vector<int> one(1, r * 7);
      collx::send(comm, std::span<const int>{one}, 0);
    } else {
      std::vector<int> seen(std::size_t(n), 0);
      for (int k = 1; k < n; ++k) {
        std::vector<int> one(1);
        const int q = collx::recv_any(comm, std::span{one});
        if (one[0] != q * 7) throw std::runtime_error("recv_any: wrong data from rank " + std::to_string(q));
        ++seen[std::size_t(q)];
      }
      for (int q = 1; q < n; ++q)
        if (seen[std::size_t(q)] != 1) throw std::runtime_error("recv_any: rank " + std::to_string(q) + " seen " + std::to_string(seen[std::size_t(q)]) + " times");
    }
    // even and odd ranks: each half its own all_reduce, and the parent's after
    auto half = comm.split(r % 2, r);
    std::vector<double> x(100003, double(r));
    collx::all_reduce(half, std::span{x}, collx::ops::sum{});
    double want = 0;
    for (int q = r % 2; q < n; q += 2) want += q;
    for (double e : x)
      if (e != want) throw std::runtime_error("split: wrong sum");
    std::vector<int> y(7, 1);
    collx::all_reduce(comm, std::span{y}, collx::ops::sum{});
    if (y != std::vector<int>(7, n)) throw std::runtime_error("parent after split: wrong sum");
  });
}

TEST_CASE("over mpi: collx::async calls progress without the caller in MPI, and fused calls are right", "[mpi][async]") {
  const int w = world_size();
  mpi_ranks{}(w, [&](auto& comm) {
    const int n = comm.size();
    std::vector<float> a(70001, 1.0f), b(13, 2.0f);
    auto fa = collx::async::all_reduce(comm, std::span{a}, collx::ops::sum{});
    auto fb = collx::async::all_reduce(comm, std::span{b}, collx::ops::sum{});
    fa.wait();
    fb.wait();
    for (float e : a)
      if (e != float(n)) throw std::runtime_error("async: wrong sum");
    for (float e : b)
      if (e != 2.0f * float(n)) throw std::runtime_error("async: wrong sum (second)");
    std::vector<float> p(5, 1.0f), q(4099, 3.0f);
    collx::fused f(comm);
    f.all_reduce(std::span{p}, collx::ops::sum{});
    f.all_reduce(std::span{q}, collx::ops::sum{});
    f.run();
    for (float e : p)
      if (e != float(n)) throw std::runtime_error("fused: wrong sum");
    for (float e : q)
      if (e != 3.0f * float(n)) throw std::runtime_error("fused: wrong sum (second)");
  });
}

TEST_CASE("over mpi: a rank that fails ends its peers' waits at once with its reason", "[mpi][faults]") {
  const int w = world_size();
  if (w < 2) return;
  collx::options o;
  o.timeout = std::chrono::seconds(60);
  const auto t0 = std::chrono::steady_clock::now();
  try {
    mpi_ranks{}(w, [&](auto& comm) {
      std::vector<float> v(1000, 1.0f);
      if (comm.rank() == w - 1) {
        std::vector<float> wrong(999, 1.0f);  // a mismatch: this rank fails in its first call's check, or a peer does
        collx::all_reduce(comm, std::span{wrong}, collx::ops::sum{}, algo::ring{});
      } else {
        collx::all_reduce(comm, std::span{v}, collx::ops::sum{}, algo::ring{});
      }
    }, o);
    FAIL("no error");
  } catch (const collx::error& e) {
    CHECK(e.code() == collx::errc::mismatch);
    CHECK_THAT(e.what(), Contains("999 x 4 B") && Contains("1000 x 4 B"));
  }
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(20));  // (the deadline: 60 s)
}

TEST_CASE("over mpi: a send waiting on a receiver that failed ends with the receiver's reason, not at the deadline", "[mpi][faults]") {
  // Before: a send MPI still held answered the engine "moved" on every sweep, so the engine never
  // waited: no deadline, no notice looked at, the sender spun for good.
  if (world_size() < 2) return;
  collx::options o;
  o.timeout = std::chrono::seconds(60);
  for (const std::size_t count : {std::size_t(10), std::size_t(1) << 18}) {  // inline, and a payload of its own
    CAPTURE(count);
    const auto t0 = std::chrono::steady_clock::now();
    try {
      mpi_ranks{}(2, [&](auto& comm) {
        std::vector<float> v(count, 1.0f);
        if (comm.rank() == 0) collx::send(comm, std::span<const float>{v}, 1);
        else collx::broadcast(comm, std::span{v}, 7);  // a bad root: this rank fails, and says so
      }, o);
      FAIL("no error");
    } catch (const collx::error& e) {
      CHECK_THAT(e.what(), Contains("root"));
    }
    CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(20));
  }
}

TEST_CASE("over mpi: a call after a failed one fails too, never taking the failed call's data", "[mpi][faults]") {
  // A mismatch on a large message leaves its payload in MPI; a later call of the same sizes on
  // both sides must not take it (before: the transport went on, and its payload count had moved
  // on one side only).
  if (world_size() < 2) return;
  collx::options o;
  o.timeout = std::chrono::seconds(10);
  std::string second;
  try {
    mpi_ranks{}(2, [&](auto& comm) {
      std::vector<float> a(comm.rank() == 0 ? 8192 : 8000, float(comm.rank() + 1));
      try {
        collx::all_reduce(comm, std::span{a}, collx::ops::sum{}, algo::ring{});
      } catch (const collx::error&) {
      }
      std::vector<float> b(8192, 5.0f);
      collx::all_reduce(comm, std::span{b}, collx::ops::sum{}, algo::ring{});
      for (float e : b)
        if (e != 10.0f) throw std::runtime_error("the second call returned the first one's data");
    }, o);
    FAIL("no error");
  } catch (const collx::error& e) {
    second = e.what();
  }
  CHECK_THAT(second, !Contains("first one's data"));
  CHECK_THAT(second, Contains("already failed") || Contains("failed"));
}

TEST_CASE("over mpi: recv_any takes a large message as a small one", "[mpi][p2p]") {
  const int w = world_size();
  if (w < 2) return;
  mpi_ranks{}(w, [&](auto& comm) {
    const int r = comm.rank(), n = comm.size();
    if (r != 0) {
      std::vector<int> v(100003, r);
      collx::send(comm, std::span<const int>{v}, 0);
    } else {
      std::vector<int> seen(std::size_t(n), 0);
      for (int k = 1; k < n; ++k) {
        std::vector<int> in(100003);
        const int q = collx::recv_any(comm, std::span{in});
        for (int x : in)
          if (x != q) throw std::runtime_error("recv_any: wrong data from rank " + std::to_string(q));
        ++seen[std::size_t(q)];
      }
      for (int q = 1; q < n; ++q)
        if (seen[std::size_t(q)] != 1) throw std::runtime_error("recv_any: rank " + std::to_string(q) + " seen " + std::to_string(seen[std::size_t(q)]) + " times");
    }
  });
}

TEST_CASE("over mpi: a peer that never comes is named at the deadline, MPI's receive cancelled", "[mpi][faults]") {
  const int w = world_size();
  if (w < 2) return;
  collx::options o;
  o.timeout = std::chrono::milliseconds(500);
  try {
    mpi_ranks{}(w, [&](auto& comm) {
      std::vector<float> v(10000, 1.0f);
      if (comm.rank() != 1) collx::broadcast(comm, std::span{v}, 1, algo::tree{});
      else std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // late past every deadline, then calls nothing
    }, o);
    FAIL("no error");
  } catch (const collx::error& e) {
    CHECK(e.code() == collx::errc::timeout);
    CHECK_THAT(e.what(), Contains("timed out after") && Contains("waiting for rank"));
  }
}

// Run alone by tests/mpi_killed.cmake (hidden here): rank 1 of the world kills itself in the
// middle of a run of all_reduces. Open MPI 4.1 has no ULFM: mpirun ends the job, and the
// survivors must never have printed a wrong sum before it does.
TEST_CASE("over mpi: a rank killed mid-collective ends the job, no survivor with a wrong sum", "[.killed]") {
  const int w = world_size();
  collx::options o;
  o.timeout = std::chrono::seconds(20);
  mpi_ranks{}(w, [&](auto& comm) {
    const int n = comm.size();
    std::vector<float> v(1 << 18);
    for (int k = 0; k < 1000000; ++k) {
      std::fill(v.begin(), v.end(), float(comm.rank() + k % 7));
      if (comm.rank() == 1 && k == 20) ::raise(SIGKILL);
      collx::all_reduce(comm, std::span{v}, collx::ops::sum{}, algo::ring{});
      const float want = float(n * (n - 1) / 2 + n * (k % 7));
      for (float e : v)
        if (e != want) {
          std::printf("WRONG SUM on rank %d at call %d: %g, not %g\n", comm.rank(), k, double(e), double(want));
          std::fflush(stdout);
          std::_Exit(3);
        }
      if (k % 10 == 0) {
        std::printf("rank %d: %d sums right\n", comm.rank(), k + 1);
        std::fflush(stdout);
      }
    }
  }, o);
}

TEST_CASE("two_level<shm, mpi>: nodes of two ranks, shm within and mpi across: algo::two_level and flat policies", "[mpi][two_level]") {
  for (int n : world_ranks()) {
    CAPTURE(n);
    CHECK(collx_test::run_all_reduce<float, collx::ops::sum, algo::two_level, mpi_nodes>(n, 100003, false) == "");
    CHECK(collx_test::run_all_reduce<std::int32_t, collx::ops::sum, algo::two_level, mpi_nodes>(n, 7, true) == "");
    CHECK(collx_test::run_all_reduce<float, collx::ops::sum, algo::ring, mpi_nodes>(n, 100003, true) == "");
    CHECK(collx_test::run_all_gather<float, algo::recursive_halving, mpi_nodes>(n, 1001) == "");
  }
}

TEST_CASE("over mpi and two_level<shm, mpi>: deterministic's bits are the serial rank-order sum's, compressed<bf16>'s the serial bf16 loop's",
          "[mpi][deterministic][compressed]") {
  // (magnitudes over 2^±10, so the order of addition shows in the low bits)
  auto x = [](int q, std::size_t i) {
    const auto k = std::uint64_t(i) * 2654435761u + std::uint64_t(q) * 40503u;
    return std::ldexp(float(k % 2001) - 1000.0f, int((i + std::size_t(q)) % 21) - 10);
  };
  for (int n : world_ranks()) {
    for (std::size_t count : {std::size_t(1), std::size_t(n + 1), std::size_t(100003)}) {
      CAPTURE(n, count);
      std::vector<float> det(count), bf(count);
      for (std::size_t i = 0; i < count; ++i) {
        float acc = x(0, i), b = 0;
        for (int q = 1; q < n; ++q) acc += x(q, i);
        for (int q = 0; q < n; ++q) b += float(collx::bfloat16(x(q, i)));
        det[i] = acc;
        bf[i] = float(collx::bfloat16(b));
      }
      auto body = [&](auto& comm) {
        auto same = [&](const std::vector<float>& got, const std::vector<float>& want, const char* what) {
          if (std::memcmp(got.data(), want.data(), count * sizeof(float)) != 0)
            throw std::runtime_error(std::string(what) + ": not the serial reference's bits on rank " + std::to_string(comm.rank()));
        };
        std::vector<float> v(count);
        for (std::size_t i = 0; i < count; ++i) v[i] = x(comm.rank(), i);
        std::vector<float> w = v;
        collx::all_reduce(comm, std::span{v}, collx::ops::sum{}, algo::deterministic<>{});
        same(v, det, "deterministic");
        collx::all_reduce(comm, std::span{w}, collx::ops::sum{}, algo::compressed<collx::wire::bf16>{});
        same(w, bf, "compressed<bf16>");
      };
      CHECK_NOTHROW(mpi_ranks{}(n, body));
      CHECK_NOTHROW(mpi_nodes{}(n, body));
    }
  }
}

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  if (provided < MPI_THREAD_MULTIPLE && world_rank() == 0)
    std::fprintf(stderr, "test_mpi: this MPI gives thread level %d, not MPI_THREAD_MULTIPLE\n", provided);
  Catch::Session session;
  int rc = session.applyCommandLine(argc, argv);
  if (rc == 0) rc = session.run();
  // Every process's verdict: the job fails when any does (mpirun reports the first nonzero).
  int worst = rc;
  MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return worst != 0 ? 1 : 0;
}
