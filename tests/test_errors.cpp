// Errors instead of hangs: timeouts, mismatched calls, bad arguments, failed peers.
#include <catch2/catch.hpp>

#include <pthread.h>
#include <sched.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <limits>
#include <thread>

#include "harness.hpp"

using namespace std::chrono_literals;
using Catch::Matchers::Contains;
using Catch::Matchers::EndsWith;
using Catch::Matchers::StartsWith;

namespace {
collx::options quick(std::chrono::nanoseconds t = 300ms) {
  collx::options o;
  o.timeout = t;
  return o;
}

/// Runs f on n thread-ranks and returns the error launch_threads rethrew (the first failure).
template <class F>
collx::error failure_of(int n, F f, collx::options o = quick()) {
  try {
    collx::launch_threads(n, f, o);
  } catch (const collx::error& e) {
    return e;
  }
  FAIL("no collx::error was thrown");
  throw;
}
}  // namespace

TEST_CASE("error codes compare with errc", "[errors]") {
  const collx::error e(collx::errc::timeout, "x");
  CHECK(e.code() == collx::errc::timeout);
  CHECK(e.code() != collx::errc::mismatch);
  CHECK(std::string(e.what()) == "x");
  CHECK(std::string(e.code().category().name()) == "collx");
}

TEST_CASE("a rank that never arrives makes the others time out, naming it", "[errors][timeout]") {
  const auto t0 = std::chrono::steady_clock::now();
  auto e = failure_of(3, [](auto& comm) {
    std::vector<float> v(100, 1.0f);
    if (comm.rank() == 2) std::this_thread::sleep_for(1500ms);  // a straggler beyond the deadline
    collx::all_reduce(comm, std::span{v}, collx::ops::sum{}, collx::algo::ring{});
  });
  const auto took = std::chrono::steady_clock::now() - t0;
  CHECK(e.code() == collx::errc::timeout);
  CHECK_THAT(e.what(), Contains("all_reduce #1 (ring): rank") && Contains("timed out after 0.3 s waiting for rank"));
  CHECK(took < 5s);
}

TEST_CASE("a wait's deadline runs from when it starts to block, through its yields", "[errors][timeout]") {
  // A waiter whose core is shared with a busy thread: each yield hands the core over for the
  // busy thread's time slice (milliseconds), and 64 yields ran before the deadline was taken,
  // so a short timeout reported late (CI's ASan run at d30cee6: a 300 ms timeout that came after
  // the 600 ms the peer took to leave, and named its leaving instead). Both threads are pinned
  // to one core; the waiter's timeout is 40 ms.
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(sched_getcpu() >= 0 ? sched_getcpu() : 0, &one);
  std::atomic<bool> stop{false};
  std::thread busy([&] {
    pthread_setaffinity_np(pthread_self(), sizeof one, &one);
    while (!stop.load(std::memory_order_relaxed)) {
    }
  });
  cpu_set_t before;
  pthread_getaffinity_np(pthread_self(), sizeof before, &before);
  pthread_setaffinity_np(pthread_self(), sizeof one, &one);
  std::this_thread::sleep_for(20ms);  // the busy thread runs
  // What the wait's yields cost here: without the fix, they came on top of the timeout.
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < collx::detail::kYieldIterations; ++i) sched_yield();
  const auto yields = std::chrono::steady_clock::now() - t0;
  collx::detail::waitable w;
  t0 = std::chrono::steady_clock::now();
  const auto r = collx::detail::wait_on(w, [] { return false; }, [] {}, 40ms, false, 8);
  const auto took = std::chrono::steady_clock::now() - t0;
  stop = true;
  busy.join();
  pthread_setaffinity_np(pthread_self(), sizeof before, &before);
  CHECK(r == collx::detail::wait_result::timed_out);
  using ms = std::chrono::milliseconds;
  INFO("the wait took " << std::chrono::duration_cast<ms>(took).count() << " ms; 64 yields alone "
                        << std::chrono::duration_cast<ms>(yields).count() << " ms");
  CHECK(took >= 40ms);
  if (yields < 20ms) {
    WARN("the yields were quick here (the busy thread did not keep the core): the late deadline cannot show");
  } else {
    CHECK(took < 40ms + yields / 2);  // (without the fix: 40 ms + the yields, ~130 ms here)
  }
}

