// The cost model (collx/algo/model.hpp) against real runs: for every policy, collective and N <= 16,
// the per-rank counts the model reads off the schedules equal what transport::counting records
// while the collective runs; the textbook costs come out of the model's walk; and the model's
// choice follows from its parameters.
#include <catch2/catch.hpp>

#include <collx/algo/calibration.hpp>
#include <collx/algo/model.hpp>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>

#include "harness.hpp"

namespace model = collx::model;
namespace algo = collx::algo;
using collx::transport::traffic;
using model::collective;

namespace {

// x ⊕ y = x + 2y: not commutative, so only the rank-order paths may run it.
struct skew {
  using reduction_op_concept = collx::reduction_op_tag;
  static constexpr bool commutative = false;
  static constexpr const char* name = "skew";
  float operator()(float a, float b) const { return a + 2 * b; }
};

template <class A, class Op, class Comm>
void run(Comm& comm, const A& a, const model::problem& pr, Op op) {
  const auto n = std::size_t(comm.size()), k = pr.count;
  std::vector<float> in(model::problem::split(pr.coll) ? n * k : k, 1.0f), out(in.size(), 0.0f);
  constexpr bool can_reduce = A::keeps_rank_order || collx::is_commutative_v<Op>;
  switch (pr.coll) {
    case collective::all_reduce:
      if constexpr (can_reduce && (requires(const algo::ar_problem& p) { a.all_reduce(p); } ||
                                   requires(const algo::rs_problem& p) { a.reduce_scatter(p); }))
        collx::all_reduce(comm, std::span<const float>{in}, std::span{out}, op, a);
      break;
    case collective::reduce_scatter:
      if constexpr (can_reduce && requires(const algo::rs_problem& p) { a.reduce_scatter(p); })
        collx::reduce_scatter(comm, std::span<const float>{in}, std::span{out}.first(k), op, a);
      break;
    case collective::reduce:
      if constexpr (can_reduce && requires(const algo::reduce_problem& p) { a.reduce(p); })
        collx::reduce(comm, std::span<const float>{in}, std::span{out}, op, pr.root, a);
      break;
    case collective::all_gather:
      if constexpr (requires(const algo::ag_problem& p) { a.all_gather(p); })
        collx::all_gather(comm, std::span<const float>{in}.first(k), std::span{out}, a);
      break;
    case collective::broadcast:
      if constexpr (requires(const algo::bcast_problem& p) { a.broadcast(p); })
        collx::broadcast(comm, std::span{out}, pr.root, a);
      break;
    case collective::all_to_all:
      if constexpr (requires(const algo::a2a_problem& p) { a.all_to_all(p); })
        collx::all_to_all(comm, std::span<const float>{in}, std::span{out}, a);
      break;
  }
}

/// What transport::counting records on each of pr.n thread-ranks while the collective runs.
template <class A>
std::vector<traffic> measured(const A& a, const model::problem& pr) {
  std::vector<traffic> t(static_cast<std::size_t>(pr.n));
  collx::launch_threads<collx::transport::counting>(pr.n, [&](auto& comm) {
    if (pr.commutative) run(comm, a, pr, collx::ops::sum{});
    else run(comm, a, pr, skew{});
    t[std::size_t(comm.rank())] = comm.transport().counts();
  });
  return t;
}

}  // namespace

TEMPLATE_TEST_CASE("the model's counts are what transport::counting records in a real run", "[model][cost]",
                   algo::ring, algo::tree, algo::recursive_halving, algo::recursive_doubling, algo::pairwise) {
  const TestType a{};
  for (int n : collx_test::rank_counts())  // (1..16 took 20 s a policy under ASan; these are the suite's)
    for (collective c : model::all_collectives)
      for (bool commutative : {true, false}) {
        if (!model::supports<TestType>(c, commutative)) continue;
        const bool reduces = c == collective::all_reduce || c == collective::reduce_scatter || c == collective::reduce;
        if (!commutative && !reduces) continue;
        for (std::size_t count : {std::size_t(0), std::size_t(1), std::size_t(n + 1), std::size_t(100003)}) {
          const model::problem pr{c, n, count, 4, n / 2, commutative};
          CAPTURE(TestType::name, model::name(c), n, count, commutative);
          const model::cost m = model::analyse(model::schedules(a, pr), pr.elem);
          const std::vector<traffic> t = measured(a, pr);
          REQUIRE(m.ranks.size() == t.size());
          for (std::size_t r = 0; r < t.size(); ++r) {
            CAPTURE(r);
            CHECK(m.ranks[r] == t[r]);
          }
          // The critical path never has fewer steps than any rank, nor less traffic than the
          // busiest rank's largest step.
          for (const traffic& x : t) CHECK(std::uint64_t(m.steps) >= x.steps);
        }
      }
}

