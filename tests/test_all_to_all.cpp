// all_to_all, all_to_all_v, gather, scatter, barrier, send/recv.
#include <catch2/catch.hpp>

#include <numeric>

#include "harness.hpp"

using namespace collx_test;

namespace {
/// The value rank `from` sends to rank `to` at position i of that block.
std::int64_t a2a_value(int from, int to, std::size_t i) { return std::int64_t(from) * 1'000'000 + to * 10'000 + std::int64_t(i); }

/// Uneven per-pair counts, some of them zero, as MoE token dispatch produces.
std::size_t a2a_count(int from, int to, std::size_t scale) { return (std::size_t(from * 7 + to * 3) % 5) * scale + (from == to ? 1 : 0); }
}  // namespace

TEMPLATE_TEST_CASE("all_to_all transposes blocks", "[all_to_all]", collx::algo::pairwise, collx::algo::automatic) {
  for (int n : rank_counts())
    for (std::size_t count : counts_for(n)) {
      const std::size_t k = count / std::size_t(n) + (count % 2);
      CAPTURE(n, k);
      failures f(n);
      collx::launch_threads(n, [&](auto& comm) {
        const int r = comm.rank();
        std::vector<std::int64_t> in(k * std::size_t(n)), out(in.size()), want(in.size());
        for (int j = 0; j < n; ++j)
          for (std::size_t i = 0; i < k; ++i) {
            in[std::size_t(j) * k + i] = a2a_value(r, j, i);
            want[std::size_t(j) * k + i] = a2a_value(j, r, i);
          }
        collx::all_to_all(comm, std::span<const std::int64_t>{in}, std::span{out}, TestType{});
        f.note(r, compare(out, want));
      });
      CHECK(f.first() == "");
    }
}

TEST_CASE("all_to_all_v moves uneven blocks, empty ones included", "[all_to_all]") {
  for (int n : rank_counts())
    for (std::size_t scale : {std::size_t(0), std::size_t(1), std::size_t(1009)}) {
      CAPTURE(n, scale);
      failures f(n);
      collx::launch_threads(n, [&](auto& comm) {
        const int r = comm.rank();
        std::vector<std::size_t> sc(static_cast<std::size_t>(n)), rc(static_cast<std::size_t>(n));
        for (int j = 0; j < n; ++j) {
          sc[std::size_t(j)] = a2a_count(r, j, scale);
          rc[std::size_t(j)] = a2a_count(j, r, scale);
        }
        std::vector<std::int64_t> in(std::accumulate(sc.begin(), sc.end(), std::size_t(0)));
        std::vector<std::int64_t> out(std::accumulate(rc.begin(), rc.end(), std::size_t(0))), want(out.size());
        std::size_t o = 0;
        for (int j = 0; j < n; ++j)
          for (std::size_t i = 0; i < sc[std::size_t(j)]; ++i) in[o++] = a2a_value(r, j, i);
        o = 0;
        for (int j = 0; j < n; ++j)
          for (std::size_t i = 0; i < rc[std::size_t(j)]; ++i) want[o++] = a2a_value(j, r, i);
        collx::all_to_all_v(comm, std::span<const std::int64_t>{in}, std::span<const std::size_t>{sc}, std::span{out},
                            std::span<const std::size_t>{rc});
        f.note(r, compare(out, want));
      });
      CHECK(f.first() == "");
    }
}

TEST_CASE("gather and scatter move each block to and from the root", "[gather][scatter]") {
  for (int n : rank_counts())
    for (std::size_t k : {std::size_t(0), std::size_t(1), std::size_t(n + 1), std::size_t(10007)})
      for (int root : {0, n - 1}) {
        CAPTURE(n, k, root);
        failures f(n);
        collx::launch_threads(n, [&](auto& comm) {
          const int r = comm.rank();
          std::vector<double> mine(k), all(r == root ? k * std::size_t(n) : 0), want(k * std::size_t(n));
          for (std::size_t i = 0; i < k; ++i) mine[i] = payload<double>(r, i);
          for (int j = 0; j < n; ++j)
            for (std::size_t i = 0; i < k; ++i) want[std::size_t(j) * k + i] = payload<double>(j, i);
          collx::gather(comm, std::span<const double>{mine}, std::span{all}, root);
          if (r == root) f.note(r, "gather: " + compare(all, want));
          std::vector<double> back(k);
          collx::scatter(comm, std::span<const double>{all}, std::span{back}, root);
          f.note(r, "scatter: " + compare(back, mine));
        });
        for (auto& s : f.notes)
          if (s == "gather: " || s == "scatter: ") s.clear();
        CHECK(f.first() == "");
      }
}

TEST_CASE("barrier: no rank leaves before every rank has arrived", "[barrier]") {
  for (int n : rank_counts()) {
    CAPTURE(n);
    std::atomic<int> arrived{0};
    failures f(n);
    collx::launch_threads(n, [&](auto& comm) {
      for (int round = 1; round <= 3; ++round) {
        if (comm.rank() == round % comm.size()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
        arrived.fetch_add(1);
        collx::barrier(comm);
        if (arrived.load() < round * comm.size()) f.note(comm.rank(), "left barrier " + std::to_string(round) + " early");
        collx::barrier(comm);
      }
    });
    CHECK(f.first() == "");
  }
}

TEST_CASE("send and recv carry a pipeline's activations rank to rank", "[p2p]") {
  for (int n : {2, 3, 5}) {
    CAPTURE(n);
    failures f(n);
    collx::launch_threads(n, [&](auto& comm) {
      const int r = comm.rank();
      std::vector<float> x(1001);
      if (r == 0) {
        for (std::size_t i = 0; i < x.size(); ++i) x[i] = float(i);
      } else {
        collx::recv(comm, std::span{x}, r - 1);
      }
      for (auto& v : x) v += 1.0f;  // this stage's work
      if (r + 1 < n) collx::send(comm, std::span<const float>{x}, r + 1);
      else
        for (std::size_t i = 0; i < x.size(); ++i)
          if (x[i] != float(i) + float(n)) { f.note(r, "element " + std::to_string(i) + " wrong"); break; }
    });
    CHECK(f.first() == "");
  }
}

// Every collective goes through its communicator's schedule cache (issue 34): a call of a shape
// seen before builds no schedule. (all_to_all built a pairwise schedule on every call, and
// gather, scatter and barrier theirs.)
TEST_CASE("every collective's schedule is cached: the same shape again builds nothing", "[all_to_all][gather][scatter][barrier]") {
  for (int n : {1, 3, 5}) {
    CAPTURE(n);
    failures f(n);
    collx::launch_threads(n, [&](auto& comm) {
      const int r = comm.rank();
      const auto un = std::size_t(n);
      const std::size_t k = 7;
      std::vector<std::int64_t> in(k * un), out(k * un), want(k * un), mine(k), all(k * un), back(k);
      for (int j = 0; j < n; ++j)
        for (std::size_t i = 0; i < k; ++i) {
          in[std::size_t(j) * k + i] = a2a_value(r, j, i);
          want[std::size_t(j) * k + i] = a2a_value(j, r, i);
        }
      for (std::size_t i = 0; i < k; ++i) mine[i] = a2a_value(r, 0, i);
      std::vector<std::int64_t> bc(k, r == 0 ? 42 : 0);
      auto round = [&] {
        collx::all_to_all(comm, std::span<const std::int64_t>{in}, std::span{out}, collx::algo::pairwise{});
        f.note(r, compare(out, want));
        collx::all_to_all(comm, std::span<const std::int64_t>{in}, std::span{out});
        f.note(r, compare(out, want));
        collx::gather(comm, std::span<const std::int64_t>{mine}, std::span{all}, n - 1, collx::algo::automatic{});
        collx::scatter(comm, std::span<const std::int64_t>{all}, std::span{back}, n - 1);
        f.note(r, compare(back, mine));
        collx::barrier(comm, collx::algo::automatic{});
        collx::broadcast(comm, std::span{bc}, 0);
        collx::all_gather(comm, std::span<const std::int64_t>{mine}, std::span{all});
      };
      round();
      const auto misses = comm.schedules().misses(), hits = comm.schedules().hits();
      round();
      if (comm.schedules().misses() != misses)
        f.note(r, "the second round built " + std::to_string(comm.schedules().misses() - misses) + " schedule(s)");
      if (n > 1 && comm.schedules().hits() < hits + 6)
        f.note(r, "the second round took " + std::to_string(comm.schedules().hits() - hits) + " schedules from the cache, not 6 or more");
    });
    CHECK(f.first() == "");
  }
}

TEST_CASE("async recv_any: the work says which rank sent", "[p2p][async]") {
  for (int n : {2, 3, 5}) {
    CAPTURE(n);
    failures f(n);
    collx::launch_threads(n, [&](auto& comm) {
      const int r = comm.rank();
      std::vector<int> m(3);
      if (r == 0) {
        std::vector<bool> seen(std::size_t(n), false);
        for (int i = 1; i < n; ++i) {
          int src = -1;
          collx::work w = collx::async::recv_any(comm, std::span{m}, &src);
          w.wait();
          if (src <= 0 || src >= n || seen[std::size_t(src)]) f.note(r, "recv_any said " + std::to_string(src));
          else seen[std::size_t(src)] = true;
          if (m != std::vector<int>{src, src * 2, src * 3}) f.note(r, "the message is not rank " + std::to_string(src) + "'s");
        }
      } else {
        std::vector<int> mine{r, r * 2, r * 3};
        collx::send(comm, std::span<const int>{mine}, 0);
      }
    });
    CHECK(f.first() == "");
  }
}
