// What every transport must do alike (threads, shared memory, TCP): steps with more messages to
// one peer than any queue holds, and the one rule of point-to-point calls.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <numeric>
#include <thread>

#include "harness.hpp"

using namespace collx_test;
using namespace std::chrono_literals;
using Catch::Matchers::Contains;

namespace {

struct launch_threads_t {
  template <class F>
  void operator()(int n, F&& f, const collx::options& o) const { collx::launch_threads(n, std::forward<F>(f), o); }
  static constexpr const char* name = "threads";
};
struct launch_shm_t {
  template <class F>
  void operator()(int n, F&& f, const collx::options& o) const { collx::launch_processes(n, std::forward<F>(f), o); }
  static constexpr const char* name = "shm";
};
struct launch_shm_single_copy_t {
  template <class F>
  void operator()(int n, F&& f, const collx::options& o) const {
    collx::transport::shm::config cfg;
    cfg.single_copy_from(1024);
    collx::launch_processes(n, std::forward<F>(f), o, cfg);
  }
  static constexpr const char* name = "shm, single copy from 1 KiB";
};
struct launch_tcp_t {
  template <class F>
  void operator()(int n, F&& f, const collx::options& o) const {
    collx::launch_processes(n, std::forward<F>(f), o, collx::transport::tcp_config{});
  }
  static constexpr const char* name = "tcp";
};

collx::options with_timeout(std::chrono::nanoseconds t) {
  collx::options o;
  o.timeout = t;
  return o;
}

/// One step in which each of 2 ranks sends `m` messages of `k` ints to the other and receives
/// as many: more than a thread channel's queue (16), a shared-memory channel's slots (8) and a
/// rank's pool (16) hold, so it completes only if sends and receives progress together.
template <class L>
void many_messages_in_one_step(int m, std::size_t k) {
  CAPTURE(L::name, m, k);
  std::string problem;
  try {
    L{}(2, [&](auto& comm) {
      const int r = comm.rank(), peer = 1 - r;
      std::vector<int> in(std::size_t(m) * k), out(std::size_t(m) * k, -1);
      std::iota(in.begin(), in.end(), r * 1000000);
      collx::schedule s;
      for (int i = 0; i < m; ++i) {
        s.send(peer, {collx::buf::in, std::size_t(i) * k, k});
        s.recv(peer, {collx::buf::out, std::size_t(i) * k, k});
      }
      const auto call = collx::detail::make_call<int, collx::no_op>(comm, "test", "direct", std::size_t(m) * k);
      collx::detail::execute(comm, call, s, in.data(), out.data(), collx::no_op{});
      for (std::size_t i = 0; i < out.size(); ++i)
        if (out[i] != peer * 1000000 + int(i))
          throw std::runtime_error("rank " + std::to_string(r) + ": element " + std::to_string(i) + " is " + std::to_string(out[i]));
    }, with_timeout(20s));
  } catch (const std::exception& e) {
    problem = e.what();
  }
  CHECK(problem == "");
}

/// A send returns once its receiver has called recv, at every size, so paired calls deliver and
/// two ranks sending to each other first both wait until their deadline (errc::timeout naming
/// the other), whatever the size; sendrecv does an exchange.
template <class L>
void point_to_point_rule(std::size_t count) {
  CAPTURE(L::name, count);
  auto value = [](int r, std::size_t i) { return float(r * 1000 + int(i % 1000)); };
  auto check = [&](const std::vector<float>& v, int from) {
    for (std::size_t i = 0; i < v.size(); ++i)
      if (v[i] != value(from, i)) return "element " + std::to_string(i) + " from rank " + std::to_string(from) + " is " + std::to_string(v[i]);
    return std::string();
  };
  // paired: rank 0 sends first, rank 1 receives first; then the other way round
  std::string problem;
  try {
    L{}(2, [&](auto& comm) {
      const int r = comm.rank();
      std::vector<float> mine(count), theirs(count, -1);
      for (std::size_t i = 0; i < count; ++i) mine[i] = value(r, i);
      if (r == 0) {
        collx::send(comm, std::span{mine}, 1);
        collx::recv(comm, std::span{theirs}, 1);
      } else {
        collx::recv(comm, std::span{theirs}, 0);
        collx::send(comm, std::span{mine}, 0);
      }
      if (auto p = check(theirs, 1 - r); !p.empty()) throw std::runtime_error("paired: " + p);
      // sendrecv on both sides
      std::fill(theirs.begin(), theirs.end(), -1.0f);
      collx::sendrecv(comm, std::span<const float>{mine}, 1 - r, std::span{theirs}, 1 - r);
      if (auto p = check(theirs, 1 - r); !p.empty()) throw std::runtime_error("sendrecv: " + p);
      // a send on one side against a sendrecv on the other
      std::fill(theirs.begin(), theirs.end(), -1.0f);
      if (r == 0) {
        collx::send(comm, std::span{mine}, 1);
        collx::recv(comm, std::span{theirs}, 1);
      } else {
        collx::sendrecv(comm, std::span<const float>{mine}, 0, std::span{theirs}, 0);
      }
      if (auto p = check(theirs, 1 - r); !p.empty()) throw std::runtime_error("send against sendrecv: " + p);
    }, with_timeout(20s));
  } catch (const std::exception& e) {
    problem = e.what();
  }
  CHECK(problem == "");
  // head to head: both send first
  const auto t0 = std::chrono::steady_clock::now();
  try {
    L{}(2, [&](auto& comm) {
      std::vector<float> mine(count, 1.0f), theirs(count);
      collx::send(comm, std::span{mine}, 1 - comm.rank());
      collx::recv(comm, std::span{theirs}, 1 - comm.rank());
    }, with_timeout(300ms));
    FAIL("two sends head to head completed");
  } catch (const collx::error& e) {
    CHECK(e.code() == collx::errc::timeout);
    CHECK_THAT(e.what(), Contains("send/recv") && Contains("waiting for rank") && Contains("to receive this rank's message"));
  }
  CHECK(std::chrono::steady_clock::now() - t0 < 15s);
}

/// recv_any at n ranks: rank 0 takes one message from each sender (the even ranks and the
/// last), in whatever order they come. The other ranks have gone on to a gather to rank 0, whose
/// messages reach it first (the senders wait a little) and sit at the head of their channels,
/// scanned first: not point to point, so never taken for one. Then a receive restricted to one
/// rank takes that rank's message though another's came first. Every message's source and
/// elements are checked, and the gather after them.
template <class L>
void receive_from_any_source(int n, std::size_t count) {
  CAPTURE(L::name, n, count);
  auto value = [](int r, std::size_t i) { return std::int64_t(r) * 1000003 + std::int64_t(i); };
  auto sends = [n](int r) { return r >= 1 && (r % 2 == 0 || r == n - 1); };
  std::string problem;
  try {
    L{}(n, [&](auto& comm) {
      const int r = comm.rank();
      std::vector<std::int64_t> mine(count);
      for (std::size_t i = 0; i < count; ++i) mine[i] = value(r, i);
      if (r == 0) {
        std::vector<int> seen, want;
        for (int q = 1; q < n; ++q)
          if (sends(q)) want.push_back(q);
        for (std::size_t k = 0; k < want.size(); ++k) {
          std::vector<std::int64_t> got(count, -1);
          const int src = collx::recv_any(comm, std::span{got});
          if (src <= 0 || src >= n || !sends(src)) throw std::runtime_error("recv_any returned rank " + std::to_string(src));
          for (std::size_t i = 0; i < count; ++i)
            if (got[i] != value(src, i))
              throw std::runtime_error("element " + std::to_string(i) + " from rank " + std::to_string(src) + " is " + std::to_string(got[i]));
          seen.push_back(src);
        }
        std::sort(seen.begin(), seen.end());
        if (seen != want) throw std::runtime_error("recv_any: some rank was received twice");
      } else if (sends(r)) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        collx::send(comm, std::span{mine}, 0);
      }
      const std::vector<std::int64_t> one{r + 1};
      std::vector<std::int64_t> all(std::size_t(r == 0 ? n : 0));
      collx::gather(comm, std::span<const std::int64_t>{one}, std::span{all}, 0);
      for (std::size_t q = 0; q < all.size(); ++q)
        if (all[q] != std::int64_t(q) + 1) throw std::runtime_error("gather after recv_any: block " + std::to_string(q));
      // Restricted to the last rank: rank 1's message, sent first, waits for the plain recv.
      if (n >= 3) {
        const int last = n - 1;
        if (r == 1 || r == last) {
          if (r == last) std::this_thread::sleep_for(std::chrono::milliseconds(20));
          collx::send(comm, std::span{mine}, 0);
        } else if (r == 0) {
          std::vector<std::int64_t> got(count, -1);
          const int only = last;
          if (const int src = collx::recv_any(comm, std::span{got}, std::span<const int>(&only, 1)); src != last)
            throw std::runtime_error("recv_any from rank " + std::to_string(last) + " only returned rank " + std::to_string(src));
          if (count != 0 && got[count - 1] != value(last, count - 1)) throw std::runtime_error("restricted: wrong data");
          collx::recv(comm, std::span{got}, 1);
          if (count != 0 && got[0] != value(1, 0)) throw std::runtime_error("after restricted: wrong data from rank 1");
        }
      }
    }, with_timeout(20s));
  } catch (const std::exception& e) {
    problem = e.what();
  }
  CHECK(problem == "");
}

}  // namespace