TEST_CASE("a timeout message names the rank waited for, which launchers read back", "[errors][timeout]") {
  collx::call_info c;
  c.timeout = 2s;
  c.rank = 3;
  try {
    c.timed_out(12, "its data");
  } catch (const collx::error& e) {
    CHECK(collx::call_info::waited_for(e.what()) == 12);
  }
  CHECK(collx::call_info::waited_for("rank 0 failed") == -1);
  CHECK(collx::call_info::waited_for("x waiting for rank ") == -1);
}

TEST_CASE("a launcher follows a chain of waits to the rank the job waited for", "[errors][timeout]") {
  // Three ranks of a ring, rank 2 late: rank 1 waits for rank 0, which waits for rank 2. The
  // first deadline to pass aborts the job; the rank whose deadline was a moment later reports the
  // abort while it waited, and the job's error is still a timeout naming rank 2 (CI's ASan run
  // at fba056e named rank 0: the chain stopped at a rank that reported the abort).
  auto message = [](int rank, auto&& say) {
    collx::call_info c;
    c.timeout = 2s;
    c.rank = rank;
    try {
      say(c);
    } catch (const collx::error& e) {
      return std::pair{int(e.code().value()), std::string(e.what())};
    }
    return std::pair{0, std::string()};
  };
  const auto r1 = message(1, [](collx::call_info& c) { c.timed_out(0, "its data"); });
  const auto r0 = message(0, [&](collx::call_info& c) {
    c.fail(collx::errc::peer_lost, std::string(collx::call_info::kAbortedWhile) + " waiting for " + c.peer(2) +
                                       " (its data): " + c.peer(1) + " failed: " + r1.second);
  });
  const auto r2 = message(2, [&](collx::call_info& c) {
    c.fail(collx::errc::peer_lost, "lost " + c.peer(0) + ": it failed: " + r0.second);
  });
  const auto& [c0, aborted] = r0;
  const auto& [c1, timed_out] = r1;
  const auto& [c2, lost] = r2;
  CHECK(collx::call_info::aborted_wait(aborted));
  CHECK(collx::call_info::waited_for(aborted) == 2);
  CHECK_FALSE(collx::call_info::aborted_wait(timed_out));
  CHECK_FALSE(collx::call_info::aborted_wait(lost));  // it quotes rank 0's abort: not a wait of its own
  using f = collx::detail::rank_failure;
  SECTION("the abort came first in rank order") {
    const auto e = collx::detail::job_failure({f{0, c0, aborted}, f{1, c1, timed_out}, f{2, c2, lost}}, 3);
    CHECK(e.code() == collx::errc::timeout);
    CHECK_THAT(e.what(), StartsWith(aborted) && Contains("waiting for rank 2") && EndsWith("[3 ranks failed: 0 1 2]"));
  }
  SECTION("the late rank died") {
    const auto e = collx::detail::job_failure({f{0, c0, aborted}, f{1, c1, timed_out}, f{2, c2, "rank 2 was killed", true}}, 3);
    CHECK(e.code() == collx::errc::timeout);
    CHECK_THAT(e.what(), StartsWith(aborted));
  }
  SECTION("both timed out: the chain of timeouts as before") {
    const auto [c0t, t0] = message(0, [](collx::call_info& c) { c.timed_out(2, "its data"); });
    const auto e = collx::detail::job_failure({f{0, c0t, t0}, f{1, c1, timed_out}}, 3);
    CHECK(e.code() == collx::errc::timeout);
    CHECK_THAT(e.what(), StartsWith(t0));
  }
  SECTION("an abort is not followed from an error that is not a timeout") {
    const auto [cm, mismatch] = message(1, [](collx::call_info& c) { c.fail(collx::errc::mismatch, "waiting for rank 0 saw a different count"); });
    const auto e = collx::detail::job_failure({f{0, c0, aborted}, f{1, cm, mismatch}}, 3);
    CHECK(e.code() == collx::errc::mismatch);
    CHECK_THAT(e.what(), StartsWith(mismatch));
  }
}

TEST_CASE("COLLX_TIMEOUT_S sets the default timeout - a bad value is an error", "[errors][timeout]") {
  ::setenv("COLLX_TIMEOUT_S", "0.25", 1);
  CHECK(collx::options{}.timeout == 250ms);
  ::setenv("COLLX_TIMEOUT_S", "soon", 1);
  CHECK_THROWS_AS(collx::options{}, collx::error);
  ::unsetenv("COLLX_TIMEOUT_S");
  CHECK(collx::options{}.timeout == 300s);
}

