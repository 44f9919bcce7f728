#pragma once
// collx/algo/model.hpp — the cost model, derived from the schedules themselves.
//
// Nothing here is a formula written per algorithm. For a policy, a collective, N ranks and a
// size, the model builds every rank's schedule exactly as the collectives do (schedules()), then
// walks them (analyse()):
//   - per rank: the steps with a message, the messages and bytes sent and received, and the bytes
//     reduced: exactly what transport::counting records when the collective runs;
//   - on the critical path, the global timeline (steps of all ranks with equal time run together):
//       steps    the timeline's length,
//       bytes    Σ over steps of the most bytes one rank sends or receives in that step (a rank
//                sending to two peers in one step pays for both),
//       both     Σ over steps of the most bytes one rank receives while it also sends (the
//                smaller of its two directions), for links that are not full duplex (below),
//       reduced  Σ over steps of the most bytes one rank reduces in that step.
// and predicts   time = α·steps + β·(bytes + δ·both) + γ·reduced
// with α the latency of one step, β the seconds per byte on a link, γ the seconds per byte
// reduced, and δ how much a rank's receiving slows its sending: 0 for a full-duplex link (a NIC
// sends and receives at full speed at once), up to 1 where both directions are copies by the
// same cores through the same memory (shared memory, threads, loopback TCP: an exchange costs
// twice a one-way message). All four are measured on this machine by `collx-perf --calibrate`
// (algo/calibration.hpp), or shipped defaults.
//
// Ranks that share cores. When the calibration was measured with R ranks on C cores, R > C (8
// ranks on 2 cores), every rank was busy in every step, so α, β and γ include R/C-fold sharing.
// A step in which only `a` ranks have messages (a binomial tree's first steps, one hop of a
// chain) shares the cores less, so it is charged max(1, a/C) / max(1, R/C) of the full step:
//   time = Σ over steps t of s(a_t) · (α + β·bytes_t + γ·reduced_t).
// With ranks that fit the cores (or no calibration) s = 1 and this is the formula above.
//
// The textbook costs come out of the walk (tests/test_model.cpp checks them): ring
// all-reduce 2(N-1) steps and 2(N-1)/N·D bytes; recursive halving 2·log2 N steps; the double
// binary tree 2·ceil(log2 N) steps for one chunk.
//
// At scale. Walking every rank's schedule is O(N²) for a ring (N ranks of N-1 steps each) and
// builds N schedules; a decision at a thousand ranks must not. So decisions use profile(): the
// same per-step loads (algo/profile.hpp) from the policy's own structure where it has one (ring,
// pairwise all-gather, the double binary tree), else from a walk that builds one rank's schedule
// at a time and keeps only the per-step maxima (O(N log N) for the log-step policies), and for a
// segmented all_reduce one segment's profile, repeated. tests/test_model.cpp checks profile()
// against the full walk (analyse), and bench/model_bench.cpp measures a decision at N = 64, 256,
// 1024 (collx-explain -n 1024 prints what one costs).
//
// algo::automatic picks, per call, the policy with the least predicted time (best()).
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "automatic.hpp"
#include "policies.hpp"
#include "compose.hpp"
#include "pairwise.hpp"
#include "profile.hpp"
#include "recursive_doubling.hpp"
#include "recursive_halving.hpp"
#include "ring.hpp"
#include "tree.hpp"
#include "schedule_of.hpp"
#include "../core/partition.hpp"
#include "../core/schedule.hpp"
#include "../core/traffic.hpp"

namespace collx::model {

using algo::choice;
using algo::collective;

/// Every collective, in algo::collectives' order (algo/collectives.hpp).
inline constexpr auto all_collectives = [] {
  std::array<collective, algo::kCollectives> a{};
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = algo::collectives[i].id;
  return a;
}();
/// Every policy, in algo::policies' order (algo/policies.hpp).
inline constexpr auto all_policies = [] {
  std::array<choice, algo::policies::size> a{};
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = choice(i);
  return a;
}();

inline const char* name(collective c) noexcept { return algo::traits(c).name; }

inline const char* name(choice p) noexcept {
  const char* n = "?";
  algo::for_each_policy([&]<class A>() {
    if (p == algo::choice_of<A>) n = A::name;
  });
  return n;
}

using algo::parse_collective;

inline std::optional<choice> parse_policy(std::string_view s) {
  for (choice p : all_policies)
    if (s == name(p)) return p;
  return std::nullopt;
}

/// One call, as every rank passes it.
struct problem {
  collective coll = collective::all_reduce;
  int n = 1;
  /// The collective's count argument: all_reduce, broadcast, reduce: the buffer's elements;
  /// reduce_scatter: the output's (one block); all_gather: the input's (one block); all_to_all:
  /// one block's.
  std::size_t count = 0;
  std::size_t elem = 4;
  int root = 0;
  bool commutative = true;
  /// The op reduces exactly two at a time in the element type (algo/problem.hpp: rs_problem):
  /// the deterministic mode's reduce-scatter then reduces as it receives.
  bool stepwise_exact = false;

