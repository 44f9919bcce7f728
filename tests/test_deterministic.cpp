// algo::deterministic (algo/deterministic.hpp): every element's result is the ranks' inputs
// reduced in rank order, ((x_0 ⊕ x_1) ⊕ x_2) ⊕ ..., in the op's accumulator type and rounded
// once. Each case compares bit for bit with a serial loop that does exactly that, so results
// equal across the all-gather chosen inside the mode, segments, fused layouts, rank and transport.
#include <catch2/catch.hpp>

#include "schedules.hpp"

#include <cmath>
#include <cstdint>
#include <thread>

#include <collx/algo/order.hpp>
#include <collx/transport/planned.hpp>

#include "harness.hpp"
#include "precision.hpp"

using namespace collx_test;
namespace algo = collx::algo;

namespace {

/// A value per (rank, element) whose magnitude varies over 2^±20 (sum, avg, user ops), so the
/// order of addition shows in the low bits; near 1 for prod, so products stay finite.
template <class E, class Op>
E value(int rank, std::size_t i) {
  const std::uint64_t h = mixed(rank, i);
  const double u = unit_of(h);  // [-1, 1)
  if constexpr (std::is_same_v<Op, collx::ops::prod>) return E(float(1 + u / 16));
  else if constexpr (std::is_same_v<E, collx::half>) return E(float(std::ldexp(u, int((h >> 24) % 17) - 8)));  // (half's range)
  else return E(float(std::ldexp(u, int((h >> 24) % 41) - 20)));
}

template <class E, class Op>
std::vector<E> values(int rank, std::size_t count, std::size_t from = 0) {
  std::vector<E> v(count);
  for (std::size_t i = 0; i < count; ++i) v[i] = value<E, Op>(rank, from + i);
  return v;
}

/// The serial reference: rank order, in the accumulator type; avg divides there; one rounding.
template <class E, class Op>
std::vector<E> rank_order(const Op& op, int n, std::size_t count) {
  using A = collx::accumulator_t<Op, E>;
  std::vector<E> v(count);
  for (std::size_t i = 0; i < count; ++i) {
    A acc = A(value<E, Op>(0, i));
    for (int q = 1; q < n; ++q) acc = op(acc, A(value<E, Op>(q, i)));
    if constexpr (collx::has_finalize_v<Op, A>) acc = Op::finalize(acc, n);
    v[i] = E(acc);
  }
  return v;
}

/// all_reduce (out of place and in place), reduce_scatter (out of place and in place) and
/// reduce (at two roots) under policy `a`, every count, each against the serial reference.
template <class E, class Op, class L = threads, class Algo>
std::string all_three(int n, const std::vector<std::size_t>& counts, Algo a, Op op = {}) {
  // (the references once, before the ranks start: n·count and n²·count values)
  std::vector<std::vector<E>> wants, wholes;
  for (std::size_t count : counts) {
    wants.push_back(rank_order<E>(op, n, count));
    wholes.push_back(rank_order<E>(op, n, count * std::size_t(n)));
  }
  return run_checked<L>(n, [&](auto& comm, auto note) {
    const int r = comm.rank();
    for (std::size_t c = 0; c < counts.size(); ++c) {
      const std::size_t count = counts[c];
      const std::string at = " (count " + std::to_string(count) + ")";
      const auto& want = wants[c];
      const auto in = values<E, Op>(r, count);
      std::vector<E> out(count);
      collx::all_reduce(comm, std::span<const E>{in}, std::span{out}, op, a);
      if (auto d = compare(out, want); !d.empty()) note("all_reduce" + at + ": " + d);
      std::vector<E> io = in;
      collx::all_reduce(comm, std::span{io}, op, a);
      if (auto d = compare(io, want); !d.empty()) note("all_reduce in place" + at + ": " + d);
      for (int root : {0, n - 1}) {
        std::vector<E> red(r == root ? count : 0);
        collx::reduce(comm, std::span<const E>{in}, std::span{red}, op, root, a);
        if (r == root)
          if (auto d = compare(red, want); !d.empty()) note("reduce to " + std::to_string(root) + at + ": " + d);
      }
      // reduce_scatter: `count` elements a rank, so the reference is that of n·count
      const auto& whole = wholes[c];
      const std::vector<E> mine(whole.begin() + std::ptrdiff_t(count * std::size_t(r)), whole.begin() + std::ptrdiff_t(count * std::size_t(r + 1)));
      const auto rin = values<E, Op>(r, count * std::size_t(n));
      std::vector<E> part(count);
      collx::reduce_scatter(comm, std::span<const E>{rin}, std::span{part}, op, a);
      if (auto d = compare(part, mine); !d.empty()) note("reduce_scatter" + at + ": " + d);
      std::vector<E> rio = rin;
      collx::reduce_scatter(comm, std::span<const E>{rio}, std::span{rio}.subspan(count * std::size_t(r), count), op, a);
      if (auto d = compare(rio, mine, count * std::size_t(r)); !d.empty()) note("reduce_scatter in place" + at + ": " + d);
    }
  });
}

std::vector<std::size_t> det_counts(int n) {
  auto v = counts_for(n);
  v.push_back(1001);
  return v;
}

/// One all_reduce of input<E>() under `a` at n ranks, each rank's result measured against the
/// exact sums. `one_rounding`: every rank notes an element more than 0.5 ulp off or not correctly
/// rounded. Rank 0's error lands in *err (ranks as threads).
template <class E, class Op, class L = threads, class Algo>
std::string measured(int n, std::size_t count, Algo a, bool one_rounding, collx_precision::error* err = nullptr, Op op = {}) {
  const auto exact = collx_precision::exact_sums<E>(n, count);
  return run_checked<L>(n, [&](auto& comm, auto note) {
    std::vector<E> v(count);
    for (std::size_t i = 0; i < count; ++i) v[i] = collx_precision::input<E>(comm.rank(), i);
    collx::all_reduce(comm, std::span{v}, op, a);
    collx_precision::error e;
    e.add(v.data(), exact, count);
    if (one_rounding && (e.max_ulp > 0.5 || e.wrong != 0))
      note("max error " + std::to_string(e.max_ulp) + " ulp (element " + std::to_string(e.worst) + "), " +
           std::to_string(e.wrong) + " of " + std::to_string(e.n()) + " not correctly rounded");
    if (err != nullptr && comm.rank() == 0) *err = e;
  });
}

}  // namespace

