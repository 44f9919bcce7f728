// What every transport must do alike (threads, shared memory, TCP): steps with more messages to
// one peer than any queue holds, and the one rule of point-to-point calls.
#include <catch2/catch.hpp>

#include <chrono>
#include <numeric>

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

}  // namespace

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
