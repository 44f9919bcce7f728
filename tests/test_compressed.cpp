// algo::compressed (algo/compressed.hpp): float all_reduce with its data on the wire as bf16 or
// MXFP8 (ops/wire.hpp), summed in float at every receiver. The formats are checked against their
// definitions; bf16's all_reduce bit for bit against a serial loop that rounds each contribution
// and the sum as the policy says it does; MXFP8's within the bound its format gives, with the same
// bits on every rank and whatever the all-gather.
#include <catch2/catch.hpp>

#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <mutex>

#include "harness.hpp"

using namespace collx_test;
namespace algo = collx::algo;
namespace wire = collx::wire;

namespace {

/// e4m3's value of code c from the format's definition (1 sign, 4 exponent bits biased by 7,
/// 3 mantissa bits; exponent 0 subnormal; 0x7F/0xFF NaN).
double e4m3_value(int c) {
  const int s = c >> 7, e = (c >> 3) & 15, m = c & 7;
  const double mag = e == 0 ? std::ldexp(m, -9) : std::ldexp(8 + m, e - 10);
  return s ? -mag : mag;
}

/// The code nearest to v among the finite e4m3 values, ties to the even code; 448 past it.
int nearest_e4m3(double v) {
  int best = -1;
  double bd = 0;
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7F) == 0x7F) continue;  // NaN
    if ((c & 0x80) && (v > 0 || (v == 0 && !std::signbit(v)))) continue;  // same sign as v
    if (!(c & 0x80) && (v < 0 || std::signbit(v))) continue;
    const double d = std::fabs(e4m3_value(c) - v);
    if (best < 0 || d < bd || (d == bd && (c & 1) == 0)) {
      best = c;
      bd = d;
    }
  }
  return best;
}

float input(int rank, std::size_t i) {
  const std::uint64_t h = mixed(rank, i);
  return float(std::ldexp(unit_of(h), int((h >> 24) % 13) - 6));  // magnitudes over 2^±6
}

std::vector<float> inputs(int rank, std::size_t count) {
  std::vector<float> v(count);
  for (std::size_t i = 0; i < count; ++i) v[i] = input(rank, i);
  return v;
}

float to_bf16(float x) { return float(collx::bfloat16(x)); }

/// bf16's serial reference: each contribution rounded to bf16, summed in float in rank order,
/// (avg: divided by n) and the sum rounded to bf16.
std::vector<float> bf16_reference(int n, std::size_t count, bool avg) {
  std::vector<float> v(count);
  for (std::size_t i = 0; i < count; ++i) {
    float acc = 0;
    for (int q = 0; q < n; ++q) acc += to_bf16(input(q, i));
    if (avg) acc = acc / float(n);
    v[i] = to_bf16(acc);
  }
  return v;
}

/// MXFP8's bound for element i of the sum: each contribution and the sum off by at most 2^-4 of
/// themselves or half of e4m3's subnormal step at their block's scale, which is at most
/// 2 x amax / 448 (amax: the largest magnitude of the 32 values the scale is shared by).
std::vector<double> mxfp8_bound(int n, std::size_t count, std::vector<double>& exact) {
  std::vector<double> mag(count), bound(count);
  exact.assign(count, 0);
  for (std::size_t i = 0; i < count; ++i)
    for (int q = 0; q < n; ++q) {
      exact[i] += input(q, i);
      mag[i] += std::fabs(input(q, i));
    }
  for (std::size_t g = 0; g < count; g += 32) {
    const std::size_t end = std::min(count, g + 32);
    double amax_sum = 0, amax_in = 0;  // (the sum's block amax <= the largest sum of magnitudes)
    for (int q = 0; q < n; ++q) {
      double a = 0;
      for (std::size_t i = g; i < end; ++i) a = std::max(a, double(std::fabs(input(q, i))));
      amax_in += a;
    }
    for (std::size_t i = g; i < end; ++i) amax_sum = std::max(amax_sum, mag[i]);
    for (std::size_t i = g; i < end; ++i)
      bound[i] = 1.001 * (std::ldexp(mag[i] + std::fabs(exact[i]) + std::ldexp(mag[i], -4), -4) +
                          std::ldexp(2 * (amax_in + amax_sum * (1 + 1.0 / 16)) / 448, -10)) +
                 1e-30;
  }
  return bound;
}

