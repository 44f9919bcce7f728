// collx-reduce-bench: the host reduction loop, collx::ops::apply (ops/apply.hpp), against the two
// loops that bound it, in one run so that the ratios are read from the same machine state (these
// machines are shared and noisy: compare ratios, not absolute numbers).
//
//   apply/<dtype>/<op>/<bytes>   dst = op(dst, src), in place, as a reducing collective does on
//                                receipt: 2 reads + 1 write, reported as 3 x bytes.
//   memcpy/<bytes>               the floor: 1 read + 1 write, reported as 2 x bytes.
//   plain_add/float/<bytes>      c[i] = a[i] + b[i] with restrict pointers: 2 reads + 1 write,
//                                3 x bytes: what apply<float, sum> should match (ratio >= 0.9).
//
//   wire/<format>/encode|add|decode/<bytes>
//                                the compressed formats' codec (ops/wire.hpp) over <bytes> of
//                                float: encode float -> format, add format into float, decode
//                                format -> float, as algo::compressed runs them; reported as the
//                                float bytes handled (the payload), not memory traffic.
//
// bytes_per_second is therefore memory traffic, not payload (except for wire/). The accounting ignores write-allocate:
// memcpy and plain_add write to lines they never read (a cache that allocates on write reads them
// too), while apply in place writes to lines it has just read, so apply can exceed plain_add.
//
//   collx-reduce-bench --benchmark_filter='float|memcpy|plain' --benchmark_repetitions=3
//   collx-reduce-bench --benchmark_filter='wire|memcpy' --benchmark_repetitions=3
// ('float' also matches bfloat16.)
#include <benchmark/benchmark.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include <collx/ops/apply.hpp>
#include <collx/ops/ops.hpp>
#include <collx/ops/wire.hpp>
#include <collx/core/types.hpp>