TEST_CASE("a large composed all_reduce runs in segments, and the model counts them", "[model][cost][segments]") {
  // From tuning::all_reduce_segment_from_bytes on, reduce-scatter + all-gather run per segment of
  // all_reduce_segment_bytes; a partial last segment; ring and recursive halving (also
  // non-commutative).
  const std::size_t seg = algo::tuning::all_reduce_segment_bytes / 4;
  const std::size_t count = algo::tuning::all_reduce_segment_from_bytes / 4 + seg / 2 + 3;
  const std::size_t segments = (count + seg - 1) / seg;
  REQUIRE(algo::tuning::all_reduce_segment(count, 4) == seg);
  REQUIRE(algo::tuning::all_reduce_segment(algo::tuning::all_reduce_segment_from_bytes / 4 - 1, 4) ==
          algo::tuning::all_reduce_segment_from_bytes / 4 - 1);
  for (int n : {2, 3, 5}) {
    CAPTURE(n);
    for (bool commutative : {true, false}) {
      const model::problem pr{collective::all_reduce, n, count, 4, 0, commutative};
      auto check = [&](const auto& a) {
        CAPTURE(std::decay_t<decltype(a)>::name, commutative);
        const model::cost m = model::analyse(model::schedules(a, pr), pr.elem);
        const std::vector<traffic> t = measured(a, pr);
        for (std::size_t r = 0; r < t.size(); ++r) CHECK(m.ranks[r] == t[r]);
        return m;
      };
      if (commutative) {
        const model::cost ring = check(algo::ring{});
        CHECK(ring.steps == int(segments) * 2 * (n - 1));
        for (const traffic& x : ring.ranks) CHECK(x.steps == segments * 2 * std::uint64_t(n - 1));
      }
      check(algo::recursive_halving{});
    }
  }
}

TEST_CASE("the textbook costs come out of the model's walk", "[model][cost]") {
  for (int n : {2, 3, 4, 5, 7, 8, 13, 16}) {
    CAPTURE(n);
    const int lg = algo::ceil_log2(n);
    const bool pow2 = (n & (n - 1)) == 0;
    // A buffer that every partition divides evenly: D = N · 64 KiB of floats.
    const std::size_t count = std::size_t(n) * 16384;
    const std::uint64_t D = count * 4;
    // Ring all-reduce: 2(N-1) steps; every rank sends 2(N-1)/N·D, reduces (N-1)/N·D; the
    // critical path moves 2(N-1)/N·D.
    const model::cost ring = model::analyse(collx::algo::choice_of<collx::algo::ring>,
                                            {collective::all_reduce, n, count});
    CHECK(ring.steps == 2 * (n - 1));
    CHECK(ring.bytes * std::uint64_t(n) == 2 * std::uint64_t(n - 1) * D);
    CHECK(ring.reduced * std::uint64_t(n) == std::uint64_t(n - 1) * D);
    for (const traffic& x : ring.ranks) CHECK(x.bytes_sent * std::uint64_t(n) == 2 * std::uint64_t(n - 1) * D);
    // Ring all-gather / reduce-scatter: N-1 steps, (N-1)/N·D.
    const model::cost ag = model::analyse(collx::algo::choice_of<collx::algo::ring>, {collective::all_gather, n, count / std::size_t(n)});
    CHECK(ag.steps == n - 1);
    CHECK(ag.bytes * std::uint64_t(n) == std::uint64_t(n - 1) * D);
    // Recursive halving all-reduce: 2·log2 N steps and 2(N-1)/N·D for powers of two.
    const model::cost rh = model::analyse(collx::algo::choice_of<collx::algo::recursive_halving>, {collective::all_reduce, n, count});
    if (pow2) {
      CHECK(rh.steps == 2 * lg);
      CHECK(rh.bytes * std::uint64_t(n) == 2 * std::uint64_t(n - 1) * D);
    } else {
      // Non-powers of two fold the first 2(N-p) ranks in pairs: one step more at each end.
      CHECK(rh.steps == 2 * (algo::ceil_log2(algo::floor_pow2(n)) + 2));
    }
    // Recursive doubling: log2 N steps of the whole vector (powers of two).
    const model::cost rd = model::analyse(collx::algo::choice_of<collx::algo::recursive_doubling>, {collective::all_reduce, n, count});
    if (pow2) {
      CHECK(rd.steps == lg);
      CHECK(rd.bytes == std::uint64_t(lg) * D);
    }
    // The double binary tree, one chunk: up and down the tree, 2·ceil(log2 N) steps.
    const model::cost tr = model::analyse(collx::algo::choice_of<collx::algo::tree>, {collective::all_reduce, n, 16});
    CHECK(tr.steps == 2 * lg);
    // Binomial broadcast: ceil(log2 N) steps; the root sends D in each.
    const model::cost bc = model::analyse(collx::algo::choice_of<collx::algo::tree>, {collective::broadcast, n, count, 4, 0});
    CHECK(bc.steps == lg);
    CHECK(bc.ranks[0].bytes_sent == std::uint64_t(lg) * D);
    CHECK(bc.bytes == std::uint64_t(lg) * D);
    // Pairwise all-to-all with blocks above the one-step limit: N-1 steps, (N-1)/N·D.
    const std::size_t blk = algo::tuning::a2a_one_step_bytes / 4 + 1;
    const model::cost a2a = model::analyse(collx::algo::choice_of<collx::algo::pairwise>, {collective::all_to_all, n, blk});
    CHECK(a2a.steps == n - 1);
    CHECK(a2a.bytes == std::uint64_t(n - 1) * blk * 4);
    // Pairwise all-gather with small blocks: one step, each rank sends (N-1)/N·D.
    const model::cost pag = model::analyse(collx::algo::choice_of<collx::algo::pairwise>, {collective::all_gather, n, count / std::size_t(n)});
    CHECK(pag.steps == 1);
    for (const traffic& x : pag.ranks) CHECK(x.bytes_sent * std::uint64_t(n) == std::uint64_t(n - 1) * D);
  }
}

