// communicator::split and mesh(): membership, ranks and results of collectives on the new
// communicators, over threads, shared memory and tcp, for rank counts that are not powers of two;
// communicators used at once from two threads of every rank; what their errors name.
#include <catch2/catch.hpp>

#include <collx/collx.hpp>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <numeric>
#include <thread>

#include "harness.hpp"

using namespace collx_test;
using namespace std::chrono_literals;

namespace {

/// The job ranks of the group `color` would form in a split of `n` ranks by (color_of, key_of),
/// in the order of the new ranks: the independent reference for every check below.
template <class C, class K>
std::vector<int> expected_group(int n, int me, C color_of, K key_of) {
  std::vector<int> g;
  for (int r = 0; r < n; ++r)
    if (color_of(r) == color_of(me)) g.push_back(r);
  std::stable_sort(g.begin(), g.end(), [&](int a, int b) { return key_of(a) < key_of(b); });
  return g;
}

/// Checks that `c` holds exactly `want` (job ranks, in order): its size, this rank's place, its
/// map to job ranks, and what an all_gather of the job ranks and an all_reduce return on it.
template <class Comm, class Note>
void check_group(Comm& c, const std::vector<int>& want, int job_rank, const std::string& what, Note note) {
  // Every rank of the communicator runs the same calls whatever it finds, so a wrong group is
  // reported, never a hang.
  const auto at = int(std::find(want.begin(), want.end(), job_rank) - want.begin());
  if (c.size() != int(want.size()) || c.rank() != at)
    note(what + ": size " + std::to_string(c.size()) + " rank " + std::to_string(c.rank()) + ", want size " +
         std::to_string(want.size()) + " rank " + std::to_string(at));
  std::vector<int> map;
  for (int r = 0; r < c.size(); ++r) map.push_back(c.job_rank(r));
  if (map != want) note(what + ": the map to job ranks is not the group in order");
  std::vector<int> mine{job_rank}, all(static_cast<std::size_t>(c.size()));
  collx::all_gather(c, std::span<const int>{mine}, std::span{all});
  if (all != want) note(what + ": all_gather of the job ranks is not the group in order");
  // An all_reduce of an odd count: the sum of (job rank + i) over the group.
  const std::size_t count = 1009;
  std::vector<long> v(count);
  for (std::size_t i = 0; i < count; ++i) v[i] = long(job_rank) * 1000 + long(i);
  collx::all_reduce(c, std::span{v}, collx::ops::sum{});
  long base = 0;
  for (int r : want) base += long(r) * 1000;
  for (std::size_t i = 0; i < count; ++i)
    if (v[i] != base + long(i) * long(want.size())) {
      note(what + ": all_reduce element " + std::to_string(i) + " wrong");
      break;
    }
  // A broadcast from the group's last rank.
  std::vector<int> b(7, job_rank);
  collx::broadcast(c, std::span{b}, c.size() - 1);
  if (b != std::vector<int>(7, want.empty() ? -1 : want.back())) note(what + ": broadcast wrong");
}

int smallest_factor(int n) {
  for (int d = 2; d * d <= n; ++d)
    if (n % d == 0) return d;
  return n;
}

/// Every kind of split on n ranks: a mesh's rows and columns, singletons, reversed keys,
/// opt-outs, three levels of nesting, a child of every rank.
template <class L>
std::string every_split(int n) {
  return run_checked<L>(n, [n](auto& comm, auto note) {
    const int me = comm.rank();
    {  // rows and columns of a d1 x d2 grid (for a prime n: 1 x n and n x 1 both ways)
      const int d1 = smallest_factor(n), d2 = n / d1;
      auto m = collx::mesh(comm, {d1, d2}, {"rows", "cols"});
      // m[0]: ranks differing in coordinate 0 only (same column), m[1]: same row.
      check_group(m[0], expected_group(n, me, [&](int r) { return r % d2; }, [&](int r) { return r / d2; }), me, "mesh dim 0", note);
      check_group(m[1], expected_group(n, me, [&](int r) { return r / d2; }, [&](int r) { return r % d2; }), me, "mesh dim 1", note);
      if (m[1].name() != "rows" && m[1].name() != "cols") note("mesh names lost");
    }
    {  // singletons
      auto s = comm.split(me, 0);
      check_group(s, {me}, me, "singleton", note);
    }
    {  // reversed keys: one group, ranked backwards
      auto rev = comm.split(0, n - me);
      check_group(rev, expected_group(n, me, [](int) { return 0; }, [&](int r) { return n - r; }), me, "reversed", note);
    }
    {  // opt-outs: every third rank joins nothing; the rest split by parity, with equal keys (ties: parent rank)
      auto color = [](int r) { return r % 3 == 0 ? collx::no_color : r % 2; };
      auto c = comm.split(color(me), 7);
      if (color(me) == collx::no_color) {
        if (c.valid() || c.size() != 0) note("an opted-out rank got a communicator");
        try {
          collx::barrier(c);
          note("a call on a null communicator did not fail");
        } catch (const collx::error& e) {
          if (e.code() != collx::errc::invalid_argument) note(std::string("null communicator: ") + e.what());
        }
      } else {
        check_group(c, expected_group(n, me, color, [](int) { return 7; }), me, "opt-out split", note);
      }
    }
    {  // three levels: by parity, then by half of the child's ranks, then by its parity again
      auto c1 = comm.split(me % 2, me);
      const auto g1 = expected_group(n, me, [](int r) { return r % 2; }, [](int r) { return r; });
      check_group(c1, g1, me, "level 1", note);
      const int r1 = c1.rank();
      auto c2 = c1.split(r1 / 2, -r1);
      std::vector<int> g2;  // members of g1 whose place / 2 matches, by descending place
      for (std::size_t i = g1.size(); i-- > 0;)
        if (int(i) / 2 == r1 / 2) g2.push_back(g1[i]);
      check_group(c2, g2, me, "level 2", note);
      auto c3 = c2.split(c2.rank() % 2, c2.rank());
      std::vector<int> g3;
      for (std::size_t i = 0; i < g2.size(); ++i)
        if (int(i) % 2 == c2.rank() % 2) g3.push_back(g2[i]);
      check_group(c3, g3, me, "level 3", note);
    }
    {  // a child holding every rank is the world again, in the same order
      std::vector<int> all(static_cast<std::size_t>(n));
      std::iota(all.begin(), all.end(), 0);
      auto w = comm.split(5, 0);
      check_group(w, all, me, "every rank", note);
    }
  });
}

/// create_group's agreement through files in `dir` (a store any launcher's ranks can reach: here
/// threads and processes alike): each member writes its offer, then reads every member's.
auto agree_through(const std::string& dir, const std::string& id, int at, int size) {
  return [=](const std::array<char, collx::split_offer::kBlob>& mine) {
    const std::string me = dir + "/" + id + "." + std::to_string(at);
    if (std::FILE* f = std::fopen((me + ".tmp").c_str(), "wb")) {
      std::fwrite(mine.data(), 1, mine.size(), f);
      std::fclose(f);
      std::rename((me + ".tmp").c_str(), me.c_str());
    }
    std::vector<std::array<char, collx::split_offer::kBlob>> all(static_cast<std::size_t>(size));
    const auto until = std::chrono::steady_clock::now() + 30s;
    for (int q = 0; q < size; ++q) {
      const std::string path = dir + "/" + id + "." + std::to_string(q);
      for (;;) {
        if (std::FILE* f = std::fopen(path.c_str(), "rb")) {
          const std::size_t got = std::fread(all[std::size_t(q)].data(), 1, collx::split_offer::kBlob, f);
          std::fclose(f);
          if (got == collx::split_offer::kBlob) break;
        }
        if (std::chrono::steady_clock::now() > until) throw std::runtime_error("agree: no offer from member " + std::to_string(q));
        std::this_thread::sleep_for(1ms);
      }
    }
    return all;
  };
}

/// create_group (torch's new_group): the even ranks, listed high to low, and the odd ranks, in
/// order, each made by its members only while the others make theirs; a group of one; then the
/// world still works.
template <class L>
std::string every_create_group(int n) {
  char tmpl[] = "/tmp/collx-create-group-XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  const std::string r = run_checked<L>(n, [&](auto& comm, auto note) {
    const int me = comm.rank();
    std::vector<int> evens, odds;
    for (int q = n - 1; q >= 0; --q)
      if (q % 2 == 0) evens.push_back(q);
    for (int q = 1; q < n; q += 2) odds.push_back(q);
    const auto& mine = me % 2 == 0 ? evens : odds;
    const std::string id = me % 2 == 0 ? "evens" : "odds";
    const int at = int(std::find(mine.begin(), mine.end(), me) - mine.begin());
    auto g = comm.create_group(mine, id, agree_through(dir, id, at, int(mine.size())), id);
    check_group(g, mine, me, "create_group " + id, note);
    if (me == n - 1) {  // a group of one, made by its only member
      auto solo = comm.create_group({me}, "solo", agree_through(dir, "solo", 0, 1));
      check_group(solo, {me}, me, "create_group of one", note);
    }
    std::vector<int> all(static_cast<std::size_t>(n));
    std::iota(all.begin(), all.end(), 0);
    check_group(comm, all, me, "the world after", note);
  });
  std::filesystem::remove_all(dir);
  return r;
}

}  // namespace

