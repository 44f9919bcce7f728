// collx-flight-overhead: what the flight recorder costs an 8 B all_reduce over shm at N = 2 inside
// a real call, taken apart in one run. Two processes (launch_processes) make the same call on two
// communicators split from the job, one with the recorder off and one with it on, and on the off
// one twice more: with two reads of the recorder's clock around each call (the floor of a record
// with a start and an end time) and with a call's whole record kept on a recorder of the side
// (open + close, as the call's own would). Each round times a block of calls in every mode, one
// after the other, so the machine's drift between rounds falls on all of them alike; what is
// quoted is the median over rounds of each mode's time over the recorder-off time of its round.
//
//   collx-flight-overhead [calls-a-block (100000)] [rounds (21)]
//
// docs/diagnostics.md quotes it. collx-flight-bench times the same pieces alone, out of a call.
#include <collx/collx.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <vector>

int main(int argc, char** argv) {
  const long calls = argc > 1 ? std::atol(argv[1]) : 100000;
  const int rounds = argc > 2 ? std::atoi(argv[2]) : 21;
  if (calls < 1 || rounds < 1) {
    std::fprintf(stderr, "usage: collx-flight-overhead [calls-a-block >= 1] [rounds >= 1]\n");
    return 2;
  }
  constexpr int kModes = 4;
  const char* names[kModes] = {"recorder off", "recorder on", "off + two clock reads", "off + a record on the side"};
  collx::launch_processes(2, [&](auto& world) {
    // The recorder's size is read as a communicator is made (COLLX_FLIGHT_RECORDER).
    setenv("COLLX_FLIGHT_RECORDER", "0", 1);
    auto off = world.split(0, world.rank(), "off");
    setenv("COLLX_FLIGHT_RECORDER", "512", 1);
    auto on = world.split(0, world.rank(), "on");
    collx::detail::position board[2];
    collx::detail::flight_recorder side;
    side.bind(nullptr, world.rank(), 2, "shm", nullptr, collx::detail::position_board{board, sizeof board[0], 2});
    collx::call_signature sig{};
    std::strcpy(sig.collective, "all_reduce");
    std::strcpy(sig.policy, "automatic");
    sig.count = 2;
    sig.elem_size = 4;

    std::vector<float> buf(2);
    volatile std::int64_t sink = 0;
    std::vector<double> ns[kModes], ratio[kModes];
    std::uint64_t wrong = 0;
    for (int round = 0; round <= rounds; ++round) {  // round 0 warms up
      double t[kModes];
      for (int m = 0; m < kModes; ++m) {
        auto& c = m == 1 ? on : off;
        const auto t0 = std::chrono::steady_clock::now();
        for (long i = 0; i < calls; ++i) {
          buf[0] = float(world.rank());
          buf[1] = 1.0f;
          collx::detail::call_record* rec = nullptr;
          if (m == 2) sink = collx::detail::wall_ns();
          if (m == 3) {
            sig.seq = std::uint64_t(i) + 1;
            rec = side.open(sig, 0);
          }
          collx::all_reduce(c, std::span<float>(buf), collx::ops::sum{}, collx::algo::automatic{});
          if (m == 2) sink = collx::detail::wall_ns();
          if (m == 3) side.close(rec, false);
          wrong += buf[0] != 1.0f || buf[1] != 2.0f;  // 0 + 1, 1 + 1
        }
        t[m] = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() / double(calls);
      }
      if (round == 0) continue;
      for (int m = 0; m < kModes; ++m) {
        ns[m].push_back(t[m]);
        ratio[m].push_back(t[m] / t[0]);
      }
    }
    (void)sink;
    if (world.rank() != 0) return;
    auto median = [](std::vector<double> v) {
      std::sort(v.begin(), v.end());
      return v[v.size() / 2];
    };
    std::printf("# 8 B all_reduce (automatic), shm, N = 2: %ld calls a block, %d rounds, medians over rounds\n", calls, rounds);
    std::printf("%-28s %10s %12s %20s\n", "mode", "ns/call", "x off", "x off (min..max)");
    for (int m = 0; m < kModes; ++m)
      std::printf("%-28s %10.1f %12.3f %9.3f..%.3f\n", names[m], median(ns[m]), median(ratio[m]),
                  *std::min_element(ratio[m].begin(), ratio[m].end()), *std::max_element(ratio[m].begin(), ratio[m].end()));
    if (wrong != 0) {
      std::printf("# %llu results were wrong\n", static_cast<unsigned long long>(wrong));
      std::exit(1);
    }
  });
}