TEST_CASE("the inputs make the order of addition show: rank order and reverse order differ", "[deterministic]") {
  // (what makes the cases below able to fail: a policy that added in another order would differ)
  for (int n : {3, 5, 8}) {
    std::size_t differ = 0;
    for (std::size_t i = 0; i < 1001; ++i) {
      float fwd = value<float, collx::ops::sum>(0, i), back = value<float, collx::ops::sum>(n - 1, i);
      for (int q = 1; q < n; ++q) fwd += value<float, collx::ops::sum>(q, i);
      for (int q = n - 2; q >= 0; --q) back += value<float, collx::ops::sum>(q, i);
      differ += fwd != back;
    }
    CAPTURE(n, differ);
    CHECK(differ > 100);
  }
  // and the accumulator shows: float summed in double, rounded once, differs from float's sum
  {
    const auto in_float = rank_order<float>(collx::ops::sum{}, 8, 1001);
    const auto in_double = rank_order<float>(collx::ops::accumulate_in<double>{}, 8, 1001);
    std::size_t differ = 0;
    for (std::size_t i = 0; i < in_float.size(); ++i) differ += in_float[i] != in_double[i];
    CAPTURE(differ);
    CHECK(differ > 10);
  }
  // and the ring, the tree and recursive halving do add in other orders
  for (int n : {5, 8}) {
    const auto want = rank_order<float>(collx::ops::sum{}, n, 1001);
    std::string ring_differs;
    run_checked<threads>(n, [&](auto& comm, auto) {
      auto in = values<float, collx::ops::sum>(comm.rank(), 1001);
      collx::all_reduce(comm, std::span{in}, collx::ops::sum{}, algo::ring{});
      if (comm.rank() == 0) ring_differs = compare(in, want);
    });
    CAPTURE(n);
    CHECK(ring_differs != "");
  }
}

