// transport::tcp: the core's test matrix over real processes and loopback sockets, and what
// only sockets can show: rendezvous through both stores, strangers refused, garbage on the wire,
// a peer killed, reset, stopped mid-message or late.
#include <catch2/catch.hpp>

#include <dirent.h>
#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <numeric>
#include <thread>

#include "harness.hpp"

using namespace collx_test;
using namespace std::chrono_literals;
using Catch::Matchers::Contains;
namespace algo = collx::algo;
namespace net = collx::transport::net;

namespace {
const std::vector<int>& tcp_ranks() {
  static const std::vector<int> v{1, 2, 3, 4, 5, 8};
  return v;
}
}  // namespace

TEMPLATE_TEST_CASE("over tcp: reducing collectives equal the serial reference", "[tcp]", algo::ring, algo::tree,
                   algo::recursive_halving, algo::automatic) {
  for (int n : tcp_ranks())
    for (std::size_t count : counts_for(n)) {
      CAPTURE(n, count);
      const std::size_t k = count / std::size_t(n) + (count % 2);
      CHECK(run_all_reduce<float, collx::ops::sum, TestType, processes_tcp>(n, count, false) == "");
      CHECK(run_all_reduce<std::int32_t, collx::ops::sum, TestType, processes_tcp>(n, count, true) == "");
      CHECK(run_reduce_scatter<float, collx::ops::sum, TestType, processes_tcp>(n, k) == "");
      CHECK(run_reduce<std::int32_t, collx::ops::sum, TestType, processes_tcp>(n, count, n - 1) == "");
    }
}

TEMPLATE_TEST_CASE("over tcp: data-moving collectives deliver every block", "[tcp]", algo::ring, algo::tree,
                   algo::recursive_halving, algo::automatic) {
  for (int n : tcp_ranks())
    for (std::size_t count : counts_for(n)) {
      CAPTURE(n, count);
      const std::size_t k = count / std::size_t(n) + (count % 2);
      CHECK(run_all_gather<float, TestType, processes_tcp>(n, k) == "");
      CHECK(run_broadcast<std::int32_t, TestType, processes_tcp>(n, count, n / 2) == "");
    }
}

TEST_CASE("over tcp: every dtype and op, and all_to_all_v with uneven blocks", "[tcp]") {
  for (int n : {3, 5}) {
    CAPTURE(n);
    CHECK(run_all_reduce<std::int8_t, collx::ops::sum, algo::ring, processes_tcp>(n, 1001, false) == "");
    CHECK(run_all_reduce<double, collx::ops::sum, algo::recursive_halving, processes_tcp>(n, 100003, true) == "");
    CHECK(run_all_reduce<collx::half, collx::ops::sum, algo::ring, processes_tcp>(n, 100003, false) == "");
    CHECK(run_all_reduce<collx::bfloat16, collx::ops::avg, algo::tree, processes_tcp>(n, 100003, false) == "");
    CHECK(run_all_reduce<float, collx::ops::min, algo::tree, processes_tcp>(n, 1001, false) == "");
    CHECK(run_all_reduce<std::int32_t, collx::ops::bxor, algo::ring, processes_tcp>(n, 1001, false) == "");
    CHECK(run_checked<processes_tcp>(n, [n](auto& comm, auto note) {
            const int r = comm.rank();
            std::vector<std::size_t> sc(static_cast<std::size_t>(n)), rc(static_cast<std::size_t>(n));
            for (int j = 0; j < n; ++j) {
              sc[std::size_t(j)] = std::size_t((r * 7 + j * 3) % 5) * 20011;
              rc[std::size_t(j)] = std::size_t((j * 7 + r * 3) % 5) * 20011;
            }
            std::vector<std::int64_t> in(std::accumulate(sc.begin(), sc.end(), std::size_t(0)));
            std::vector<std::int64_t> out(std::accumulate(rc.begin(), rc.end(), std::size_t(0))), want(out.size());
            std::size_t o = 0;
            for (int j = 0; j < n; ++j)
              for (std::size_t i = 0; i < sc[std::size_t(j)]; ++i) in[o++] = r * 1000000 + j * 10000 + std::int64_t(i);
            o = 0;
            for (int j = 0; j < n; ++j)
              for (std::size_t i = 0; i < rc[std::size_t(j)]; ++i) want[o++] = j * 1000000 + r * 10000 + std::int64_t(i);
            collx::all_to_all_v(comm, std::span<const std::int64_t>{in}, std::span<const std::size_t>{sc}, std::span{out},
                                std::span<const std::size_t>{rc});
            note(compare(out, want));
          }) == "");
  }
}