TEST_CASE("ranks that make different calls get errc::mismatch, with both sides printed", "[errors][mismatch]") {
  SECTION("different counts") {
    auto e = failure_of(4, [](auto& comm) {
      std::vector<float> v(comm.rank() == 1 ? 12 : 10, 1.0f);
      collx::all_reduce(comm, std::span{v}, collx::ops::sum{}, collx::algo::ring{});
    });
    CHECK(e.code() == collx::errc::mismatch);
    CHECK_THAT(e.what(), Contains("12 x 4 B") && Contains("10 x 4 B"));
  }
  SECTION("different collectives") {
    auto e = failure_of(2, [](auto& comm) {
      std::vector<float> v(8, 1.0f);
      if (comm.rank() == 0) collx::all_reduce(comm, std::span{v}, collx::ops::sum{}, collx::algo::ring{});
      else collx::broadcast(comm, std::span{v}, 0, collx::algo::ring{});
    });
    CHECK(e.code() == collx::errc::mismatch);
    CHECK_THAT(e.what(), Contains("all_reduce") && Contains("broadcast"));
  }
  SECTION("different roots") {
    auto e = failure_of(3, [](auto& comm) {
      std::vector<int> v(8, 1);
      // Rank 1 expects the tree of root 2 and waits for rank 2, while rank 0 (root 0) has
      // already sent it a message: that message shows the mismatch whatever the timing. (Had
      // rank 1 been expected by nobody, it could finish and leave first, and its peer would see
      // a rank that left, peer_lost, before any mismatched message arrived.)
      collx::broadcast(comm, std::span{v}, comm.rank() == 1 ? 2 : 0, collx::algo::tree{});
    });
    CHECK(e.code() == collx::errc::mismatch);
  }
  SECTION("different ops") {
    auto e = failure_of(2, [](auto& comm) {
      std::vector<int> v(8, 1);
      if (comm.rank() == 0) collx::all_reduce(comm, std::span{v}, collx::ops::sum{}, collx::algo::ring{});
      else collx::all_reduce(comm, std::span{v}, collx::ops::max{}, collx::algo::ring{});
    });
    CHECK(e.code() == collx::errc::mismatch);
    CHECK_THAT(e.what(), Contains("sum") && Contains("max"));
  }
  SECTION("different element sizes") {
    auto e = failure_of(2, [](auto& comm) {
      if (comm.rank() == 0) {
        std::vector<float> v(8, 1.0f);
        collx::all_reduce(comm, std::span{v}, collx::ops::sum{}, collx::algo::ring{});
      } else {
        std::vector<double> v(8, 1.0);
        collx::all_reduce(comm, std::span{v}, collx::ops::sum{}, collx::algo::ring{});
      }
    });
    CHECK(e.code() == collx::errc::mismatch);
  }
  SECTION("a skipped call shifts the sequence numbers") {
    auto e = failure_of(2, [](auto& comm) {
      std::vector<float> v(8, 1.0f);
      if (comm.rank() == 0) collx::barrier(comm);
      collx::barrier(comm);
      collx::all_reduce(comm, std::span{v}, collx::ops::sum{}, collx::algo::ring{});
    });
    CHECK(e.code() == collx::errc::mismatch);
  }
  SECTION("zero-element calls that differ are caught at the next call that exchanges") {
    auto e = failure_of(3, [](auto& comm) {
      std::vector<float> none, v(8, 1.0f);
      if (comm.rank() == 1) collx::broadcast(comm, std::span{none}, 0);
      else collx::all_reduce(comm, std::span{none}, collx::ops::sum{});
      collx::all_reduce(comm, std::span{v}, collx::ops::sum{}, collx::algo::ring{});
    });
    CHECK(e.code() == collx::errc::mismatch);
    CHECK_THAT(e.what(), Contains("all_reduce #2 (ring)") && Contains("different calls with zero elements"));
  }
  SECTION("a zero-element call on one rank against a non-empty one") {
    auto e = failure_of(2, [](auto& comm) {
      std::vector<float> v(comm.rank() == 0 ? 0 : 8, 1.0f), w(8, 1.0f);
      collx::all_reduce(comm, std::span{v}, collx::ops::sum{}, collx::algo::ring{});
      collx::all_reduce(comm, std::span{w}, collx::ops::sum{}, collx::algo::ring{});
    });
    CHECK(e.code() == collx::errc::mismatch);
    CHECK_THAT(e.what(), Contains("all_reduce #1") && Contains("all_reduce #2"));
  }
  SECTION("zero-element calls that agree are no error") {
    collx::launch_threads(3, [](auto& comm) {
      std::vector<float> none, v(8, 1.0f);
      collx::broadcast(comm, std::span{none}, 2);
      collx::all_reduce(comm, std::span{v}, collx::ops::sum{}, collx::algo::ring{});
      for (float x : v)
        if (x != 3.0f) throw std::runtime_error("wrong sum");
    }, quick());
  }
  SECTION("all_to_all_v counts that disagree between sender and receiver") {
    auto e = failure_of(2, [](auto& comm) {
      // rank 1 sends 2 elements to rank 0, which expects 3
      const bool r0 = comm.rank() == 0;
      std::vector<std::size_t> sc = r0 ? std::vector<std::size_t>{1, 2} : std::vector<std::size_t>{2, 1};
      std::vector<std::size_t> rc = r0 ? std::vector<std::size_t>{1, 3} : std::vector<std::size_t>{2, 1};
      std::vector<int> in(3), out(r0 ? 4 : 3);
      collx::all_to_all_v(comm, std::span<const int>{in}, std::span<const std::size_t>{sc}, std::span{out},
                          std::span<const std::size_t>{rc});
    });
    CHECK(e.code() == collx::errc::mismatch);
  }
}

