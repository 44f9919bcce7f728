// collx-flight-bench: what the flight recorder (comm/flight.hpp) costs a call, piece by piece, in one
// run: its clock against the raw counter and clock_gettime, and a call's record (open + close on
// a bound recorder with a position board, as a collective of 2 ranks records itself; nothing
// waited, so no per-peer work). The end-to-end figure is collx-perf's, recorder on against off
// (docs/diagnostics.md).
//
//   collx-flight-bench --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>

#include <cstring>
#if defined(__x86_64__)
#include <x86intrin.h>
#endif

#include <collx/comm/flight.hpp>

namespace {

#if defined(__x86_64__)
void counter(benchmark::State& s) {  // the floor of the recorder's clock: the time stamp counter
  for (auto _ : s) benchmark::DoNotOptimize(__rdtsc());
}
BENCHMARK(counter);
#endif

void recorder_clock(benchmark::State& s) {  // detail::wall_ns: the counter, scaled to wall-clock ns
  for (auto _ : s) benchmark::DoNotOptimize(collx::detail::wall_ns());
}
BENCHMARK(recorder_clock);

void clock_gettime_realtime(benchmark::State& s) {  // what wall_ns spares a read
  for (auto _ : s) benchmark::DoNotOptimize(collx::detail::system_wall_ns());
}
BENCHMARK(clock_gettime_realtime);

void record_a_call(benchmark::State& s) {  // open + close: two clock reads and the record itself
  collx::detail::position board[2];
  collx::detail::flight_recorder r;  // K from COLLX_FLIGHT_RECORDER, default 512
  r.bind(nullptr, 0, 2, "shm", nullptr, collx::detail::position_board{board, sizeof board[0], 2});
  collx::call_signature sig{};
  std::strcpy(sig.collective, "all_reduce");
  std::strcpy(sig.policy, "automatic");
  sig.count = 2;
  sig.elem_size = 4;
  std::uint64_t seq = 0;
  for (auto _ : s) {
    sig.seq = ++seq;
    collx::detail::call_record* rec = r.open(sig, 0);
    if (rec == nullptr) {
      s.SkipWithError("the recorder is off (COLLX_FLIGHT_RECORDER=0)");
      break;
    }
    rec->policy = "recursive_doubling";  // as algo::automatic names what it chose
    r.close(rec, false);
  }
}
BENCHMARK(record_a_call);

}  // namespace

BENCHMARK_MAIN();