  static bool split(collective c) noexcept { return algo::traits(c).split; }
  /// What every rank passes, as algo::schedule_of builds each rank's problem from.
  algo::call_shape shape() const noexcept { return {n, count, elem, root, commutative, stepwise_exact}; }
  /// nccl-tests' "size": the buffer, or the N blocks of the split collectives.
  std::size_t bytes() const noexcept { return (split(coll) ? std::size_t(n) : 1) * count * elem; }
  /// The problem whose bytes() is `bytes` (rounded down to whole elements and blocks).
  static problem of_bytes(collective c, int n, std::size_t bytes, std::size_t elem = 4, int root = 0,
                          bool commutative = true) {
    const std::size_t e = std::max<std::size_t>(1, elem);
    const std::size_t count = bytes / e / (split(c) ? std::size_t(std::max(1, n)) : 1);
    return {c, n, count, e, root, commutative};
  }
};

/// Whether policy A has a schedule for collective c (all_reduce: its own, or reduce-scatter +
/// all-gather) and can honour the op's commutativity.
template <class A>
constexpr bool supports(collective c, bool commutative) {
  if (algo::traits(c).reduces && !commutative && !A::keeps_rank_order) return false;
  return algo::visit_collective(c, []<collective C>() { return algo::schedule_of<C>::template has<A>; });
}

template <std::size_t I, class F>
decltype(auto) visit_from(choice p, F& f) {
  using A = std::tuple_element_t<I, algo::policy_tuple>;
  if constexpr (I + 1 == algo::policies::size) {
    return f(A{});
  } else {
    if (p == choice(I)) return f(A{});
    return visit_from<I + 1>(p, f);
  }
}
/// Calls f with the policy object that `p` names (the last policy's for a choice out of range).
template <class F>
decltype(auto) visit(choice p, F&& f) {
  return visit_from<0>(p, f);
}

inline bool supports(choice p, collective c, bool commutative) {
  return visit(p, [&](const auto& a) { return supports<std::decay_t<decltype(a)>>(c, commutative); });
}

/// The length of the common timeline: the last step time with a message, plus one.
inline int timeline(std::span<const schedule> all) {
  int t = 0;
  for (const schedule& s : all)
    for (const step& st : s.steps())
      if (st.sends_end > st.sends_begin || st.recvs_end > st.recvs_begin) t = std::max(t, st.time + 1);
  return t;
}

/// Every rank's schedule for `pr`, built as the collectives build them (empty when the policy
/// has none; empty schedules for zero elements, which the collectives return from at once).
/// all_reduce by reduce-scatter + all-gather: the all-gather starts on the common timeline once
/// the longest reduce-scatter has ended; `ag_start`, when given, receives that step for the
/// first segment (-1 for a policy's own all_reduce).
template <class A>
std::vector<schedule> schedules(const A& a, const problem& pr, int* ag_start = nullptr) {
  std::vector<schedule> v;
  if (ag_start) *ag_start = -1;
  if (!supports<A>(pr.coll, pr.commutative)) return v;
  const int n = pr.n;
  if (pr.count == 0) return std::vector<schedule>(std::size_t(n));  // zero elements: nothing runs
  const std::size_t e = pr.elem;
  // all_reduce as reduce-scatter + all-gather (algo/compose.hpp), each segment's all-gather
  // placed after every rank's reduce-scatter has ended (the collective runs them one after the
  // other). Segments but the last are alike, so the placement is worked out once per length.
  std::size_t placed = 0;
  algo::segment_times place;
  auto global = [&](std::size_t len, const schedule&, const schedule&) {
    if constexpr (requires(const algo::rs_problem& p) { a.reduce_scatter(p); }) {
      if (len != placed || place.next == 0) {
        const partition blocks(len, n);
        std::vector<schedule> rs, ag;
        for (int q = 0; q < n; ++q) {
          rs.push_back(a.reduce_scatter(algo::rs_problem{q, n, blocks, buf::in, buf::out, e, pr.commutative, pr.stepwise_exact}));
          ag.push_back(a.all_gather(algo::ag_problem{q, n, blocks, true, 0, e}));
        }
        // (A reduce-scatter may end with a step that only copies its result into place: it
        // merges into the all-gather's first step and takes no slot of its own.)
        place = {timeline(rs), timeline(rs) + timeline(ag)};
        placed = len;
        if (ag_start && *ag_start < 0) *ag_start = place.ag;
      }
    }
    return place;
  };
  algo::visit_collective(pr.coll, [&]<collective C>() {
    using S = algo::schedule_of<C>;
    if constexpr (S::template has<A>)
      for (int r = 0; r < n; ++r) S::with_problem(r, pr.shape(), [&](const auto& q) { v.push_back(S::build(a, q, global)); });
  });
  return v;
}

inline std::vector<schedule> schedules(choice p, const problem& pr, int* ag_start = nullptr) {
  return visit(p, [&](const auto& a) { return schedules(a, pr, ag_start); });
}

/// What a call costs, read off its schedules.
struct cost {
  std::int64_t steps = 0;     // the critical path: the common timeline's length
  std::uint64_t bytes = 0;    // Σ over steps of the most bytes one rank sends or receives in it
  std::uint64_t both = 0;     // Σ over steps of the most bytes one rank moves in its smaller direction
  std::uint64_t reduced = 0;  // Σ over steps of the most bytes one rank reduces in it
  std::vector<transport::traffic> ranks;  // per rank, what transport::counting records (analyse only)
  using step_cost = algo::step_load;
  /// Along the timeline, as runs of equal steps: per_step, `periods` times over, then `tail`
  /// (a segmented all_reduce: its full segments, then the last).
  algo::load_runs per_step;
  std::uint64_t periods = 1;
  algo::load_runs tail;