TEMPLATE_TEST_CASE("deterministic<Inner>: all_reduce, reduce_scatter and reduce equal the serial rank-order reduction bit for bit",
                   "[deterministic]", algo::ring, algo::tree, algo::recursive_halving, algo::pairwise, algo::automatic) {
  for (int n : rank_counts()) {
    CAPTURE(n);
    CHECK(all_three<float, collx::ops::sum>(n, det_counts(n), algo::deterministic<TestType>{}) == "");
  }
}

TEST_CASE("deterministic: every op and element type, in its accumulator (half and bfloat16 in float, float in double when asked)",
          "[deterministic]") {
  const auto user = collx::ops::make([](float a, float b) { return a * 0.75f + b; }, collx::ops::non_commutative);
  for (int n : {2, 3, 5, 8}) {
    CAPTURE(n);
    const std::vector<std::size_t> counts{1, std::size_t(n + 1), 1001, 30011};
    CHECK(all_three<float, collx::ops::prod>(n, counts, algo::deterministic<>{}) == "");
    CHECK(all_three<float, collx::ops::avg>(n, counts, algo::deterministic<>{}) == "");
    CHECK(all_three<double, collx::ops::sum>(n, counts, algo::deterministic<algo::ring>{}) == "");
    CHECK(all_three<collx::bfloat16, collx::ops::sum>(n, counts, algo::deterministic<>{}) == "");
    CHECK(all_three<collx::half, collx::ops::sum>(n, counts, algo::deterministic<algo::pairwise>{}) == "");
    CHECK(all_three<float, collx::ops::accumulate_in<double>>(n, counts, algo::deterministic<>{}) == "");
    CHECK(all_three<collx::bfloat16, collx::ops::accumulate_in<float, collx::ops::avg>>(n, counts, algo::deterministic<>{}) == "");
    CHECK(all_three<float, decltype(user)>(n, counts, algo::deterministic<algo::tree>{}, user) == "");
  }
}

namespace {
/// two_level<shm, tcp> (launch_node_processes): nodes of n - n/2 and n/2 processes, ranks dealt
/// round robin, so a step's peers lie on both levels and a chain of receives crosses the two
/// transports (engine::cross_order).
struct node_processes {
  template <class F>
  void operator()(int n, F&& f) const {
    collx::launch_node_processes(collx::node_map::of_sizes({n - n / 2, n / 2}, true), std::forward<F>(f));
  }
};
}  // namespace

TEST_CASE("deterministic over shared memory and tcp: the same bits as the serial reduction", "[deterministic][processes]") {
  for (int n : {2, 3, 5, 8}) {
    CAPTURE(n);
    const std::vector<std::size_t> counts{0, 1, std::size_t(n + 1), 100003};
    CHECK(all_three<float, collx::ops::sum, processes>(n, counts, algo::deterministic<>{}) == "");
    if (n == 3 || n == 5) CHECK(all_three<float, collx::ops::sum, node_processes>(n, counts, algo::deterministic<>{}) == "");
    CHECK(all_three<collx::bfloat16, collx::ops::sum, processes_tcp>(n, counts, algo::deterministic<algo::ring>{}) == "");
    CHECK(all_three<float, collx::ops::sum, processes_tcp>(n, counts, algo::deterministic<algo::recursive_halving>{}) == "");
  }
}

TEST_CASE("deterministic: a large all_reduce runs in segments and a fused batch packs its parts, with the same bits", "[deterministic]") {
  // past tuning::all_reduce_segment_from_bytes, a partial last segment
  const std::size_t big = algo::tuning::all_reduce_segment_from_bytes / 4 + 262147;
  for (int n : {3, 5}) {
    CAPTURE(n);
    const auto want = rank_order<float>(collx::ops::sum{}, n, big);
    CHECK(run_checked<threads>(n, [&](auto& comm, auto note) {
            auto v = values<float, collx::ops::sum>(comm.rank(), big);
            collx::all_reduce(comm, std::span{v}, collx::ops::sum{}, algo::deterministic<algo::ring>{});
            note(compare(v, want));
          }) == "");
    CHECK(run_checked<threads>(n, [&](auto& comm, auto note) {
            // parts of a fused batch: each equals its own serial reduction (the same elements
            // as separate calls, whatever the pack's layout)
            const std::size_t sizes[] = {1, 1001, 7, std::size_t(n + 1), 30011};
            std::vector<std::vector<float>> parts;
            std::size_t from = 0;
            collx::fused f(comm);
            for (std::size_t c : sizes) {
              parts.push_back(values<float, collx::ops::sum>(comm.rank(), c, from));
              from += c;
            }
            for (auto& p : parts) f.all_reduce(std::span{p}, collx::ops::sum{}, algo::deterministic<algo::ring>{});
            f.run();
            const auto want = rank_order<float>(collx::ops::sum{}, n, from);
            std::size_t at = 0;
            for (auto& p : parts) {
              const std::vector<float> w(want.begin() + std::ptrdiff_t(at), want.begin() + std::ptrdiff_t(at + p.size()));
              if (auto d = compare(p, w); !d.empty()) note("fused part at " + std::to_string(at) + ": " + d);
              at += p.size();
            }
          }) == "");
  }
}