namespace {
/// Open file descriptors of this process (sockets included).
int open_fds() {
  int n = 0;
  if (DIR* d = opendir("/proc/self/fd")) {
    while (dirent* e = readdir(d)) n += e->d_name[0] != '.';
    closedir(d);
  }
  return n;
}

/// A scratch directory for a file store, removed at the end of the scope.
struct temp_dir {
  std::string path;
  temp_dir() {
    char t[] = "/tmp/collx-test-XXXXXX";
    path = mkdtemp(t);
  }
  ~temp_dir() { std::filesystem::remove_all(path); }
};

/// Runs rank r of an n-rank job on a thread of this process per rank, through a file store in
/// `dir`; body(comm) runs on each. Returns each rank's error message ("" when it succeeded).
template <class Body>
std::vector<std::string> run_threads_tcp(int n, const std::string& dir, collx::transport::tcp_config cfg, collx::options o,
                                         Body body) {
  std::vector<std::string> err(static_cast<std::size_t>(n));
  std::vector<std::thread> ts;
  cfg.store_path = dir;
  for (int r = 0; r < n; ++r)
    ts.emplace_back([&, r] {
      try {
        collx::communicator<collx::transport::tcp> comm{collx::transport::tcp("threads-job", r, n, cfg), o};
        try {
          body(comm);
        } catch (const std::exception& e) {
          comm.transport().abort(e.what());
          throw;
        }
      } catch (const std::exception& e) {
        err[std::size_t(r)] = e.what();
      }
    });
  for (auto& t : ts) t.join();
  return err;
}
}  // namespace

TEST_CASE("over tcp: a file store works as the rendezvous, and every socket is closed afterwards", "[tcp]") {
  const int before = open_fds();
  {
    temp_dir d;
    collx::options o;
    o.timeout = 20s;
    auto err = run_threads_tcp(3, d.path, {}, o, [](auto& comm) {
      std::vector<int> v(1000, comm.rank() + 1);
      collx::all_reduce(comm, std::span{v}, collx::ops::sum{});
      if (v[999] != 6) throw std::runtime_error("wrong sum");
    });
    for (auto& e : err) CHECK(e == "");
    // A failing job (mismatched counts) releases its sockets as well.
    err = run_threads_tcp(3, d.path + "/second", {}, o, [](auto& comm) {
      std::vector<int> v(comm.rank() == 1 ? 7 : 5, 1);
      collx::all_reduce(comm, std::span{v}, collx::ops::sum{}, algo::ring{});
    });
    CHECK_THAT(err[0] + err[1] + err[2], Contains("7 x 4 B") && Contains("5 x 4 B"));
  }
  CHECK(open_fds() == before);
}

TEST_CASE("over tcp: rendezvous names the ranks that did not show up", "[tcp][faults]") {
  temp_dir d;
  collx::transport::tcp_config cfg;
  cfg.rendezvous_timeout = 1s;
  cfg.store_path = d.path;
  // Ranks 0 and 1 of 3 come; rank 2 never does.
  std::vector<std::string> err(2);
  std::vector<std::thread> ts;
  for (int r = 0; r < 2; ++r)
    ts.emplace_back([&, r] {
      try {
        collx::transport::tcp t("absent", r, 3, cfg);
      } catch (const collx::error& e) {
        err[std::size_t(r)] = std::to_string(int(e.code().value())) + " " + e.what();
      }
    });
  for (auto& t : ts) t.join();
  for (auto& e : err) {
    CHECK_THAT(e, Contains("rank(s) 2"));
    CHECK_THAT(e, Contains("timed out"));
  }
}

TEST_CASE("over tcp: mismatched calls fail with errc::mismatch", "[tcp][mismatch]") {
  try {
    collx::options o;
    o.timeout = 10s;
    collx::launch_processes(3, [](auto& comm) {
      std::vector<float> v(comm.rank() == 1 ? 12 : 10, 1.0f);
      collx::all_reduce(comm, std::span{v}, collx::ops::sum{}, algo::ring{});
    }, o, collx::transport::tcp_config{});
    FAIL("no error");
  } catch (const collx::error& e) {
    CHECK(e.code() == collx::errc::mismatch);
    CHECK_THAT(e.what(), Contains("12 x 4 B") && Contains("10 x 4 B"));
  }
}