  /// The steps one at a time (for tests and small problems: it expands every run).
  std::vector<step_cost> expanded() const {
    std::vector<step_cost> v;
    auto put = [&](const algo::load_runs& r) {
      for (const step_cost& s : r)
        for (std::uint64_t i = 0; i < s.repeat; ++i) v.push_back({s.active, s.bytes, s.both, s.reduced, 1});
    };
    for (std::uint64_t p = 0; p < periods; ++p) put(per_step);
    put(tail);
    return v;
  }
  /// Sets the totals from the runs.
  void total() {
    steps = 0;
    bytes = both = reduced = 0;
    auto add = [&](const algo::load_runs& r, std::uint64_t times) {
      for (const step_cost& s : r) {
        steps += std::int64_t(s.repeat * times);
        bytes += s.bytes * s.repeat * times;
        both += s.both * s.repeat * times;
        reduced += s.reduced * s.repeat * times;
      }
    };
    add(per_step, periods);
    add(tail, 1);
  }
};

/// Walks every rank's schedule (elements of `elem` bytes): the per-rank counts and the loads.
inline cost analyse(std::span<const schedule> all, std::size_t elem) {
  cost c;
  algo::load_maxima m;
  for (const schedule& s : all) {
    transport::traffic t;
    for (const step& st : s.steps()) {
      if (st.sends_end == st.sends_begin && st.recvs_end == st.recvs_begin) continue;
      ++t.steps;
      for (auto i = st.sends_begin; i < st.sends_end; ++i) {
        ++t.messages_sent;
        t.bytes_sent += s.sends()[i].src.count * elem;
      }
      for (auto i = st.recvs_begin; i < st.recvs_end; ++i) {
        const recv_op& r = s.recvs()[i];
        ++t.messages_received;
        t.bytes_received += r.dst.count * elem;
        if (r.how != combine::copy) t.bytes_reduced += r.dst.count * elem;
      }
    }
    c.ranks.push_back(t);
    m.add(s, elem);
  }
  c.per_step = m.runs();
  c.total();
  return c;
}

inline cost analyse(choice p, const problem& pr) { return analyse(schedules(p, pr), pr.elem); }


/// What a call costs, from the policy's structure or a walk of one rank at a time (see the
/// top): the same loads and totals as analyse(schedules(a, pr)), without the per-rank counts,
/// in O(N log N) time and O(timeline) memory at most.
template <class A>
cost profile(const A& a, const problem& pr) {
  cost c;
  if (!supports<A>(pr.coll, pr.commutative) || pr.count == 0) return c;
  algo::visit_collective(pr.coll, [&]<collective C>() {
    using S = algo::schedule_of<C>;
    if constexpr (S::template has<A>)
      S::with_problem(0, pr.shape(), [&](const auto& q) {
        algo::load_plan l = algo::plan_of<C>(a, q);
        c.per_step = std::move(l.per_step);
        c.periods = l.periods;
        c.tail = std::move(l.tail);
      });
  });
  c.total();
  return c;
}

inline cost profile(choice p, const problem& pr) {
  return visit(p, [&](const auto& a) { return profile(a, pr); });
}

using algo::policy_fit;
using algo::step_curve;

/// α, β, γ: seconds per step, per byte on a link, per byte reduced; δ: the share of a rank's
/// smaller direction that adds to its larger one (0: full duplex); and where they came from.
/// When `curve` has points, a step is charged from them instead (see step_seconds).
struct params {
  double alpha = 0, beta = 0, gamma = 0;
  std::string source;  // "calibrated <file> (<date>)", "shipped defaults for <transport>", ...
  int cores = 0;       // the cores the calibration's ranks shared (0: not known, no sharing)
  int ranks = 0;       // the ranks it was measured with
  double delta = 0;    // 0 (full duplex) .. 1 (an exchange costs twice a one-way message)
  step_curve curve{};  // measured step times by size (algo/calibration.hpp), else the line above
  policy_fit fit{};    // measured / predicted per collective, policy and size (algo/calibration.hpp)
};

/// What one step with load `s` costs. With a measured curve: the one-way time of its largest
/// message, plus the exchange's extra for the share it also receives while sending, plus the
/// reduction's extra for the share it reduces, each read off the curve at that size: a step of
/// 256 KiB that stays in cache is charged as such, one of 4 MiB that streams from memory as that
/// (the line through 64 KiB, 1 MiB and 16 MiB charged both alike, and chose a ring of 4 MiB
/// exchanges over a tree of 256 KiB chunks that ran 1.3x faster: docs/automatic.md).
inline double step_seconds(const params& p, const algo::step_load& s) {
  if (p.curve.n == 0)
    return p.alpha + p.beta * (double(s.bytes) + p.delta * double(s.both)) + p.gamma * double(s.reduced);
  const step_curve& c = p.curve;
  const double b = double(s.bytes);
  const double one = c.at(c.one_way, b), ex = c.at(c.exchange, b), red = c.at(c.reduce, b);
  const double f_both = b > 0 ? double(s.both) / b : 0, f_red = b > 0 ? double(s.reduced) / b : 0;
  return one + std::max(0.0, ex - one) * f_both + std::max(0.0, red - ex) * f_red;
}

/// The share of a fully busy step that a step with `active` ranks costs (see the top).
inline double sharing(const params& p, std::uint32_t active) {
  if (p.cores <= 0 || p.ranks <= p.cores) return 1.0;
  return std::max(1.0, double(active) / p.cores) / (double(p.ranks) / p.cores);
}

inline double predict(const cost& c, const params& p) {
  if (p.curve.n == 0 && (p.cores <= 0 || p.ranks <= p.cores))
    return p.alpha * double(c.steps) + p.beta * (double(c.bytes) + p.delta * double(c.both)) + p.gamma * double(c.reduced);
  auto sum = [&](const algo::load_runs& r) {
    double t = 0;
    for (const auto& s : r) t += double(s.repeat) * sharing(p, s.active) * step_seconds(p, s);
    return t;
  };
  return double(c.periods) * sum(c.per_step) + sum(c.tail);
}

struct candidate {
  choice policy;
  cost c;
  double seconds = 0;
};

/// Every policy that can run `pr`, with its cost and predicted time, in the order of
/// all_policies.
inline std::vector<candidate> evaluate(const problem& pr, const params& p) {
  std::vector<candidate> v;
  for (choice q : all_policies) {
    if (!supports(q, pr.coll, pr.commutative)) continue;
    candidate x{q, profile(q, pr), 0};
    x.seconds = predict(x.c, p) * p.fit.at(pr.coll, q, double(pr.bytes()));
    v.push_back(std::move(x));
  }
  return v;
}

/// The policy with the least predicted time for `pr`. Predictions within a millionth of each
/// other are a tie (a 3-step chain and a 2-step tree of a small broadcast, when the model's
/// sharing of cores charges both 1.5 steps), and the one with fewer steps wins it: fewer hops
/// that wait on a peer being scheduled (4 processes on 2 cores, 128 B broadcast: chain 0.65 us,
/// tree 0.40).
inline choice best(const problem& pr, const params& p) {
  const auto v = evaluate(pr, p);
  if (v.empty()) return algo::choice_of<algo::pairwise>;
  auto better = [](const candidate& a, const candidate& b) {
    const double tol = 1e-6 * std::max(a.seconds, b.seconds);
    if (a.seconds < b.seconds - tol) return true;
    if (b.seconds < a.seconds - tol) return false;
    return a.c.steps < b.c.steps;
  };
  const candidate* b = &v.front();
  for (const candidate& x : v)
    if (better(x, *b)) b = &x;
  return b->policy;
}

}  // namespace collx::model