TEST_CASE("options::deterministic (COLLX_DETERMINISTIC=1): every policy's floating reduction is the rank-order one", "[deterministic][options]") {
  collx::options o;
  o.deterministic = true;
  for (int n : {2, 3, 5, 8}) {
    CAPTURE(n);
    const std::size_t count = 1001;
    const auto want = rank_order<float>(collx::ops::sum{}, n, count);
    failures f(n);
    collx::launch_threads(n, [&](auto& comm) {
      const int r = comm.rank();
      auto note = [&](const std::string& s) { f.note(r, s); };
      const auto in = values<float, collx::ops::sum>(r, count);
      auto each = [&](const char* what, auto pol) {
        std::vector<float> v = in;
        collx::all_reduce(comm, std::span{v}, collx::ops::sum{}, pol);
        if (auto d = compare(v, want); !d.empty()) note(std::string("all_reduce, ") + what + ": " + d);
        std::vector<float> red(r == 0 ? count : 0);
        collx::reduce(comm, std::span<const float>{in}, std::span{red}, collx::ops::sum{}, 0, pol);
        if (r == 0)
          if (auto d = compare(red, want); !d.empty()) note(std::string("reduce, ") + what + ": " + d);
      };
      each("ring", algo::ring{});
      each("tree", algo::tree{});
      each("recursive_halving", algo::recursive_halving{});
      each("automatic", algo::automatic{});
      // reduce_scatter too
      const auto whole = rank_order<float>(collx::ops::sum{}, n, count * std::size_t(n));
      const auto rin = values<float, collx::ops::sum>(r, count * std::size_t(n));
      std::vector<float> part(count);
      collx::reduce_scatter(comm, std::span<const float>{rin}, std::span{part}, collx::ops::sum{}, algo::ring{});
      const std::vector<float> mine(whole.begin() + std::ptrdiff_t(count * std::size_t(r)), whole.begin() + std::ptrdiff_t(count * std::size_t(r + 1)));
      if (auto d = compare(part, mine); !d.empty()) note("reduce_scatter, ring: " + d);
      // (recursive_doubling has no reduce: its all_reduce alone)
      std::vector<float> v = in;
      collx::all_reduce(comm, std::span{v}, collx::ops::sum{}, algo::recursive_doubling{});
      if (auto d = compare(v, want); !d.empty()) note("all_reduce, recursive_doubling: " + d);
      // and integers and min, whose bits no order changes, stay on their policies (and right)
      std::vector<int> iv = inputs<int, collx::ops::sum>(r, count);
      collx::all_reduce(comm, std::span{iv}, collx::ops::sum{}, algo::ring{});
      note(compare(iv, reference<int>(collx::ops::sum{}, n, count)));
    }, o);
    CHECK(f.first() == "");
  }
  // the variable sets the default; a value other than 0 or 1 is an error naming it
  ::setenv("COLLX_DETERMINISTIC", "1", 1);
  CHECK(collx::options{}.deterministic);
  ::setenv("COLLX_DETERMINISTIC", "yes", 1);
  try {
    (void)collx::options{};
    FAIL("COLLX_DETERMINISTIC=yes was taken");
  } catch (const collx::error& e) {
    CHECK(e.code() == collx::errc::invalid_argument);
    CHECK_THAT(e.what(), Catch::Contains("COLLX_DETERMINISTIC"));
  }
  ::unsetenv("COLLX_DETERMINISTIC");
  CHECK_FALSE(collx::options{}.deterministic);
}