TEST_CASE("create_group: a group made by its members only, agreeing through the caller's channel", "[split]") {
  for (int n : {1, 2, 3, 5, 8}) {
    CAPTURE(n);
    CHECK(every_create_group<threads>(n) == "");
    CHECK(every_create_group<processes>(n) == "");
    CHECK(every_create_group<processes_tcp>(n) == "");
  }
}

TEST_CASE("create_group: bad members are an error on the member that passes them", "[split][errors]") {
  failures f(3);
  collx::launch_threads(3, [&](auto& comm) {
    auto never = [](const std::array<char, collx::split_offer::kBlob>&) -> std::vector<std::array<char, collx::split_offer::kBlob>> {
      throw std::logic_error("agree must not be reached");
    };
    auto expect = [&](const std::vector<int>& members, const std::string& want) {
      try {
        comm.create_group(members, "bad", never);
        f.note(comm.rank(), "no error for " + want);
      } catch (const collx::error& e) {
        if (e.code() != collx::errc::invalid_argument || std::string(e.what()).find(want) == std::string::npos)
          f.note(comm.rank(), std::string("wrong error: ") + e.what());
      }
    };
    expect({0, 1, 2, 0}, "listed twice");
    expect({0, 1, 2, 7}, "out of range");
    if (comm.rank() != 2) expect({2}, "is not one of its members");
  });
  CHECK(f.first() == "");
}

