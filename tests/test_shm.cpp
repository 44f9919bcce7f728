// transport::shm: the core's test matrix over real processes, and what only processes can show:
// jobs that must not mix, a rank killed mid-collective, /dev/shm left clean, launch from the
// environment.
#include <catch2/catch.hpp>

#include <dirent.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <numeric>
#include <thread>

#include "harness.hpp"
#include "matrix.hpp"
#include "stress.hpp"

using namespace collx_test;
using namespace std::chrono_literals;
using Catch::Matchers::Contains;
namespace algo = collx::algo;

namespace {

/// Names in /dev/shm of collx jobs started by this test process (launch_processes names its
/// jobs lp<pid>-...; the tests below put the pid in theirs). Other test processes running at
/// the same time have jobs of their own, which come and go.
std::vector<std::string> collx_segments() {
  std::vector<std::string> v;
  const std::string pid = std::to_string(getpid());
  if (DIR* d = opendir("/dev/shm")) {
    while (dirent* e = readdir(d)) {
      const std::string name = e->d_name;
      if (name.rfind("collx-", 0) == 0 && name.find(pid) != std::string::npos) v.push_back(name);
    }
    closedir(d);
  }
  return v;
}
}  // namespace

TEMPLATE_TEST_CASE("over shm: reducing collectives equal the serial reference", "[shm]", algo::ring, algo::tree,
                   algo::recursive_halving, algo::automatic) {
  check_reducing_matrix<processes, TestType>();
}

TEMPLATE_TEST_CASE("over shm: data-moving collectives deliver every block", "[shm]", algo::ring, algo::tree,
                   algo::recursive_halving, algo::pairwise, algo::automatic) {
  check_moving_matrix<processes, TestType>();
}

TEMPLATE_TEST_CASE("over shm: single copy (forced from 1 KiB) delivers the same data", "[shm][single_copy]", algo::ring,
                   algo::tree, algo::recursive_halving) {
  // process_vm_readv may be forbidden (a seccomp profile, Yama ptrace_scope 3): then shm runs
  // without single copy, and this test has nothing to check.
  try {
    collx::transport::shm::config c;
    c.single_copy_from(1024);
    collx::launch_processes(2, [&](auto& comm) {
      if (!comm.transport().single_copy()) throw std::runtime_error("process_vm_readv is not permitted here");
    }, collx::options{}, c);
  } catch (const collx::error& e) {
    WARN("single copy unavailable, skipped: " << e.what());
    return;
  }
  for (int n : {2, 3, 5, 8})
    for (std::size_t count : {std::size_t(n + 1), std::size_t(100003), std::size_t(1) << 20}) {
      CAPTURE(n, count);
      CHECK(run_all_gather<float, TestType, processes_single_copy>(n, count / std::size_t(n) + 1) == "");
      CHECK(run_broadcast<std::int32_t, TestType, processes_single_copy>(n, count, n - 1) == "");
      CHECK(run_all_reduce<float, collx::ops::sum, TestType, processes_single_copy>(n, count, false) == "");
    }
}

TEST_CASE("over shm: every dtype and op", "[shm]") {
  for (int n : {3, 8}) check_dtypes_and_ops<processes>(n);
}

TEST_CASE("over shm: all_to_all_v with uneven blocks", "[shm]") {
  for (int n : process_ranks()) {
    CAPTURE(n);
    CHECK(run_all_to_all_v<processes>(n) == "");
  }
}

/// Processes whose pools hold one data slot and no single copy: a step that sends to several
/// peers at once runs its pools dry, and its sends go on in small buffers and lines (the
/// trickle: shm/channel.hpp, stalled) while the slot's chunk waits for its receiver.
struct processes_one_slot {
  template <class F>
  void operator()(int n, F&& f) const {
    collx::transport::shm::config cfg;
    cfg.slots = 1;
    cfg.single_copy_from(~std::size_t(0));
    collx::launch_processes(n, std::forward<F>(f), collx::options{}, cfg);
  }
};

TEST_CASE("over shm: one data slot per rank: sends to several peers at once go on in smaller buffers", "[shm][trickle]") {
  for (int n : {3, 5}) {
    CAPTURE(n);
    CHECK(run_all_to_all_v<processes_one_slot>(n) == "");
    CHECK(run_all_reduce<float, collx::ops::sum, algo::tree, processes_one_slot>(n, 100003, false) == "");
    CHECK(run_all_gather<float, algo::pairwise, processes_one_slot>(n, 20011) == "");
  }
}