TEST_CASE("the order each policy adds in, read off its schedules: deterministic's is rank order, the others' are not", "[deterministic][order]") {
  namespace model = collx::model;
  auto orders = [](const auto& pol, model::problem pr, std::size_t in, std::size_t out) {
    return algo::addition_order(model::schedules(pol, pr), in, out);
  };
  auto rank_order_text = [](int n) {
    std::string e = "x0";
    for (int q = 1; q < n; ++q) e = (q == 1 ? e : "(" + e + ")") + " + x" + std::to_string(q);
    return e;
  };
  for (int n : {2, 3, 4, 5, 8})
    for (bool stepwise : {false, true}) {  // contributions folded once landed, or reduced as they arrive
      CAPTURE(n, stepwise);
      const std::string want = rank_order_text(n);
      const std::size_t count = std::size_t(n) * 3 + 1;  // uneven blocks
      using C = collx::algo::collective;
      for (const auto& got : orders(algo::deterministic<algo::ring>{}, {C::all_reduce, n, count, 4, 0, true, stepwise}, count, count))
        for (const auto& e : got) CHECK(e == want);
      // blocks past tuning::a2a_one_step_bytes: the exchange in N-1 steps (elements of 64 MiB, on symbols)
      for (const auto& got : orders(algo::deterministic<algo::ring>{}, {C::all_reduce, n, count, std::size_t(1) << 26, 0, true, stepwise}, count, count))
        for (const auto& e : got) CHECK(e == want);
      const auto steps = model::schedules(algo::deterministic<algo::ring>{}, {C::reduce_scatter, n, 1, std::size_t(1) << 26, 0, true, stepwise});
      // N-1 exchanges, then the fold; stepwise: up, then down
      CHECK(int(steps[0].steps().size()) == (n == 1 ? 1 : stepwise ? 2 : n));
      for (const auto& got : orders(algo::deterministic<algo::pairwise>{}, {C::reduce_scatter, n, 3, 4, 0, true, stepwise}, 3 * std::size_t(n), 3))
        for (const auto& e : got) CHECK(e == want);
      const auto red = orders(algo::deterministic<>{}, {C::reduce, n, count, 4, n - 1, true, stepwise}, count, count);
      for (const auto& e : red[std::size_t(n - 1)]) CHECK(e == want);
      if (stepwise) continue;
      // the ring adds block b from rank b+1 on: its last block alone is in rank order
      if (n > 2) {
        const auto ring = orders(algo::ring{}, {collx::algo::collective::all_reduce, n, std::size_t(n)}, std::size_t(n), std::size_t(n));
        CHECK(ring[0][0] != want);
        CHECK(ring[0][std::size_t(n - 1)] == want);
        if (n == 4) CHECK(ring[0][0] == "((x1 + x2) + x3) + x0");  // block 0 from rank 1 on
      }
    }
}

namespace {
int slow_rank_me = -1;  // this process's rank, for the op below (each forked rank has its own)
}

TEST_CASE("a receive held back behind another waits for it, though its own peer has sent all and left", "[deterministic][processes]") {
  // N = 3 over shared memory, one element a block, reduced as it arrives (a user's op reduces
  // stepwise): rank 0 reduces rank 1's contribution into its block, then rank 2's. Rank 1 is
  // slow (its op sleeps once); rank 2 sends eagerly and returns, its communicator gone, before
  // rank 0 may take its message. Rank 0 waits for rank 1 and then takes rank 2's message; it
  // does not blame rank 2 (the engine blamed the peer of every unfinished operation).
  const auto slow_sum = collx::ops::make(
      [](float a, float b) {
        static bool slept = false;
        if (slow_rank_me == 1 && !slept) {
          slept = true;
          std::this_thread::sleep_for(std::chrono::milliseconds(300));
        }
        return a + b;
      },
      collx::ops::non_commutative);
  static_assert(collx::stepwise_exact_v<decltype(slow_sum), float>);
  const int n = 3;
  auto input = [](int q, int i) { return 1.0f / float(3 * q + i + 7); };
  CHECK(collx_test::run_checked<processes>(n, [&](auto& comm, auto note) {
          slow_rank_me = comm.rank();
          std::vector<float> in(n), out(1);
          for (int i = 0; i < n; ++i) in[std::size_t(i)] = input(comm.rank(), i);
          collx::reduce_scatter(comm, std::span<const float>(in), std::span<float>(out), slow_sum, algo::deterministic<algo::ring>{});
          float want = input(0, comm.rank());
          for (int q = 1; q < n; ++q) want = want + input(q, comm.rank());
          if (!collx_test::same(out[0], want)) note("got " + collx_test::show(out[0]) + ", want " + collx_test::show(want));
        }) == "");
}