TEST_CASE("the model's choice follows from α, β, γ", "[model]") {
  model::params p{1e-6, 1e-10, 5e-11, "test"};
  // Latency-bound: the fewest steps win (recursive doubling: log2 N; the ring: 2(N-1)).
  CHECK(model::best({collective::all_reduce, 8, 2}, p) == collx::algo::choice_of<collx::algo::recursive_doubling>);
  // Bandwidth-bound: the bandwidth-optimal policies (2(N-1)/N·D) beat doubling (log2 N·D) and
  // the tree. For N a power of two recursive halving moves the ring's bytes in 2·log2 N steps
  // instead of 2(N-1), so it wins; otherwise its folding moves up to D more, and the ring wins.
  CHECK(model::best(model::problem::of_bytes(collective::all_reduce, 8, std::size_t(256) << 20), p) ==
        collx::algo::choice_of<collx::algo::recursive_halving>);
  CHECK(model::best(model::problem::of_bytes(collective::all_reduce, 6, std::size_t(256) << 20), p) ==
        collx::algo::choice_of<collx::algo::ring>);
  // With free steps, a bandwidth-optimal policy wins at every size above a few elements: at
  // N = 6 the ring; at N = 8 the ring and recursive halving tie, and the tie goes to fewer steps
  // (recursive halving's 2·log2 N). With free bytes, the fewest steps win at every size.
  CHECK(model::best(model::problem::of_bytes(collective::all_reduce, 6, 4096), {0, 1e-10, 0, ""}) == collx::algo::choice_of<collx::algo::ring>);
  CHECK(model::best(model::problem::of_bytes(collective::all_reduce, 8, 4096), {0, 1e-10, 0, ""}) ==
        collx::algo::choice_of<collx::algo::recursive_halving>);
  // A small broadcast over ranks sharing cores: the chain and the binomial tree are predicted
  // alike (1.5 full steps each), and the tree's fewer steps win.
  {
    model::params q{8e-7, 1.65e-10, 7e-11, "test"};
    q.cores = 2;
    q.ranks = 4;
    const model::problem bc{collective::broadcast, 4, 32, 4, 0, true};
    const auto v = model::evaluate(bc, q);
    REQUIRE(v.size() >= 2);
    CHECK(std::abs(v[0].seconds - v[1].seconds) <= 1e-6 * v[0].seconds);
    CHECK(model::best(bc, q) == collx::algo::choice_of<collx::algo::tree>);
  }
  CHECK(model::best(model::problem::of_bytes(collective::all_reduce, 8, std::size_t(64) << 20), {1e-6, 0, 0, ""}) ==
        collx::algo::choice_of<collx::algo::recursive_doubling>);
  // A non-commutative op never gets the ring.
  CHECK(model::best(model::problem::of_bytes(collective::all_reduce, 8, std::size_t(256) << 20, 4, 0, false), p) !=
        collx::algo::choice_of<collx::algo::ring>);
  // all_to_all has one policy.
  CHECK(model::best({collective::all_to_all, 5, 1000}, p) == collx::algo::choice_of<collx::algo::pairwise>);
  // Ranks sharing cores: a calibration of 8 ranks on 2 cores charges a step in which all 8 are
  // busy in full and one with 2 active ranks a quarter; with ranks that fit the cores, no change.
  {
    model::params shared = p;
    shared.cores = 2;
    shared.ranks = 8;
    const model::cost ring8 = model::analyse(collx::algo::choice_of<collx::algo::ring>, {collective::all_reduce, 8, 4096});
    CHECK(model::predict(ring8, shared) == Approx(model::predict(ring8, p)));  // every step has all 8
    const model::cost bc = model::analyse(collx::algo::choice_of<collx::algo::tree>, {collective::broadcast, 8, 4096});
    REQUIRE(bc.per_step.size() == 3);
    CHECK(bc.per_step[0].active == 2);  // root -> 4
    CHECK(bc.per_step[1].active == 4);
    CHECK(bc.per_step[2].active == 8);
    const double step = p.alpha + p.beta * 16384;
    CHECK(model::predict(bc, shared) == Approx(step * (0.25 + 0.5 + 1.0)));
    shared.cores = 8;
    CHECK(model::predict(bc, shared) == Approx(model::predict(bc, p)));
  }
  // δ: a ring step sends and receives a block at once (both = bytes), a binomial broadcast step
  // only sends or only receives (both = 0); an exchange costs 1 + δ one-way messages.
  {
    const model::cost ring4 = model::analyse(collx::algo::choice_of<collx::algo::ring>, {collective::all_reduce, 4, 4096});
    CHECK(ring4.both == ring4.bytes);
    const model::cost bc = model::analyse(collx::algo::choice_of<collx::algo::tree>, {collective::broadcast, 8, 4096});
    CHECK(bc.both == 0);
    model::params half = p;
    half.delta = 1;
    CHECK(model::predict(ring4, half) == Approx(1e-6 * 6 + 1e-10 * 2 * double(ring4.bytes) + 5e-11 * double(ring4.reduced)));
    CHECK(model::predict(bc, half) == Approx(model::predict(bc, p)));
  }
  // predict() is α·steps + β·bytes + γ·reduced.
  const model::cost c = model::analyse(collx::algo::choice_of<collx::algo::ring>, {collective::all_reduce, 4, 4096});
  CHECK(model::predict(c, p) == Approx(1e-6 * 6 + 1e-10 * double(c.bytes) + 5e-11 * double(c.reduced)));
}