TEST_CASE("bad arguments throw invalid_argument, naming what is wrong", "[errors][arguments]") {
  using namespace collx;
  // Each misuse on every rank of a fresh job (an argument error fails the communicator: see below).
  auto expect_invalid = [](const char* what, auto&& f) {
    CAPTURE(what);
    std::string got;
    try {
      launch_threads(3, [&](auto& comm) { f(comm); }, quick(10s));
    } catch (const collx::error& e) {
      CHECK(e.code() == collx::errc::invalid_argument);
      got = e.what();
    }
    CHECK_THAT(got, Contains(what));
  };
  std::vector<float> a(12), b(5);
  std::vector<std::size_t> c3{1, 1, 1}, c2{1, 1};
  expect_invalid("output has 5", [&](auto& comm) { all_reduce(comm, std::span<const float>{a}, std::span{b}, ops::sum{}); });
  expect_invalid("input has 5", [&](auto& comm) { reduce_scatter(comm, std::span<const float>{b}, std::span{b}, ops::sum{}); });
  expect_invalid("output has 12", [&](auto& comm) { all_gather(comm, std::span<const float>{b}, std::span{a}); });
  expect_invalid("root 3 is out of range", [&](auto& comm) { broadcast(comm, std::span{a}, 3); });
  expect_invalid("root -1", [&](auto& comm) { broadcast(comm, std::span{a}, -1); });
  expect_invalid("root 7", [&](auto& comm) { reduce(comm, std::span<const float>{a}, std::span{b}, ops::sum{}, 7); });
  expect_invalid("not a multiple", [&](auto& comm) { all_to_all(comm, std::span<const float>{b}, std::span{b}); });
  expect_invalid("overlap", [&](auto& comm) {
    std::vector<float> x(12);
    all_reduce(comm, std::span<const float>{x.data(), 8}, std::span{x.data() + 4, 8}, ops::sum{});
  });
  expect_invalid("add up to 3", [&](auto& comm) {
    all_to_all_v(comm, std::span<const float>{b}, std::span<const std::size_t>{c3}, std::span{b}, std::span<const std::size_t>{c3});
  });
  expect_invalid("one entry per rank", [&](auto& comm) {
    all_to_all_v(comm, std::span<const float>{b}, std::span<const std::size_t>{c2}, std::span{b}, std::span<const std::size_t>{c3});
  });
  expect_invalid("is not another rank", [&](auto& comm) { send(comm, std::span<const float>{b}, comm.rank()); });
  expect_invalid("is not another rank", [&](auto& comm) { recv(comm, std::span{b}, 9); });
}

TEST_CASE("counts whose sum wraps around are refused, not copied out of bounds", "[errors][arguments][overflow]") {
  // Each rank sends 1 element to itself and ~SIZE_MAX/2 to each of the two others: the sum wraps
  // to 1 == the input's size (before the fix: accepted, then copies far out of bounds).
  const std::size_t huge = (std::numeric_limits<std::size_t>::max() / 2) + 1;
  std::string got;
  try {
    collx::launch_threads(3, [&](auto& comm) {
      std::vector<int> in(1), out(1);
      std::vector<std::size_t> sc(3, huge), rc(3, 0);
      sc[std::size_t(comm.rank())] = 1;
      rc[std::size_t(comm.rank())] = 1;
      collx::all_to_all_v(comm, std::span<const int>{in}, std::span<const std::size_t>{sc}, std::span{out},
                          std::span<const std::size_t>{rc});
    }, quick(10s));
  } catch (const collx::error& e) {
    CHECK(e.code() == collx::errc::invalid_argument);
    got = e.what();
  }
  CHECK_THAT(got, Contains("send_counts add up to more than") && Contains("overflow"));
}