namespace {

constexpr std::size_t kBig = std::size_t(64) << 20;  // well past the last-level cache: DRAM bandwidth
constexpr std::size_t kSweep[] = {std::size_t(64) << 10, std::size_t(1) << 20, kBig};  // L2, LLC, DRAM

template <class... Ts>
struct list {};

template <class E> constexpr const char* dtype_name = nullptr;
template <> constexpr const char* dtype_name<float> = "float";
template <> constexpr const char* dtype_name<double> = "double";
template <> constexpr const char* dtype_name<std::int32_t> = "int32";
template <> constexpr const char* dtype_name<std::int64_t> = "int64";
template <> constexpr const char* dtype_name<collx::half> = "half";
template <> constexpr const char* dtype_name<collx::bfloat16> = "bfloat16";

using dtypes = list<float, double, std::int32_t, std::int64_t, collx::half, collx::bfloat16>;
using redops = list<collx::ops::sum, collx::ops::prod, collx::ops::min, collx::ops::max, collx::ops::band>;

template <class E>
E from_int(long v) {
  if constexpr (collx::is_reduced_float_v<E>) return E(float(v));
  else return static_cast<E>(v);
}

// Operands stay normal numbers whatever the iteration count: sums of 1s saturate at the type's
// exact-integer limit (no overflow for the iteration counts a benchmark runs), products of 1s stay
// 1, and band with all ones is the identity. The 16-bit types therefore always take the normal-number
// path of their float conversion, as real data does.
template <class E, class Op>
void bm_apply(benchmark::State& st) {
  const auto bytes = std::size_t(st.range(0));
  const std::size_t n = bytes / sizeof(E);
  std::vector<E> dst(n, from_int<E>(1));
  std::vector<E> src(n, from_int<E>(std::is_same_v<Op, collx::ops::band> ? -1 : 1));
  const Op op{};
  for (auto _ : st) {
    collx::ops::apply<E>(op, dst.data(), dst.data(), src.data(), n);
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  st.SetBytesProcessed(std::int64_t(st.iterations()) * std::int64_t(3 * n * sizeof(E)));
  st.SetItemsProcessed(std::int64_t(st.iterations()) * std::int64_t(n));
}

void bm_memcpy(benchmark::State& st) {
  const auto bytes = std::size_t(st.range(0));
  std::vector<char> a(bytes, 1), b(bytes, 2);
  for (auto _ : st) {
    std::memcpy(b.data(), a.data(), bytes);
    benchmark::DoNotOptimize(b.data());
    benchmark::ClobberMemory();
  }
  st.SetBytesProcessed(std::int64_t(st.iterations()) * std::int64_t(2 * bytes));
}

void bm_plain_add(benchmark::State& st) {
  const auto bytes = std::size_t(st.range(0));
  const std::size_t n = bytes / sizeof(float);
  std::vector<float> a(n, 1.0f), b(n, 2.0f), c(n, 0.0f);
  for (auto _ : st) {
    const float* __restrict pa = a.data();
    const float* __restrict pb = b.data();
    float* __restrict pc = c.data();
    for (std::size_t i = 0; i < n; ++i) pc[i] = pa[i] + pb[i];
    benchmark::DoNotOptimize(c.data());
    benchmark::ClobberMemory();
  }
  st.SetBytesProcessed(std::int64_t(st.iterations()) * std::int64_t(3 * n * sizeof(float)));
  st.SetItemsProcessed(std::int64_t(st.iterations()) * std::int64_t(n));
}

// Gradient-like floats: both signs, magnitudes spread over ~6 binades, so MXFP8's blocks get
// scales of their own and its codes every exponent.
std::vector<float> wire_input(std::size_t n) {
  std::vector<float> x(n);
  std::uint32_t h = 12345;
  for (auto& v : x) {
    h = h * 1664525u + 1013904223u;
    v = (float(h >> 8) / float(1u << 24) - 0.5f) * float(1u << ((h >> 3) % 6));
  }
  return x;
}

enum class codec_step { encode, add, decode };

template <class W, codec_step Step>
void bm_wire(benchmark::State& st) {
  const auto bytes = std::size_t(st.range(0));
  const std::size_t n = bytes / sizeof(float);
  const auto x = wire_input(n);
  std::vector<typename W::unit> w(W::units(n));
  std::vector<float> y(n, 0.0f);
  W::encode(x.data(), n, w.data());
  for (auto _ : st) {
    if constexpr (Step == codec_step::encode) W::encode(x.data(), n, w.data());
    if constexpr (Step == codec_step::add) W::add(w.data(), n, y.data());
    if constexpr (Step == codec_step::decode) W::decode(w.data(), n, y.data());
    benchmark::DoNotOptimize(w.data());
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  st.SetBytesProcessed(std::int64_t(st.iterations()) * std::int64_t(bytes));
}

template <class W>
void register_wire(std::size_t bytes) {
  const std::string base = std::string("wire/") + W::name + "/";
  benchmark::RegisterBenchmark((base + "encode").c_str(), &bm_wire<W, codec_step::encode>)->Arg(std::int64_t(bytes))->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark((base + "add").c_str(), &bm_wire<W, codec_step::add>)->Arg(std::int64_t(bytes))->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark((base + "decode").c_str(), &bm_wire<W, codec_step::decode>)->Arg(std::int64_t(bytes))->Unit(benchmark::kMillisecond);
}

template <class E, class Op>
void register_apply(std::size_t bytes) {
  const std::string name = std::string("apply/") + dtype_name<E> + "/" + Op::name;
  benchmark::RegisterBenchmark(name.c_str(), &bm_apply<E, Op>)->Arg(std::int64_t(bytes))->Unit(benchmark::kMicrosecond);
}

template <class... Es, class... Ops>
void register_all(list<Es...>, list<Ops...>) {
  auto per_dtype = []<class E>(std::type_identity<E>) {
    auto per_op = []<class Op>(std::type_identity<Op>) {
      if constexpr (std::is_invocable_r_v<E, const Op&, E, E>) register_apply<E, Op>(kBig);  // band: integers only
    };
    (per_op(std::type_identity<Ops>{}), ...);
  };
  (per_dtype(std::type_identity<Es>{}), ...);
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  // The references first, then every dtype x op at 64 MiB, then the float-sum size sweep.
  for (std::size_t b : kSweep) {
    benchmark::RegisterBenchmark("memcpy", &bm_memcpy)->Arg(std::int64_t(b))->Unit(benchmark::kMicrosecond);
    benchmark::RegisterBenchmark("plain_add/float", &bm_plain_add)->Arg(std::int64_t(b))->Unit(benchmark::kMicrosecond);
  }
  register_all(dtypes{}, redops{});
  for (std::size_t b : kSweep)
    if (b != kBig) register_apply<float, collx::ops::sum>(b);
  register_wire<collx::wire::bf16>(kBig);
  register_wire<collx::wire::mxfp8>(kBig);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