namespace {
/// Sets an environment variable for the scope.
struct scoped_env {
  std::string name;
  std::optional<std::string> old;
  scoped_env(const char* n, const std::string& v) : name(n) {
    if (const char* o = std::getenv(n)) old = o;
    setenv(n, v.c_str(), 1);
  }
  scoped_env(const char* n, std::nullptr_t) : name(n) {  // unset for the scope
    if (const char* o = std::getenv(n)) old = o;
    unsetenv(n);
  }
  ~scoped_env() {
    if (old) setenv(name.c_str(), old->c_str(), 1);
    else unsetenv(name.c_str());
  }
};

std::string temp_dir() {
  char t[] = "/tmp/collx-model-XXXXXX";
  REQUIRE(mkdtemp(t) != nullptr);
  return t;
}
}  // namespace

TEST_CASE("calibration files: written, read back, and used only when sound", "[model][calibration]") {
  const std::string dir = temp_dir();
  const scoped_env xdg("XDG_CACHE_HOME", dir);
  const std::string path = model::calibration_file("shm", 2);
  CHECK(path == dir + "/collx/calibration-shm-np2.txt");
  // No file yet: the shipped defaults, saying so and how to calibrate.
  model::params p = model::params_for("shm", 2);
  CHECK(p.alpha == model::shipped_defaults("shm").alpha);
  CHECK(p.source.find("shipped defaults for shm") != std::string::npos);
  CHECK(p.source.find("collx-perf --calibrate --transport shm") != std::string::npos);
  // Written (the directory is created) and read back.
  CHECK(model::write_calibration(path, "shm", {1.5e-6, 2.5e-10, 3.5e-11, {}, 2, 4, 0.75}, 4) == "");
  p = model::params_for("shm", 2);
  CHECK(p.cores == 2);
  CHECK(p.ranks == 4);
  CHECK(p.delta == Approx(0.75));
  CHECK(p.alpha == Approx(1.5e-6));
  CHECK(p.beta == Approx(2.5e-10));
  CHECK(p.gamma == Approx(3.5e-11));
  CHECK(p.source.rfind("calibrated: " + path, 0) == 0);
  // Other rank counts use the nearest calibrated one, and say so.
  CHECK(model::write_calibration(model::calibration_file("shm", 8), "shm", {9e-6, 2.5e-10, 3.5e-11, {}}, 8) == "");
  CHECK(model::params_for("shm", 8).alpha == Approx(9e-6));
  CHECK(model::params_for("shm", 3).alpha == Approx(1.5e-6));  // 2 is nearer than 8
  CHECK(model::params_for("shm", 6).alpha == Approx(9e-6));
  CHECK(model::params_for("shm", 6).source.find("measured with 8 ranks (none for 6)") != std::string::npos);
  std::filesystem::remove(model::calibration_file("shm", 8));
  // Another transport's file is another file.
  CHECK(model::params_for("tcp", 2).source.find("shipped defaults for tcp") != std::string::npos);
  // A value that is not a number, or a missing key: not used, and the source says why.
  {
    std::FILE* f = std::fopen(path.c_str(), "w");
    std::fputs("alpha 1e-6\nbeta fast\ngamma 1e-11\n", f);
    std::fclose(f);
  }
  p = model::params_for("shm", 2);
  CHECK(p.source.find("shipped defaults") != std::string::npos);
  CHECK(p.source.find("beta 'fast'") != std::string::npos);
  {
    std::FILE* f = std::fopen(path.c_str(), "w");
    std::fputs("# comment\nalpha 1e-6  # trailing\ngamma 1e-11\n", f);
    std::fclose(f);
  }
  CHECK(model::params_for("shm", 2).source.find("lacks beta") != std::string::npos);
  // An unusable file for this rank count yields to a usable one for another.
  CHECK(model::write_calibration(model::calibration_file("shm", 4), "shm", {7e-6, 2.5e-10, 3.5e-11, {}}, 4) == "");
  CHECK(model::params_for("shm", 2).alpha == Approx(7e-6));
  // Not a regular file: not read (a FIFO would block).
  std::filesystem::remove(model::calibration_file("shm", 4));
  std::filesystem::remove(path);
  std::filesystem::create_directory(path);
  CHECK(model::params_for("shm", 2).source.find("not a calibration file") != std::string::npos);
  std::filesystem::remove_all(dir);
}

TEST_CASE("COLLX_ALGO: parsed strictly", "[model][automatic]") {
  using collx::detail::parse_algo_override;
  auto o = parse_algo_override("ring");
  CHECK(o.all == std::int8_t(collx::algo::choice_of<collx::algo::ring>));
  o = parse_algo_override("all_reduce=tree, all_gather=ring");
  CHECK(o.all == -1);
  CHECK(o.per[std::size_t(collective::all_reduce)] == std::int8_t(collx::algo::choice_of<collx::algo::tree>));
  CHECK(o.per[std::size_t(collective::all_gather)] == std::int8_t(collx::algo::choice_of<collx::algo::ring>));
  CHECK(o.per[std::size_t(collective::broadcast)] == -1);
  o = parse_algo_override("tree,all_reduce=automatic");
  CHECK(o.all == std::int8_t(collx::algo::choice_of<collx::algo::tree>));
  CHECK(o.per[std::size_t(collective::all_reduce)] == collx::detail::algo_override::kModel);
  CHECK(o.per[std::size_t(collective::broadcast)] == collx::detail::algo_override::kUnset);
  CHECK(parse_algo_override("").all == -1);
  auto fails = [](const char* v, const char* says) {
    CAPTURE(v);
    try {
      parse_algo_override(v);
      FAIL("no error");
    } catch (const collx::error& e) {
      CHECK(e.code() == collx::errc::invalid_argument);
      CHECK(std::string(e.what()).find(says) != std::string::npos);
      CHECK(std::string(e.what()).find("COLLX_ALGO") != std::string::npos);
    }
  };
  fails("rign", "unknown policy 'rign'");
  fails("allreduce=tree", "unknown collective 'allreduce'");
  fails("all_to_all=ring", "ring has no all_to_all schedule");
  fails("broadcast=recursive_doubling", "recursive_doubling has no broadcast schedule");
  fails("all_reduce=", "unknown policy ''");
}