TEMPLATE_TEST_CASE("receive from any source: every sender once, whatever the order", "[transports][p2p]", launch_threads_t,
                   launch_shm_t, launch_tcp_t) {
  for (int n : {2, 3, 5, 8})
    for (std::size_t count : {std::size_t(0), std::size_t(1), std::size_t(257), std::size_t(100003)})
      receive_from_any_source<TestType>(n, count);
}

TEMPLATE_TEST_CASE("receive from any source: a wrong size, nobody sending, everybody gone", "[transports][p2p][errors]",
                   launch_threads_t, launch_shm_t, launch_tcp_t) {
  CAPTURE(TestType::name);
  // A message of another size: a mismatch naming its sender.
  try {
    TestType{}(3, [](auto& comm) {
      std::vector<float> v(comm.rank() == 2 ? 5 : 4, 1.0f);
      if (comm.rank() == 0) collx::recv_any(comm, std::span{v});
      else if (comm.rank() == 2) collx::send(comm, std::span{v}, 0);
    }, with_timeout(5s));
    FAIL("a message of the wrong size was taken");
  } catch (const collx::error& e) {
    CHECK_THAT(e.what(), Contains("expected 16 B from rank 2 but it sent 20 B"));
  }
  // Nobody sends, and the others wait: rank 0's deadline, naming whom it waited for.
  try {
    TestType{}(3, [](auto& comm) {
      std::vector<float> v(4);
      if (comm.rank() == 0) collx::recv_any(comm, std::span{v});
      else std::this_thread::sleep_for(1s);
    }, with_timeout(300ms));
    FAIL("recv_any with no sender returned");
  } catch (const collx::error& e) {
    CHECK_THAT(e.what(), Contains("send/recv") && Contains("timed out after") &&
                             Contains("waiting for a message from any of rank 1, rank 2"));
  }
  // The same under the whole call's deadline (options::call_timeout), which comes first here.
  try {
    collx::options o = with_timeout(30s);
    o.call_timeout = 300ms;
    TestType{}(3, [](auto& comm) {
      std::vector<float> v(4);
      if (comm.rank() == 0) collx::recv_any(comm, std::span{v});
      else std::this_thread::sleep_for(1s);
    }, o);
    FAIL("recv_any with no sender returned");
  } catch (const collx::error& e) {
    CHECK_THAT(e.what(), Contains("timed out after 0.3 s (the whole call's deadline, options::call_timeout)") &&
                             Contains("waiting for a message from any of rank 1, rank 2"));
  }
  // A rank fails (not one received from) while rank 0 waits for rank 1, which stays: the
  // failure ends the wait at once, naming the failed rank; and so when rank 1 has left first.
  for (const bool first_leaves : {false, true}) {
    CAPTURE(first_leaves);
    std::string rank0;
    try {
      TestType{}(4, [&](auto& comm) {
        const int r = comm.rank();
        if (r == 3) {
          std::this_thread::sleep_for(200ms);
          throw std::runtime_error("rank 3 gives up");
        }
        if (r == 1) {
          if (!first_leaves) std::this_thread::sleep_for(3s);
          return;
        }
        if (r == 2) {
          std::this_thread::sleep_for(3s);
          return;
        }
        std::vector<float> v(4);
        const int from[] = {1, 2};
        const auto t0 = std::chrono::steady_clock::now();
        try {
          collx::recv_any(comm, std::span{v}, std::span<const int>(from));
        } catch (const collx::error& e) {
          const std::string what = e.what();
          if (e.code() != collx::errc::peer_lost || what.find("rank 3") == std::string::npos ||
              std::chrono::steady_clock::now() - t0 > 2s)
            throw std::runtime_error("rank 0 got: " + what);
          return;
        }
        throw std::runtime_error("rank 0 got: recv_any returned");
      }, with_timeout(20s));
    } catch (const std::exception& e) {
      rank0 = e.what();
    }
    CHECK_THAT(rank0, Contains("rank 3 gives up"));
    CHECK_THAT(rank0, !Contains("rank 0 got"));
  }
  // Nobody sends, and the others have left: no waiting for the deadline.
  const auto t0 = std::chrono::steady_clock::now();
  try {
    TestType{}(3, [](auto& comm) {
      std::vector<float> v(4);
      if (comm.rank() == 0) collx::recv_any(comm, std::span{v});
    }, with_timeout(20s));
    FAIL("recv_any from ranks that left returned");
  } catch (const collx::error& e) {
    CHECK(e.code() == collx::errc::peer_lost);
    CHECK_THAT(e.what(), Contains("every rank it could receive from has left"));
  }
  CHECK(std::chrono::steady_clock::now() - t0 < 10s);
}
TEMPLATE_TEST_CASE("a step with more messages to one peer than any queue holds completes", "[transports]", launch_threads_t,
                   launch_shm_t, launch_shm_single_copy_t, launch_tcp_t) {
  many_messages_in_one_step<TestType>(17, 1);
  many_messages_in_one_step<TestType>(40, 1);
  many_messages_in_one_step<TestType>(200, 7);
  many_messages_in_one_step<TestType>(40, 16384 + 3);  // 64 KiB messages: more than a peer's slots and a pool
}