TEST_CASE("over tcp: a rank killed mid-collective is reported by every other rank within seconds", "[tcp][faults]") {
  const auto t0 = std::chrono::steady_clock::now();
  try {
    collx::options o;
    o.timeout = 60s;  // detection must not wait for the timeout
    collx::launch_processes(4, [](auto& comm) {
      std::vector<float> v(1 << 22, 1.0f);
      collx::all_reduce(comm, std::span{v}, collx::ops::sum{}, algo::ring{});
      if (comm.rank() == 2) {  // die in the middle of the next one
        std::thread([] {
          std::this_thread::sleep_for(5ms);
          raise(SIGKILL);
        }).detach();
      }
      for (int i = 0; i < 100; ++i) collx::all_reduce(comm, std::span{v}, collx::ops::sum{}, algo::ring{});
    }, o, collx::transport::tcp_config{});
    FAIL("no error");
  } catch (const collx::error& e) {
    CHECK(e.code() == collx::errc::peer_lost);
    CHECK_THAT(e.what(), Contains("rank 2") && Contains("signal 9"));
    CHECK_THAT(e.what(), Contains("4 ranks failed"));
  }
  CHECK(std::chrono::steady_clock::now() - t0 < 10s);
}

TEST_CASE("over tcp: a reset connection is reported as the loss of that rank", "[tcp][faults]") {
  try {
    collx::options o;
    o.timeout = 60s;
    collx::launch_processes(3, [](auto& comm) {
      std::vector<float> v(1000, 1.0f);
      collx::all_reduce(comm, std::span{v}, collx::ops::sum{}, algo::ring{});
      if (comm.rank() == 1) {
        // Abort every connection with a reset (SO_LINGER 0), then stay alive.
        for (int f = 3; f < 1024; ++f) {
          int type = 0;
          socklen_t len = sizeof type;
          if (getsockopt(f, SOL_SOCKET, SO_TYPE, &type, &len) != 0 || type != SOCK_STREAM) continue;
          linger l{1, 0};
          setsockopt(f, SOL_SOCKET, SO_LINGER, &l, sizeof l);
          close(f);
        }
        std::this_thread::sleep_for(3s);
        return;
      }
      collx::all_reduce(comm, std::span{v}, collx::ops::sum{}, algo::ring{});
    }, o, collx::transport::tcp_config{});
    FAIL("no error");
  } catch (const collx::error& e) {
    CHECK(e.code() == collx::errc::peer_lost);
    CHECK_THAT(e.what(), Contains("lost rank 1"));
  }
}

TEST_CASE("over tcp: a rank stopped mid-message, or late, runs its peers into their deadline, naming it", "[tcp][faults]") {
  collx::options o;
  o.timeout = 2s;
  SECTION("stopped (SIGSTOP) in the middle of a 64 MiB all-reduce") {
    try {
      collx::launch_processes(3, [](auto& comm) {
        if (comm.rank() == 1) {
          if (fork() == 0) {  // a watchdog that ends the stopped rank after its peers gave up
            std::this_thread::sleep_for(6s);
            kill(getppid(), SIGKILL);
            _exit(0);
          }
          std::thread([] {
            std::this_thread::sleep_for(20ms);
            raise(SIGSTOP);
          }).detach();
        }
        std::vector<float> v(1 << 24, 1.0f);
        for (int i = 0; i < 50; ++i) collx::all_reduce(comm, std::span{v}, collx::ops::sum{}, algo::ring{});
      }, o, collx::transport::tcp_config{});
      FAIL("no error");
    } catch (const collx::error& e) {
      CHECK(e.code() == collx::errc::timeout);
      CHECK_THAT(e.what(), Contains("waiting for rank 1"));
    }
  }
  SECTION("a straggler") {
    try {
      collx::launch_processes(3, [](auto& comm) {
        if (comm.rank() == 2) std::this_thread::sleep_for(4s);
        std::vector<float> v(1000, 1.0f);
        collx::all_reduce(comm, std::span{v}, collx::ops::sum{}, algo::ring{});
      }, o, collx::transport::tcp_config{});
      FAIL("no error");
    } catch (const collx::error& e) {
      CHECK(e.code() == collx::errc::timeout);
      CHECK_THAT(e.what(), Contains("waiting for rank 2"));
    }
  }
}