TEST_CASE("COLLX_ALGO overrides automatic's choice on every rank", "[model][automatic]") {
  const int n = 8;
  auto steps_of_second_call = [&] {
    std::vector<traffic> t(n);
    collx::launch_threads<collx::transport::counting>(n, [&](auto& comm) {
      std::vector<float> v(64, 1.0f);
      collx::all_reduce(comm, std::span{v}, collx::ops::sum{});  // the first also agrees on the parameters
      comm.transport().reset();
      std::fill(v.begin(), v.end(), float(comm.rank()));
      collx::all_reduce(comm, std::span{v}, collx::ops::sum{});
      if (v[7] != float(n * (n - 1) / 2)) throw std::runtime_error("wrong sum");
      t[std::size_t(comm.rank())] = comm.transport().counts();
    });
    return t[0].steps;
  };
  {
    const scoped_env e("COLLX_ALGO", "all_reduce=ring");
    CHECK(steps_of_second_call() == std::uint64_t(2 * (n - 1)));
  }
  {
    const scoped_env e("COLLX_ALGO", "ring,all_reduce=recursive_doubling");
    CHECK(steps_of_second_call() == std::uint64_t(algo::ceil_log2(n)));
  }
  {
    const scoped_env e("COLLX_ALGO", "tree");
    CHECK(steps_of_second_call() == std::uint64_t(model::analyse(collx::algo::choice_of<collx::algo::tree>, {collective::all_reduce, n, 64}).ranks[0].steps));
  }
  // `all_reduce=automatic` takes the model back from a global policy: a 64-float all-reduce
  // over 8 ranks is latency-bound, so the model never picks the ring's 14 steps.
  {
    const scoped_env e("COLLX_ALGO", "ring,all_reduce=automatic");
    CHECK(steps_of_second_call() < std::uint64_t(2 * (n - 1)));
  }
  // A misspelt value fails the call on every rank, naming the value.
  {
    const scoped_env e("COLLX_ALGO", "all_reduce=treee");
    std::atomic<int> refused{0};
    collx::launch_threads(n, [&](auto& comm) {
      std::vector<float> v(64, 1.0f);
      try {
        collx::all_reduce(comm, std::span{v}, collx::ops::sum{});
      } catch (const collx::error& x) {
        if (x.code() == collx::errc::invalid_argument && std::string(x.what()).find("treee") != std::string::npos) ++refused;
      }
    });
    CHECK(refused == n);
  }
  // A per-collective policy that cannot honour a non-commutative op is an error at the call.
  {
    const scoped_env e("COLLX_ALGO", "all_reduce=ring");
    std::atomic<int> refused{0};
    collx::launch_threads(4, [&](auto& comm) {
      std::vector<float> v(64, 1.0f);
      try {
        collx::all_reduce(comm, std::span{v}, skew{});
      } catch (const collx::error& x) {
        if (x.code() == collx::errc::invalid_argument && std::string(x.what()).find("non-commutative") != std::string::npos)
          ++refused;
      }
    });
    CHECK(refused == 4);
  }
}

TEST_CASE("automatic: every rank takes rank 0's parameters", "[model][automatic]") {
  // Ranks that read different calibrations still agree (rank 0's wins): here each thread-rank
  // cannot have its own file, so check the agreed state instead.
  const std::string dir = temp_dir();
  const scoped_env xdg("XDG_CACHE_HOME", dir);
  REQUIRE(model::write_calibration(model::calibration_file("inproc", 5), "inproc", {3e-6, 4e-10, 5e-11, {}}, 2) == "");
  std::atomic<int> agreed{0};
  collx::launch_threads(5, [&](auto& comm) {
    std::vector<double> v(10, 1.0);
    collx::all_reduce(comm, std::span{v}, collx::ops::sum{});
    const auto& st = comm.automatic();
    if (st.ready && st.n.alpha == 3e-6 && st.n.beta == 4e-10 && st.source.rfind("calibrated", 0) == 0) ++agreed;
  });
  CHECK(agreed == 5);
  std::filesystem::remove_all(dir);
}

TEST_CASE("COLLX_AUTOTUNE: the fastest of the model's closest candidates wins, unless the model's pick is within 3%", "[model][automatic]") {
  const std::vector<double> t{2.0, 1.0, 1.5};
  CHECK(algo::settle(t, 2) == 1);  // 1.0 beats the model's 1.5
  CHECK(algo::settle(std::vector<double>{1.0, 1.02, 3.0}, 1) == 1);  // within 3%: the model's
  CHECK(algo::settle(std::vector<double>{1.0, 1.04, 3.0}, 1) == 0);
  CHECK(algo::settle(std::vector<double>{5.0, 4.0}, 1) == 1);
  CHECK(algo::settle(std::vector<double>{1.0, 1.0, 1.0}, 0) == 0);
}