TEST_CASE("split: rows and columns of a mesh, singletons, reversed keys, opt-outs, three levels, every rank", "[split]") {
  for (int n : {1, 2, 3, 5, 8, 13}) {
    CAPTURE(n);
    CHECK(every_split<threads>(n) == "");
    CHECK(every_split<processes>(n) == "");
    CHECK(every_split<processes_tcp>(n) == "");
  }
}

TEST_CASE("split over the counting and any decorators", "[split]") {
  failures f(6);
  collx::launch_threads<collx::transport::counting>(6, [&](auto& comm) {
    auto c = comm.split(comm.rank() % 2, comm.rank());
    std::vector<int> v(10, 1);
    c.transport().reset();
    collx::all_reduce(c, std::span{v}, collx::ops::sum{}, collx::algo::ring{});
    if (v[0] != 3) f.note(comm.rank(), "counting: wrong sum");
    if (c.transport().counts().messages_sent == 0) f.note(comm.rank(), "counting: the child's traffic is not counted");
  });
  CHECK(f.first() == "");
  CHECK_NOTHROW(collx::launch_processes<collx::transport::as_any>(5, [&](auto& comm) {
    auto c = comm.split(comm.rank() < 2 ? 0 : 1, 0);
    std::vector<int> v(3, comm.rank());
    collx::all_reduce(c, std::span{v}, collx::ops::max{});
    const int want = comm.rank() < 2 ? 1 : 4;
    if (v[0] != want) throw std::runtime_error("any: wrong max");
    if (std::string(c.transport().kind()) != "shm") throw std::runtime_error("any: child is not shm");
  }));
}

TEST_CASE("a 4 x 3 x 2 mesh: each dimension's communicator holds the ranks that differ in that coordinate only", "[split][mesh]") {
  const std::vector<int> dims{4, 3, 2};
  CHECK(run_checked<threads>(24, [&](auto& comm, auto note) {
          auto m = collx::mesh(comm, dims, {"dp", "pp", "tp"});
          const int me = comm.rank();
          auto coord = [&](int r, int k) {
            int stride = 1;
            for (int j = int(dims.size()) - 1; j > k; --j) stride *= dims[std::size_t(j)];
            return r / stride % dims[std::size_t(k)];
          };
          for (int k = 0; k < 3; ++k) {
            auto others = [&](int r) {
              int c = 0;
              for (int j = 0; j < 3; ++j)
                if (j != k) c = c * 100 + coord(r, j);
              return c;
            };
            check_group(m[std::size_t(k)], expected_group(24, me, others, [&](int r) { return coord(r, k); }), me,
                        "dimension " + std::to_string(k), note);
          }
          if (m[2].name() != "tp" || m[2].size() != 2 || m[0].size() != 4) note("names or sizes wrong");
        }) == "");
  CHECK_THROWS_AS(collx::launch_threads(5, [](auto& comm) { collx::mesh(comm, {2, 2}); }), collx::error);
}