/// all_reduce under compressed<W, G> on n ranks started by L, out of place and in place; every
/// rank's result checked by check(result) and against rank 0's bits.
template <class W, class L = threads, class G = algo::ring, class Op = collx::ops::sum, class Check>
std::string run(int n, std::size_t count, Check check, std::size_t segment = 0) {
  algo::compressed<W, G> a;
  if (segment != 0) a.segment = segment;
  return run_checked<L>(n, [&](auto& comm, auto note) {
    const auto in = inputs(comm.rank(), count);
    std::vector<float> out(count);
    collx::all_reduce(comm, std::span<const float>{in}, std::span{out}, Op{}, a);
    note(check(out));
    std::vector<float> io = in;
    collx::all_reduce(comm, std::span{io}, Op{}, a);
    if (io != out) note("in place differs from out of place");
    // every rank the same bits: rank 0's result broadcast and compared
    std::vector<float> zero = out;
    collx::broadcast(comm, std::span{zero}, 0, algo::ring{});
    if (count != 0 && std::memcmp(zero.data(), out.data(), count * sizeof(float)) != 0) note("rank " + std::to_string(comm.rank()) + " differs from rank 0");
  });
}

std::string compare_floats(const std::vector<float>& got, const std::vector<float>& want) {
  for (std::size_t i = 0; i < want.size(); ++i)
    if (std::bit_cast<std::uint32_t>(got[i]) != std::bit_cast<std::uint32_t>(want[i]))
      return "element " + std::to_string(i) + ": got " + std::to_string(got[i]) + ", want " + std::to_string(want[i]);
  return {};
}

std::string within(const std::vector<float>& got, const std::vector<double>& exact, const std::vector<double>& bound) {
  for (std::size_t i = 0; i < exact.size(); ++i)
    if (!(std::fabs(double(got[i]) - exact[i]) <= bound[i]))
      return "element " + std::to_string(i) + ": got " + std::to_string(got[i]) + ", exact " + std::to_string(exact[i]) +
             ", off by " + std::to_string(std::fabs(double(got[i]) - exact[i])) + " > " + std::to_string(bound[i]);
  return {};
}

}  // namespace

TEST_CASE("wire::mxfp8's e4m3: every code's value is the format's, and a float goes to the nearest code, ties to even, saturating",
          "[compressed][wire]") {
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7F) == 0x7F) continue;
    CAPTURE(c);
    CHECK(double(wire::mxfp8::value(std::uint8_t(c))) == e4m3_value(c));
  }
  CHECK(e4m3_value(0x7E) == 448);
  // every value halfway between two codes (the ties), the codes themselves, and values between
  std::vector<double> probes;
  for (int c = 0; c < 0x7E; ++c) {
    const double a = e4m3_value(c), b = e4m3_value(c + 1);
    for (double t : {0.0, 0.25, 0.5, 0.75, 0.999}) probes.push_back(a + (b - a) * t);
  }
  for (double v : {448.0, 449.0, 463.9, 464.0, 500.0, 1e6}) probes.push_back(v);
  for (double v : probes)
    for (double s : {1.0, -1.0}) {
      const float f = float(v * s);
      CAPTURE(f);
      CHECK(int(wire::mxfp8::code(f)) == nearest_e4m3(double(f)));
    }
}