TEST_CASE("COLLX_AUTOTUNE: a new shape's first calls take turns among the model's closest candidates, then every rank keeps one", "[model][automatic]") {
  const scoped_env on("COLLX_AUTOTUNE", "1");
  for (int n : {2, 3, 5}) {
    CAPTURE(n);
    constexpr int calls = 24;
    std::vector<std::string> ran(static_cast<std::size_t>(n)), planned(static_cast<std::size_t>(n));
    std::atomic<int> wrong{0}, tuned{0};
    for (std::size_t count : {std::size_t(1000), std::size_t(70001)}) {
      CAPTURE(count);
      collx::launch_threads(n, [&](auto& comm) {
        const int r = comm.rank();
        std::vector<float> v(count);
        for (int c = 0; c < calls; ++c) {
          for (std::size_t i = 0; i < count; ++i) v[i] = float(r + 1 + int(i % 7) + c);
          collx::all_reduce(comm, std::span{v}, collx::ops::sum{});
          for (std::size_t i = 0; i < count; ++i)
            if (v[i] != float(n * (n + 1) / 2 + n * (int(i % 7) + c))) {
              ++wrong;
              break;
            }
        }
        const auto& st = comm.automatic();
        if (st.tune) ++tuned;
        // The trial this shape was given, from the parameters every rank agreed on.
        const model::params p{st.n.alpha, st.n.beta, st.n.gamma, {}, st.n.cores, st.n.ranks, st.n.delta, st.n.curve, st.n.fit};
        const model::problem pr{collective::all_reduce, n, count, sizeof(float), 0, true};
        std::decay_t<decltype(st.trials.begin()->second)> tr;
        std::string& plan = planned[std::size_t(r)];
        plan.clear();
        if (collx::detail::plan_trial(model::evaluate(pr, p), model::best(pr, p), tr)) {
          plan += std::string(model::name(model::best(pr, p))) + " ";  // the first call: the model's, untimed
          for (int i = 0; i < tr.k; ++i)
            for (int k = 0; k < tr.reps; ++k) plan += std::string(model::name(algo::choice(tr.cand[std::size_t(i)]))) + " ";
        }
        std::string& mine = ran[std::size_t(r)];
        mine.clear();
        for (const auto& rec : collx::flight::records(comm))
          if (std::string(rec.sig.collective) == "all_reduce" && rec.sig.count == count) mine += std::string(rec.sig.policy) + " ";
      });
      CHECK(wrong == 0);
      // Every rank ran the same policy at every call: the trial's turns, then one of its candidates.
      for (int r = 1; r < n; ++r) CHECK(ran[std::size_t(r)] == ran[0]);
      const std::string& plan = planned[0];
      if (plan.empty()) continue;  // the model had one candidate worth trying: no trial
      REQUIRE(ran[0].rfind(plan, 0) == 0);
      const std::string after = ran[0].substr(plan.size());
      REQUIRE_FALSE(after.empty());
      const std::string kept = after.substr(0, after.find(' '));
      CHECK(plan.find(kept + " ") != std::string::npos);
      std::string all_kept;
      for (std::size_t at = 0; at < after.size(); at += kept.size() + 1) all_kept += kept + " ";
      CHECK(after == all_kept);
    }
    CHECK(tuned == 2 * n);
  }
}