TEST_CASE("communicators used at once from two threads of every rank never mix their messages", "[split][threads]") {
  // Every rank is in a row and a column; one thread runs all_reduces on the row while another
  // runs them on the column, and the job's communicator runs between them from the first.
  auto body = [](auto& comm, auto note) {
    const int n = comm.size(), me = comm.rank();
    const int d2 = n / 2;
    auto row = comm.split(me / d2, me);
    auto col = comm.split(me % d2, me);
    auto worker = [&](auto& c, int salt, std::string& problem) {
      try {
        for (int it = 0; it < 40; ++it) {
          const std::size_t count = std::size_t(1 + (it * 37 + salt) % 3000);
          std::vector<long> v(count);
          for (std::size_t i = 0; i < count; ++i) v[i] = long(c.job_rank(c.rank())) * (salt + 1) + long(i) + it;
          collx::all_reduce(c, std::span{v}, collx::ops::sum{});
          long base = 0;
          for (int r = 0; r < c.size(); ++r) base += long(c.job_rank(r)) * (salt + 1);
          for (std::size_t i = 0; i < count; ++i)
            if (v[i] != base + (long(i) + it) * c.size()) {
              problem = "iteration " + std::to_string(it) + " element " + std::to_string(i) + " wrong";
              return;
            }
        }
      } catch (const std::exception& e) {
        problem = e.what();
      }
    };
    std::string p1, p2;
    std::thread t([&] { worker(col, 7, p2); });
    worker(row, 3, p1);
    t.join();
    note(p1);
    note(p2);
    std::vector<int> v{me};
    collx::all_reduce(comm, std::span{v}, collx::ops::sum{});
    if (v[0] != n * (n - 1) / 2) note("the job's communicator after: wrong");
  };
  CHECK(run_checked<threads>(6, body) == "");
  CHECK(run_checked<processes>(6, body) == "");
  CHECK(run_checked<processes_tcp>(4, body) == "");
}

TEST_CASE("errors on a split communicator name it and both ranks: the child's and the job's", "[split][errors]") {
  collx::options o;
  o.timeout = 300ms;
  std::string msg;
  std::mutex mu;
  try {
    collx::launch_threads(4, [&](auto& comm) {
      auto pair = comm.split(comm.rank() / 2, comm.rank(), "pairs");
      std::vector<int> v(4, 1);
      if (comm.rank() == 3) {  // pair 1's rank 1 skips the call
        std::this_thread::sleep_for(600ms);
        return;
      }
      try {
        collx::all_reduce(pair, std::span{v}, collx::ops::sum{});
      } catch (const collx::error& e) {
        if (comm.rank() == 2) {
          std::lock_guard lk(mu);
          msg = e.what();
        }
        throw;
      }
    }, o);
  } catch (const collx::error&) {
  }
  CAPTURE(msg);
  CHECK(msg.find("on communicator pairs") != std::string::npos);
  CHECK(msg.find("rank 0 (job rank 2)") != std::string::npos);
  CHECK(msg.find("waiting for rank 1 (job rank 3)") != std::string::npos);
  CHECK(collx::call_info::waited_for(msg) == 3);

  // A color that is neither >= 0 nor no_color fails on every rank, naming the rank.
  std::vector<std::string> errs(3);
  collx::launch_threads(3, [&](auto& comm) {
    try {
      comm.split(comm.rank() == 1 ? -5 : 0, 0);
    } catch (const collx::error& e) {
      if (e.code() == collx::errc::invalid_argument) errs[std::size_t(comm.rank())] = e.what();
    }
  });
  for (const auto& e : errs) {
    CAPTURE(e);
    CHECK(e.find("rank 1 passed color -5") != std::string::npos);
  }
}

TEST_CASE("a rank that destroys a communicator has left it: its peers in it learn so at once", "[split][errors]") {
  // Rank 1 drops its child at once; rank 0's all_reduce on the child must end with peer_lost
  // naming it, long before the 20 s deadline, over every transport (the thread transport's
  // child used to stay live until the deadline).
  collx::options o;
  o.timeout = 20s;
  auto body = [](auto& comm) {
    auto child = comm.split(0, comm.rank(), "left-early");
    if (comm.rank() == 1) {
      { auto gone = std::move(child); }
      collx::barrier(comm);  // alive in the job, gone from the child, until rank 0 has seen it
      return;
    }
    std::vector<int> v(8, 1);
    const auto t0 = std::chrono::steady_clock::now();
    try {
      collx::all_reduce(child, std::span{v}, collx::ops::sum{});
    } catch (const collx::error& e) {
      const std::string what = e.what();
      const bool ok = e.code() == collx::errc::peer_lost && what.find("rank 1 (job rank 1)") != std::string::npos &&
                      what.find("left") != std::string::npos && std::chrono::steady_clock::now() - t0 < 10s;
      if (!ok) throw std::runtime_error("rank 0 got: " + what);
      collx::barrier(comm);
      return;
    }
    throw std::runtime_error("rank 0's all_reduce on a communicator rank 1 had destroyed returned");
  };
  auto outcome = [](auto&& launch) {
    try {
      launch();
      return std::string();
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
  };
  CHECK(outcome([&] { collx::launch_threads(2, body, o); }) == "");
  CHECK(outcome([&] { collx::launch_processes(2, body, o); }) == "");
  CHECK(outcome([&] { collx::launch_processes(2, body, o, collx::transport::tcp_config{}); }) == "");
}