TEST_CASE("wire formats: bf16 rounds as collx::bfloat16, and an mxfp8 block's scale, zeros, partial blocks and NaN", "[compressed][wire]") {
  const float specials[] = {0.0f, -0.0f, 1.0f, 1.00390625f, 1.005859375f, -3.3e-38f, 3.39e38f, std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN(), 1e-40f};
  for (float x : specials) {
    std::uint16_t u = 0;
    wire::bf16::encode(&x, 1, &u);
    CAPTURE(x);
    CHECK(u == collx::bfloat16(x).bits);
  }
  for (std::size_t n : {1, 31, 32, 33, 95}) {
    CAPTURE(n);
    std::vector<float> x(n);
    for (std::size_t i = 0; i < n; ++i) x[i] = input(0, i) * 1000.0f;
    std::vector<std::uint8_t> u(wire::mxfp8::units(n));
    CHECK(u.size() == n + (n + 31) / 32);
    wire::mxfp8::encode(x.data(), n, u.data());
    std::vector<float> y(n);
    wire::mxfp8::decode(u.data(), n, y.data());
    for (std::size_t g = 0; g < n; g += 32) {
      const std::size_t end = std::min(n, g + 32);
      float amax = 0;
      for (std::size_t i = g; i < end; ++i) amax = std::max(amax, std::fabs(x[i]));
      const float scale = wire::mxfp8::scale(u[g / 32 * 33]);
      CHECK(amax / scale > 224.0f);
      CHECK(amax / scale <= 448.0f);
      for (std::size_t i = g; i < end; ++i) {
        CAPTURE(i, x[i], y[i]);
        CHECK(std::fabs(y[i] - x[i]) <= std::max(std::fabs(x[i]) / 16, scale / 1024));
      }
    }
    // add() is decode() summed into what is there
    std::vector<float> acc(n, 1.0f);
    wire::mxfp8::add(u.data(), n, acc.data());
    for (std::size_t i = 0; i < n; ++i) CHECK(acc[i] == 1.0f + y[i]);
  }
  {  // zeros, and a NaN that makes its block NaN (and no other)
    std::vector<float> x(64, 0.0f);
    x[40] = std::numeric_limits<float>::quiet_NaN();
    std::vector<std::uint8_t> u(wire::mxfp8::units(64));
    wire::mxfp8::encode(x.data(), 64, u.data());
    std::vector<float> y(64);
    wire::mxfp8::decode(u.data(), 64, y.data());
    for (std::size_t i = 0; i < 32; ++i) CHECK(y[i] == 0.0f);
    for (std::size_t i = 32; i < 64; ++i) CHECK(std::isnan(y[i]));
  }
}

TEST_CASE("compressed<bf16>: all_reduce equals the serial loop that rounds each contribution and the sum to bf16, bit for bit",
          "[compressed]") {
  for (int n : rank_counts()) {
    for (std::size_t count : counts_for(n)) {
      CAPTURE(n, count);
      const auto want = bf16_reference(n, count, false);
      CHECK(run<wire::bf16>(n, count, [&](const std::vector<float>& got) { return compare_floats(got, want); }) == "");
    }
  }
  // avg: the float sum divided once, then rounded; and segments (here of 1000 elements)
  for (int n : {2, 3, 7}) {
    CAPTURE(n);
    const auto mean = bf16_reference(n, 100003, true);
    CHECK(run<wire::bf16, threads, algo::ring, collx::ops::avg>(n, 100003, [&](const std::vector<float>& got) { return compare_floats(got, mean); }) == "");
    const auto want = bf16_reference(n, 10007, false);
    CHECK(run<wire::bf16>(n, 10007, [&](const std::vector<float>& got) { return compare_floats(got, want); }, 1000) == "");
  }
  // and it is not the plain float sum: the data did travel as bf16
  const auto in0 = inputs(0, 1001), in1 = inputs(1, 1001);
  const auto want = bf16_reference(2, 1001, false);
  std::size_t differ = 0;
  for (std::size_t i = 0; i < 1001; ++i) differ += want[i] != in0[i] + in1[i];
  CHECK(differ > 500);
}

TEST_CASE("compressed<bf16> in a fused batch: every part the same bits as the serial loop, whatever the batch's layout", "[compressed]") {
  for (int n : {2, 3, 5}) {
    CAPTURE(n);
    const std::vector<std::size_t> sizes{1, 1001, 7, std::size_t(n + 1), 30011};
    std::size_t total = 0;
    for (std::size_t c : sizes) total += c;
    const auto want = bf16_reference(n, total, false);
    CHECK(run_checked<threads>(n, [&](auto& comm, auto note) {
            const auto in = inputs(comm.rank(), total);
            std::vector<std::vector<float>> parts;
            std::size_t at = 0;
            for (std::size_t c : sizes) {
              parts.emplace_back(in.begin() + std::ptrdiff_t(at), in.begin() + std::ptrdiff_t(at + c));
              at += c;
            }
            collx::fused f(comm);
            for (auto& p : parts) f.all_reduce(std::span{p}, collx::ops::sum{}, algo::compressed<wire::bf16>{});
            f.run();
            at = 0;
            for (auto& p : parts) {
              const std::vector<float> w(want.begin() + std::ptrdiff_t(at), want.begin() + std::ptrdiff_t(at + p.size()));
              if (auto d = compare_floats(p, w); !d.empty()) note("part at " + std::to_string(at) + ": " + d);
              at += p.size();
            }
          }) == "");
  }
}