TEST_CASE("over shm: two jobs at once never mix", "[shm]") {
  // Each job has its own launching process: fork() while a second thread runs gives the child the
  // locks that thread held (under ASan its allocator's: clang 14's runtime takes no lock around
  // fork), and a rank forked so hung in its first malloc (CI saw it: this test, 900 s).
  int p[2];
  REQUIRE(pipe(p) == 0);
  std::fflush(nullptr);
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    close(p[0]);
    std::string a;
    try {
      a = run_all_reduce<float, collx::ops::sum, algo::ring, processes>(4, 100003, false);
    } catch (const std::exception& e) {
      a = std::string("exception: ") + e.what();
    }
    if (a.empty()) a = "ok";
    (void)!write(p[1], a.data(), a.size());
    _exit(0);
  }
  close(p[1]);
  const std::string b = run_all_reduce<std::int32_t, collx::ops::sum, algo::tree, processes>(3, 100003, false);
  std::string a;
  char buf[4096];
  for (ssize_t k; (k = read(p[0], buf, sizeof buf)) > 0;) a.append(buf, std::size_t(k));
  close(p[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  CHECK(WIFEXITED(status));
  CHECK(a == "ok");
  CHECK(b == "");
}

TEST_CASE("over shm: a rank killed mid-collective is reported by every other rank within seconds", "[shm][faults]") {
  REQUIRE(collx_segments().empty());
  const auto t0 = std::chrono::steady_clock::now();
  try {
    collx::options o;
    o.timeout = 60s;  // detection must not wait for the timeout
    collx::launch_processes(4, [](auto& comm) {
      std::vector<float> v(1 << 20, 1.0f);
      collx::all_reduce(comm, std::span{v}, collx::ops::sum{}, algo::ring{});
      if (comm.rank() == 2) raise(SIGKILL);
      collx::all_reduce(comm, std::span{v}, collx::ops::sum{}, algo::ring{});
    }, o);
    FAIL("no error");
  } catch (const collx::error& e) {
    CHECK(e.code() == collx::errc::peer_lost);
    CHECK_THAT(e.what(), Contains("rank 2") && Contains("signal 9"));
    CHECK_THAT(e.what(), Contains("4 ranks failed"));  // the three others failed too, not hung
  }
  CHECK(std::chrono::steady_clock::now() - t0 < 10s);
  CHECK(collx_segments().empty());  // nothing of the job is left in /dev/shm
}

TEST_CASE("over shm: a rank killed before everyone attached leaves /dev/shm clean", "[shm][faults]") {
  REQUIRE(collx_segments().empty());
  collx::options o;
  o.timeout = 1s;
  collx::transport::shm::config cfg;
  cfg.attach_timeout = 1s;
  // rank 1 dies at once: the others time out attaching, naming it
  try {
    const std::string job = "early-death-" + std::to_string(getpid());
    std::vector<pid_t> kids;
    for (int r = 0; r < 3; ++r) {
      const pid_t p = fork();
      if (p == 0) {
        if (r == 1) _exit(3);
        try {
          collx::transport::shm t(job, r, 3, cfg);
          _exit(0);
        } catch (const collx::error& e) {
          _exit(e.code() == collx::errc::timeout && std::string(e.what()).find("rank(s) 1") != std::string::npos ? 42 : 1);
        }
      }
      kids.push_back(p);
    }
    int n42 = 0;
    for (pid_t p : kids) {
      int st = 0;
      waitpid(p, &st, 0);
      n42 += WIFEXITED(st) && WEXITSTATUS(st) == 42;
    }
    CHECK(n42 == 2);
  } catch (...) {
    FAIL("unexpected exception");
  }
  CHECK(collx_segments().empty());
}

TEST_CASE("over shm: mismatched calls fail with errc::mismatch", "[shm][mismatch]") {
  check_mismatches([](int n, auto f, const collx::options& o) { collx::launch_processes(n, f, o); });
}

TEST_CASE("shm::from_env reads torchrun's, mpirun's, srun's and PMI's variables", "[shm][env]") {
  struct conv { const char *rank, *size, *job_var, *job_val; };
  const conv convs[] = {{"RANK", "WORLD_SIZE", "TORCHELASTIC_RUN_ID", "t1"},
                        {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "PMIX_NAMESPACE", "ns1"},
                        {"SLURM_PROCID", "SLURM_NTASKS", "SLURM_JOB_ID", "77"},
                        {"PMI_RANK", "PMI_SIZE", "PMI_KVSNAME", "kvs1"}};
  for (const conv& c : convs) {
    CAPTURE(c.rank);
    const int n = 3;
    std::vector<pid_t> kids;
    const std::string job = std::string(c.job_val) + "-" + std::to_string(getpid());
    for (int r = 0; r < n; ++r) {
      const pid_t p = fork();
      if (p == 0) {
        setenv(c.rank, std::to_string(r).c_str(), 1);
        setenv(c.size, std::to_string(n).c_str(), 1);
        setenv(c.job_var, job.c_str(), 1);
        int code = 1;
        try {
          collx::communicator<collx::transport::shm> comm{collx::transport::shm::from_env()};
          std::vector<int> v(1000, comm.rank());
          collx::all_reduce(comm, std::span{v}, collx::ops::sum{});
          code = (v[999] == 3 && comm.size() == n && comm.rank() == r) ? 0 : 2;
        } catch (...) {
          code = 3;
        }
        _exit(code);
      }
      kids.push_back(p);
    }
    for (pid_t p : kids) {
      int st = 0;
      waitpid(p, &st, 0);
      CHECK((WIFEXITED(st) && WEXITSTATUS(st) == 0));
    }
  }
  // No launcher at all: a clear error, not a guess.
  CHECK_THROWS_WITH(collx::launch_info_from_env(), Contains("no launcher found"));
}

TEST_CASE("over shm: hundreds of back-to-back collectives, large among small, stay correct", "[shm][stress]") {
  for (int n : {2, 5, 8}) {
    CAPTURE(n);
    CHECK(collx_test::stress<processes>(n, 150) == "");
  }
}