TEMPLATE_TEST_CASE("point to point: one rule on every transport and at every size", "[transports][p2p]", launch_threads_t,
                   launch_shm_t, launch_shm_single_copy_t, launch_tcp_t) {
  for (std::size_t count : {std::size_t(0), std::size_t(1), std::size_t(8), std::size_t(257), std::size_t(100003),
                            std::size_t(1) << 20})
    point_to_point_rule<TestType>(count);
}

TEST_CASE("join: processes collx did not start make their transport through a shared store, by name", "[transports][join]") {
  // The forked ranks stand for ranks a launcher started (torchrun, srun): each makes a file store
  // in one directory and joins a second communicator through it, shm and tcp by name, and
  // all-reduces on it against the sum every rank computes itself.
  const auto dir = std::filesystem::temp_directory_path() / ("collx-join-" + std::to_string(::getpid()));
  for (int n : {1, 2, 3}) {
    for (const char* name : {"shm", "tcp"}) {
      CAPTURE(n, name);
      std::filesystem::remove_all(dir);
      std::filesystem::create_directories(dir);
      CHECK(run_checked<processes>(n, [&](auto& world, auto note) {
              auto store = std::make_shared<collx::transport::file_store>((dir / name).string());
              collx::join_options o;
              o.timeout = 60s;
              o.prefix = std::string("join-") + name;
              collx::communicator comm{collx::join_named(name, store, world.rank(), world.size(), o)};
              if (comm.rank() != world.rank() || comm.size() != n) note("rank or size differ from the world's");
              std::vector<std::int64_t> v(1031);
              for (std::size_t i = 0; i < v.size(); ++i) v[i] = std::int64_t(i) * (comm.rank() + 1);
              collx::all_reduce(comm, std::span{v}, collx::ops::sum{});
              for (std::size_t i = 0; i < v.size(); ++i)
                if (v[i] != std::int64_t(i) * n * (n + 1) / 2) {
                  note("element " + std::to_string(i) + " is " + std::to_string(v[i]));
                  break;
                }
            }) == "");
    }
  }
  std::filesystem::remove_all(dir);
  // A name that is not a transport between processes says which are.
  auto store = std::make_shared<collx::transport::file_store>(dir.string());
  CHECK_THROWS_WITH(collx::join_named("threads", store, 0, 1), Contains("no transport between processes is called 'threads'"));
  std::filesystem::remove_all(dir);
}