TEST_CASE("compressed<mxfp8>: all_reduce within the format's bound, the same bits on every rank and whatever the all-gather",
          "[compressed]") {
  for (int n : rank_counts()) {
    for (std::size_t count : counts_for(n)) {
      CAPTURE(n, count);
      std::vector<double> exact;
      const auto bound = mxfp8_bound(n, count, exact);
      // every rank's thread runs the check: one writes the result the second run compares with
      std::vector<float> ring_result;
      std::once_flag kept;
      CHECK(run<wire::mxfp8>(n, count, [&](const std::vector<float>& got) {
              std::call_once(kept, [&] { ring_result = got; });
              return within(got, exact, bound);
            }) == "");
      CHECK(run<wire::mxfp8, threads, algo::recursive_halving>(n, count, [&](const std::vector<float>& got) {
              return compare_floats(got, ring_result);
            }) == "");
    }
  }
  // segments: each its own blocks of 32 (the bound's groups stay aligned: 992 = 31 x 32)
  for (int n : {3, 5}) {
    CAPTURE(n);
    std::vector<double> exact;
    const auto bound = mxfp8_bound(n, 30011, exact);
    CHECK(run<wire::mxfp8>(n, 30011, [&](const std::vector<float>& got) { return within(got, exact, bound); }, 992 * std::size_t(n)) == "");
  }
}

TEST_CASE("compressed over shared memory and tcp: the same bits as the serial bf16 loop, mxfp8 within its bound", "[compressed][processes]") {
  for (int n : {2, 3, 5}) {
    for (std::size_t count : {std::size_t(1), std::size_t(n + 1), std::size_t(100003)}) {
      CAPTURE(n, count);
      const auto want = bf16_reference(n, count, false);
      CHECK(run<wire::bf16, processes>(n, count, [&](const std::vector<float>& got) { return compare_floats(got, want); }) == "");
      std::vector<double> exact;
      const auto bound = mxfp8_bound(n, count, exact);
      CHECK(run<wire::mxfp8, processes_tcp>(n, count, [&](const std::vector<float>& got) { return within(got, exact, bound); }) == "");
    }
  }
}

TEST_CASE("compressed: ranks that pass different formats fail as a mismatch, naming the call", "[compressed][errors]") {
  std::vector<std::string> what(3);
  collx::launch_threads(3, [&](auto& comm) {
    std::vector<float> v(1000, 1.0f);
    try {
      if (comm.rank() == 1) collx::all_reduce(comm, std::span{v}, collx::ops::sum{}, algo::compressed<wire::mxfp8>{});
      else collx::all_reduce(comm, std::span{v}, collx::ops::sum{}, algo::compressed<wire::bf16>{});
    } catch (const collx::error& e) {
      what[std::size_t(comm.rank())] = e.what();
    }
  });
  for (const auto& w : what) {
    CAPTURE(w);
    CHECK_THAT(w, Catch::Contains("all_reduce"));
    CHECK_THAT(w, Catch::Contains("compressed("));
  }
}

// A call of several segments runs its codec on a side thread: a peer that never comes fails the
// others' call (naming it and the peer) and the side thread is joined on that path too, so the
// next call's error is the same and nothing is left behind (a thread not joined would end the
// program).
TEST_CASE("compressed: a peer that never calls fails a call of several segments on the others, naming the call, every time",
          "[compressed][errors]") {
  collx::options o;
  o.timeout = std::chrono::milliseconds(300);
  std::vector<std::string> what(3);
  collx::launch_threads(
      3,
      [&](auto& comm) {
        if (comm.rank() == 2) return;
        algo::compressed<wire::mxfp8> a;
        a.segment = 96;
        std::vector<float> v(1000, 1.0f);
        for (int call = 0; call < 2; ++call) {
          try {
            collx::all_reduce(comm, std::span{v}, collx::ops::sum{}, a);
            what[std::size_t(comm.rank())] += "completed;";
          } catch (const collx::error& e) {
            what[std::size_t(comm.rank())] += std::string(e.what()) + ";";
          }
        }
      },
      o);
  for (int r = 0; r < 2; ++r) {
    const auto& w = what[std::size_t(r)];
    CAPTURE(r, w);
    CHECK_THAT(w, Catch::Contains("all_reduce"));
    CHECK_THAT(w, !Catch::Contains("completed"));
  }
}