TEST_CASE("COLLX_AUTOTUNE: off unless 1, with or without a calibration, and anything but 0 or 1 is an error", "[model][automatic]") {
  const std::string dir = temp_dir();
  const scoped_env xdg("XDG_CACHE_HOME", dir);
  auto tunes = [](int n) {
    std::atomic<int> on{0};
    collx::launch_threads(n, [&](auto& comm) {
      std::vector<double> v(10, 1.0);
      collx::all_reduce(comm, std::span{v}, collx::ops::sum{});
      if (comm.automatic().tune) ++on;
    });
    return on.load();
  };
  {
    const scoped_env unset("COLLX_AUTOTUNE", nullptr);
    CHECK(tunes(3) == 0);  // shipped defaults: the model alone
  }
  {
    const scoped_env forced("COLLX_AUTOTUNE", "1");
    CHECK(tunes(3) == 3);
    REQUIRE(model::write_calibration(model::calibration_file("inproc", 3), "inproc", {3e-6, 4e-10, 5e-11, {}}, 2) == "");
    CHECK(tunes(3) == 3);  // and over this machine's calibration
  }
  {
    const scoped_env off("COLLX_AUTOTUNE", "0");
    CHECK(tunes(2) == 0);
  }
  {
    const scoped_env bad("COLLX_AUTOTUNE", "yes");
    std::atomic<int> refused{0};
    collx::launch_threads(3, [&](auto& comm) {
      std::vector<double> v(10, 1.0);
      try {
        collx::all_reduce(comm, std::span{v}, collx::ops::sum{});
      } catch (const collx::error& x) {
        if (x.code() == collx::errc::invalid_argument && std::string(x.what()).find("COLLX_AUTOTUNE") != std::string::npos) ++refused;
      }
    });
    CHECK(refused == 3);
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("COLLX_AUTOTUNE over shm: processes take the same turns and the same verdict at every size", "[model][automatic][processes]") {
  const scoped_env on("COLLX_AUTOTUNE", "1");
  for (int n : {3, 4}) {
    collx::launch_processes(n, [n](auto& comm) {
      const int r = comm.rank();
      for (std::size_t count : {std::size_t(1), std::size_t(n + 1), std::size_t(4099), std::size_t(262147), std::size_t(1 << 21)}) {
        std::vector<float> v(count), out(count / std::size_t(n));
        for (int c = 0; c < 12; ++c) {
          for (std::size_t i = 0; i < count; ++i) v[i] = float(r + int(i % 3));
          collx::all_reduce(comm, std::span{v}, collx::ops::sum{});
          if (v[count - 1] != float(n * (n - 1) / 2 + n * int((count - 1) % 3))) throw std::runtime_error("wrong all_reduce");
          for (std::size_t i = 0; i < count; ++i) v[i] = float(r);
          collx::reduce_scatter(comm, std::span<const float>{v.data(), out.size() * std::size_t(n)}, std::span{out}, collx::ops::sum{});
          for (float x : out)
            if (x != float(n * (n - 1) / 2)) throw std::runtime_error("wrong reduce_scatter");
          if (r == 0) std::fill(v.begin(), v.end(), float(c));
          collx::broadcast(comm, std::span{v}, 0);
          if (v[count / 2] != float(c)) throw std::runtime_error("wrong broadcast");
          // a nonblocking call (run by the progress thread) and a fused batch take their turns too
          std::vector<double> a(count, double(r)), b(7, 1.0);
          auto w = collx::async::all_reduce(comm, std::span{a}, collx::ops::max{});
          w.wait();
          if (a[0] != double(n - 1)) throw std::runtime_error("wrong nonblocking all_reduce");
          collx::fused f(comm);
          f.all_reduce(std::span{a}, collx::ops::sum{}).all_reduce(std::span{b}, collx::ops::sum{});
          f.run();
          if (a[count - 1] != double(n * (n - 1)) || b[6] != double(n)) throw std::runtime_error("wrong fused all_reduce");
        }
      }
      if (!comm.automatic().tune) throw std::runtime_error("not learning");
    });
  }
}

namespace {
template <class A>
void check_profile(const A& a, const model::problem& pr) {
  if (!model::supports<A>(pr.coll, pr.commutative)) return;
  CAPTURE(A::name, model::name(pr.coll), pr.n, pr.count, pr.commutative, pr.root);
  const model::cost walk = model::analyse(model::schedules(a, pr), pr.elem);
  const model::cost fast = model::profile(a, pr);
  CHECK(fast.steps == walk.steps);
  CHECK(fast.bytes == walk.bytes);
  CHECK(fast.both == walk.both);
  CHECK(fast.reduced == walk.reduced);
  const auto x = fast.expanded(), y = walk.expanded();
  REQUIRE(x.size() == y.size());
  for (std::size_t t = 0; t < x.size(); ++t) {
    CAPTURE(t);
    CHECK(x[t].active == y[t].active);
    CHECK(x[t].bytes == y[t].bytes);
    CHECK(x[t].both == y[t].both);
    CHECK(x[t].reduced == y[t].reduced);
  }
}
}  // namespace

TEMPLATE_TEST_CASE("the model's profile (policy structure, or one rank at a time) equals the walk of every rank's schedule",
                   "[model][profile]", algo::ring, algo::tree, algo::recursive_halving, algo::recursive_doubling,
                   algo::pairwise) {
  // Small pipeline chunks, so that chains and trees pipeline many chunks at small counts.
  TestType a{};
  if constexpr (requires { a.chunk_bytes; }) a.chunk_bytes = 64;
  for (int n : {1, 2, 3, 4, 5, 7, 8, 13, 16, 17, 31, 32, 33})
    for (std::size_t count : {std::size_t(0), std::size_t(1), std::size_t(n - 1 > 0 ? n - 1 : 1), std::size_t(n),
                              std::size_t(n + 1), std::size_t(1009), std::size_t(65537)})
      for (collective c : model::all_collectives)
        for (bool commutative : {true, false}) {
          check_profile(a, {c, n, count, 4, n / 2, commutative});
          if (n > 2) check_profile(a, {c, n, count, 2, n - 1, commutative});
        }
  // the default chunks, a segmented all_reduce (full segments, then a partial one), and
  // pairwise all-gather blocks above the one-step limit
  const TestType d{};
  for (int n : {3, 5, 8}) {
    check_profile(d, {collective::all_reduce, n, algo::tuning::all_reduce_segment_from_bytes / 4 + 4099, 4, 0, true});
    check_profile(d, {collective::broadcast, n, std::size_t(3) << 20, 4, 1, true});
    check_profile(d, {collective::all_gather, n, algo::tuning::a2a_one_step_bytes / 4 + 3, 4, 0, true});
  }
}

TEST_CASE("only rank 0 looks for calibration files", "[model][calibration]") {
  // before: every rank read $XDG_CACHE_HOME (a storm on a shared file system at scale)
  const auto before = model::calibration_lookups().load();
  collx::launch_threads(8, [](auto& comm) {
    std::vector<float> v(1000, 1.0f);
    collx::all_reduce(comm, std::span{v}, collx::ops::sum{});
    collx::all_reduce(comm, std::span{v}, collx::ops::sum{});
  });
  CHECK(model::calibration_lookups().load() - before == 1);
}

TEST_CASE("the schedule cache is bounded by bytes, and a cycle of 50 shapes hits", "[model][cache]") {
  // before: 8 slots round robin, so a cycle of more than 8 shapes missed on every call
  std::vector<std::uint64_t> misses(3), hits(3), bytes(3), decisions(3);
  collx::launch_threads(3, [&](auto& comm) {
    auto cycle = [&] {
      for (std::size_t shape = 0; shape < 50; ++shape) {
        std::vector<float> v(1000 + 37 * shape, 1.0f);
        collx::all_reduce(comm, std::span{v}, collx::ops::sum{});
        if (v[0] != 3.0f) throw std::runtime_error("wrong sum");
      }
    };
    cycle();
    const auto first = comm.schedules().misses();
    cycle();
    cycle();
    const auto r = std::size_t(comm.rank());
    misses[r] = comm.schedules().misses() - first;
    hits[r] = comm.schedules().hits();
    decisions[r] = comm.automatic().decisions.size();
    // A small budget keeps the cache under it, and every call still runs right.
    comm.schedules().set_budget(std::size_t(4) << 10);
    cycle();
    bytes[r] = comm.schedules().bytes();
  });
  for (int r = 0; r < 3; ++r) {
    CAPTURE(r);
    CHECK(misses[std::size_t(r)] == 0);  // the second and third cycles found every schedule
    CHECK(hits[std::size_t(r)] >= 100);
    CHECK(decisions[std::size_t(r)] == 50);
    CHECK(bytes[std::size_t(r)] <= std::size_t(4) << 10);
  }
}

TEST_CASE("the schedule cache keeps the two schedules it handed out last, whatever the budget", "[model][cache]") {
  // A segmented all_reduce holds its full segment's schedule while it gets the last segment's;
  // with a budget smaller than any schedule, that get evicts everything else but must leave the
  // held one (schedules are handed out as plain pointers: ASan sees a use after free otherwise).
  const std::size_t count = collx::algo::tuning::all_reduce_segment_bytes / sizeof(float) * 17 + 3;
  REQUIRE(collx::algo::tuning::all_reduce_segment(count, sizeof(float)) < count);
  std::vector<std::size_t> entries(3), wrong(3);
  collx::launch_threads(3, [&](auto& comm) {
    comm.schedules().set_budget(1);
    std::vector<float> v(count);
    for (int round = 0; round < 2; ++round) {
      for (std::size_t i = 0; i < count; ++i) v[i] = float(comm.rank() + 1 + int(i % 7));
      collx::all_reduce(comm, std::span{v}, collx::ops::sum{}, collx::algo::ring{});
      for (std::size_t i = 0; i < count; ++i)
        if (v[i] != float(6 + 3 * int(i % 7))) ++wrong[std::size_t(comm.rank())];
    }
    entries[std::size_t(comm.rank())] = comm.schedules().entries();
  });
  for (int r = 0; r < 3; ++r) {
    CAPTURE(r);
    CHECK(wrong[std::size_t(r)] == 0);
    CHECK(entries[std::size_t(r)] == 2);  // the full segment's and the last one's
  }
}

TEST_CASE("measured step times and policy fits: written, read back, and what the model charges", "[model][calibration]") {
  const auto dir = std::filesystem::temp_directory_path() / ("collx-fit-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "c.txt").string();
  model::params p{1e-6, 1e-10, 1e-10, {}};
  for (double b : {8.0, 4096.0, 1048576.0}) {
    auto& c = p.curve;
    c.bytes[c.n] = b;
    c.one_way[c.n] = 1e-6 + b * 1e-10;
    c.exchange[c.n] = 1e-6 + b * 2e-10;
    c.reduce[c.n] = 1e-6 + b * 3e-10;
    ++c.n;
  }
  p.fit.factor[int(collective::all_reduce)][int(collx::algo::choice_of<collx::algo::tree>)][p.fit.slot(1024)] = 0.5f;
  p.fit.factor[int(collective::all_reduce)][int(collx::algo::choice_of<collx::algo::tree>)][p.fit.slot(4096)] = 2.0f;
  REQUIRE(model::write_calibration(path, "shm", p, 2) == "");
  std::string why;
  const auto q = model::read_calibration(path, &why);
  REQUIRE(q);
  CHECK(q->curve.n == 3);
  CHECK(q->curve.exchange[2] == Approx(p.curve.exchange[2]));
  CHECK(q->fit.at(collective::all_reduce, collx::algo::choice_of<collx::algo::tree>, 1024) == Approx(0.5));
  CHECK(q->fit.at(collective::all_reduce, collx::algo::choice_of<collx::algo::tree>, 2048) == Approx(1.25));  // halfway in log2
  CHECK(q->fit.at(collective::all_reduce, collx::algo::choice_of<collx::algo::tree>, 1 << 20) == Approx(2.0));  // beyond: the nearest
  CHECK(q->fit.at(collective::all_reduce, collx::algo::choice_of<collx::algo::ring>, 2048) == 1.0);            // not measured
  // A step is charged from the curve: a one-way 4 KiB message its one-way time, an exchange
  // its exchange time, a reducing exchange its reduce time; between sizes, linearly.
  using step = collx::algo::step_load;
  CHECK(model::step_seconds(*q, step{2, 4096, 0, 0, 1}) == Approx(1e-6 + 4096 * 1e-10));
  CHECK(model::step_seconds(*q, step{2, 4096, 4096, 0, 1}) == Approx(1e-6 + 4096 * 2e-10));
  CHECK(model::step_seconds(*q, step{2, 4096, 4096, 4096, 1}) == Approx(1e-6 + 4096 * 3e-10));
  CHECK(model::step_seconds(*q, step{2, 2 << 20, 0, 0, 1}) == Approx(1e-6 + double(2 << 20) * 1e-10));  // beyond: the last slope
  // Broken lines make the file unusable, with the reason.
  for (const char* bad : {"step 64 1e-6 2e-6\n", "step 64 1e-6 2e-6 x\n", "step 64 1 1 1\nstep 32 1 1 1\n",
                          "fit all_reduce rign 64 1.0\n", "fit all_reduce ring 64 1000\n"}) {
    CAPTURE(bad);
    std::ofstream(path) << "alpha 1e-6\nbeta 1e-10\ngamma 1e-10\n" << bad;
    CHECK_FALSE(model::read_calibration(path, &why));
    CHECK_FALSE(why.empty());
  }
  std::filesystem::remove_all(dir);
}