namespace {
/// One rank passes a bad argument, catches the error and goes on, while the others call
/// correctly. Every rank must fail at once (not at its deadline): the peers with peer_lost and
/// the reason, the bad rank's next call with peer_lost too (the communicator has failed), never
/// a call numbered one off. Each rank checks what it saw and returns normally when it is right.
template <class Launch>
void check_argument_error_fails_everyone(Launch launch) {
  const auto t0 = std::chrono::steady_clock::now();
  launch(3, [&](auto& comm) {
    std::vector<float> in(12, 1.0f), out(comm.rank() == 1 ? 5 : 12);
    std::string saw;
    try {
      collx::all_reduce(comm, std::span<const float>{in}, std::span{out}, collx::ops::sum{}, collx::algo::ring{});
      throw std::runtime_error("rank " + std::to_string(comm.rank()) + ": the all_reduce succeeded");
    } catch (const collx::error& e) {
      saw = e.what();
      const auto want = comm.rank() == 1 ? collx::errc::invalid_argument : collx::errc::peer_lost;
      if (e.code() != want || saw.find("the output has 5") == std::string::npos || saw.find("rank 1") == std::string::npos)
        throw std::runtime_error("rank " + std::to_string(comm.rank()) + " saw: " + saw);
    }
    if (comm.rank() == 1) {  // it caught the error and goes on: the communicator is failed
      try {
        collx::barrier(comm);
        throw std::runtime_error("rank 1: a barrier after the failure succeeded");
      } catch (const collx::error& e) {
        if (e.code() != collx::errc::peer_lost) throw std::runtime_error(std::string("rank 1's barrier: ") + e.what());
      }
    }
  }, quick(60s));
  CHECK(std::chrono::steady_clock::now() - t0 < 10s);  // at once, not after the 60 s deadline
}
}  // namespace

TEST_CASE("a bad argument on one rank fails the call on every rank at once, with the reason", "[errors][arguments]") {
  SECTION("threads") {
    check_argument_error_fails_everyone([](int n, auto f, collx::options o) { collx::launch_threads(n, f, o); });
  }
  SECTION("processes over shm") {
    check_argument_error_fails_everyone([](int n, auto f, collx::options o) { collx::launch_processes(n, f, o); });
  }
  SECTION("processes over tcp") {
    check_argument_error_fails_everyone(
        [](int n, auto f, collx::options o) { collx::launch_processes(n, f, o, collx::transport::tcp_config{}); });
  }
}

TEST_CASE("a failed rank makes the others fail fast with peer_lost", "[errors][peer_lost]") {
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::string> seen(5);
  try {
    collx::launch_threads(5, [&](auto& comm) {
      std::vector<float> v(1000, 1.0f);
      try {
        collx::all_reduce(comm, std::span{v}, collx::ops::sum{}, collx::algo::ring{});
        if (comm.rank() == 3) throw std::runtime_error("rank 3 crashed");
        collx::all_reduce(comm, std::span{v}, collx::ops::sum{}, collx::algo::ring{});
      } catch (const collx::error& e) {
        seen[std::size_t(comm.rank())] = e.what();
        throw;
      }
    }, quick(30s));
    FAIL("no exception");
  } catch (const std::runtime_error& e) {
    CHECK(std::string(e.what()) == "rank 3 crashed");  // the first failure is the one rethrown
  }
  CHECK(std::chrono::steady_clock::now() - t0 < 5s);  // far below the 30 s timeout
  for (int r : {0, 1, 2, 4}) {
    CAPTURE(r, seen[std::size_t(r)]);
    // A peer may still be finishing all_reduce #1 when rank 3 fails; either way it names rank 3.
    CHECK_THAT(seen[std::size_t(r)], Contains("all_reduce #") && Contains("rank 3") && Contains("failed"));
  }
}

TEST_CASE("a rank that returns early is reported as lost, not waited for", "[errors][peer_lost]") {
  auto e = failure_of(2, [](auto& comm) {
    std::vector<float> v(8, 1.0f);
    if (comm.rank() == 1) return;
    collx::all_reduce(comm, std::span{v}, collx::ops::sum{}, collx::algo::ring{});
  }, quick(30s));
  CHECK(e.code() == collx::errc::peer_lost);
  CHECK_THAT(e.what(), Contains("rank 1") && Contains("left"));
}