TEST_CASE("deterministic's schedules match across ranks, folded or reduced as they arrive", "[deterministic][schedule]") {
  using C = collx::algo::collective;
  for (int n : {1, 2, 3, 5, 7, 13, 16})
    for (std::size_t count : {std::size_t(0), std::size_t(1), std::size_t(n - 1), std::size_t(n + 1), std::size_t(1000003)})
      for (C c : {C::all_reduce, C::reduce_scatter, C::reduce})
        for (int root : {0, n / 3, n - 1})
          for (bool stepwise : {false, true}) {
            CAPTURE(n, count, collx::model::name(c), root, stepwise);
            const auto all = collx::model::schedules(algo::deterministic<algo::ring>{}, {c, n, count, 4, root, false, stepwise});
            CHECK(collx_test::check_consistent(all) == "");
            // reduced as they arrive: one block of scratch at most, and no fold of N sources
            if (stepwise && c == C::reduce_scatter)
              for (const auto& s : all) {
                CHECK(s.tmp_elems() <= count);
                for (const auto& f : s.folds()) CHECK(f.srcs_end - f.srcs_begin <= 2);
              }
          }
}

TEST_CASE("deterministic on a transport that runs whole schedules fails at once, naming the mode, on every rank", "[deterministic][errors]") {
  for (int n : {1, 3}) {
    std::vector<std::string> what(static_cast<std::size_t>(n));
    collx::launch_threads<collx::transport::planned>(n, [&](auto& comm) {
      std::vector<float> v(17, 1.0f);
      try {
        collx::all_reduce(comm, std::span{v}, collx::ops::sum{}, algo::deterministic<>{});
      } catch (const collx::error& e) {
        what[std::size_t(comm.rank())] = e.what();
      }
    });
    for (const auto& w : what) {
      CAPTURE(n, w);
      CHECK_THAT(w, Catch::Contains("deterministic mode runs on host transports"));
    }
  }
}

TEST_CASE("one rounding: half and bfloat16 summed in float, float in double, are within 0.5 ulp of the exact sum at 2 to 64 ranks",
          "[deterministic][precision]") {
  // (the inputs' sums are exact in the accumulator: tests/precision.hpp; so the mode's result must
  // be the exact sum correctly rounded, on every element)
  const std::size_t count = 4099;
  for (int n : {2, 3, 4, 5, 7, 8, 13, 16, 31, 32, 33, 64}) {
    CAPTURE(n);
    CHECK(measured<collx::bfloat16, collx::ops::sum>(n, count, algo::deterministic<>{}, true) == "");
    CHECK(measured<collx::half, collx::ops::sum>(n, count, algo::deterministic<algo::pairwise>{}, true) == "");
    CHECK(measured<float, collx::ops::accumulate_in<double>>(n, count, algo::deterministic<>{}, true) == "");
  }
  // over shared memory and tcp
  for (int n : {3, 5}) {
    CAPTURE(n);
    CHECK(measured<collx::bfloat16, collx::ops::sum, processes>(n, count, algo::deterministic<>{}, true) == "");
    CHECK(measured<collx::bfloat16, collx::ops::sum, processes_tcp>(n, count, algo::deterministic<algo::ring>{}, true) == "");
  }
  // and the bound can fail: the ring rounds to bfloat16 after every step, so at 8 ranks and up
  // its error passes 0.5 ulp (collx-precision prints each policy's)
  for (int n : {8, 64}) {
    CAPTURE(n);
    collx_precision::error ring;
    CHECK(measured<collx::bfloat16, collx::ops::sum>(n, count, algo::ring{}, false, &ring) == "");
    CHECK(ring.max_ulp > 0.5);
    CHECK(ring.wrong > count / 10);
  }
}
