#pragma once
// How each collective's schedules are built, at compile time: for collective C, schedule_of<C>
// says whether policy A has a schedule for it, rank r's problem for a model's call (every rank
// passing `count` elements of `elem` bytes, a root, an op's commutativity), the schedule, and the
// per-step loads the cost model charges (algo/profile.hpp). algo/collectives.hpp lists what each
// collective is; this is what the cost model (algo/model.hpp) and collx-explain build from, with
// no switch over the collectives of their own.
//
// A new collective: its enumerator and line in algo/collectives.hpp, and its specialisation here
// (the static_assert at the bottom says when one is missing).
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "../core/partition.hpp"
#include "../core/schedule.hpp"
#include "collectives.hpp"
#include "compose.hpp"
#include "pairwise.hpp"
#include "problem.hpp"
#include "profile.hpp"
#include "tuning.hpp"

namespace collx::algo {

/// One call as the model sees it: what every rank passes. `count` is the collective's count
/// argument (a block's for the split collectives: reduce_scatter's output, all_gather's input).
struct call_shape {
  int n = 1;
  std::size_t count = 0;
  std::size_t elem = 4;
  int root = 0;
  bool commutative = true;
  bool stepwise_exact = false;  // (algo/problem.hpp: rs_problem)
};

/// The loads of a call along the timeline: `per_step`, `periods` times over, then `tail` (a
/// segmented all_reduce: its full segments, then the last).
struct load_plan {
  load_runs per_step;
  std::uint64_t periods = 1;
  load_runs tail;
};

namespace detail_schedule_of {
/// The loads of every rank's schedule of problem p, built one rank at a time.
template <class P, class Build>
load_runs walk(P p, Build&& build) {
  load_maxima m;
  for (int r = 0; r < p.size; ++r) {
    p.rank = r;
    m.add(build(p), p.elem_size);
  }
  return m.runs();
}
}  // namespace detail_schedule_of

template <collective C>
struct schedule_of;

template <>
struct schedule_of<collective::reduce_scatter> {
  using problem = rs_problem;
  template <class A>
  static constexpr bool has = requires(const A& a, const problem& p) { a.reduce_scatter(p); };
  template <class F>
  static decltype(auto) with_problem(int r, const call_shape& s, F&& f) {
    return f(problem{r, s.n, partition(s.count * std::size_t(s.n), s.n), buf::in, buf::none, s.elem, s.commutative, s.stepwise_exact});
  }
  template <class A, class... Place>
  static schedule build(const A& a, const problem& p, Place&&...) {
    return a.reduce_scatter(p);
  }
  template <class A>
  static load_runs loads(const A& a, const problem& p) {
    if constexpr (requires { a.reduce_scatter_loads(p); }) return a.reduce_scatter_loads(p);
    else return detail_schedule_of::walk(p, [&](const problem& q) { return a.reduce_scatter(q); });
  }
};

template <>
struct schedule_of<collective::all_gather> {
  using problem = ag_problem;
  template <class A>
  static constexpr bool has = requires(const A& a, const problem& p) { a.all_gather(p); };
  template <class F>
  static decltype(auto) with_problem(int r, const call_shape& s, F&& f) {
    return f(problem{r, s.n, partition(s.count * std::size_t(s.n), s.n), false, 0, s.elem});
  }
  template <class A, class... Place>
  static schedule build(const A& a, const problem& p, Place&&...) {
    return a.all_gather(p);
  }
  template <class A>
  static load_runs loads(const A& a, const problem& p) {
    if constexpr (requires { a.all_gather_loads(p); }) return a.all_gather_loads(p);
    else return detail_schedule_of::walk(p, [&](const problem& q) { return a.all_gather(q); });
  }
};

/// all_reduce: the policy's own, or reduce-scatter + all-gather (algo/compose.hpp), in segments
/// for a large buffer as the collective runs it.
template <>
struct schedule_of<collective::all_reduce> {
  using problem = ar_problem;
  template <class A>
  static constexpr bool own = requires(const A& a, const problem& p) { a.all_reduce(p); };
  template <class A>
  static constexpr bool has = own<A> || schedule_of<collective::reduce_scatter>::has<A>;
  template <class F>
  static decltype(auto) with_problem(int r, const call_shape& s, F&& f) {
    return f(problem{r, s.n, s.count, s.elem, s.commutative, buf::in, s.stepwise_exact});
  }
  /// `place(len, rs, ag)`, where given, places a composed segment's all-gather on the common
  /// timeline (algo/compose.hpp: composed_all_reduce).
  template <class A, class... Place>
  static schedule build(const A& a, const problem& p, Place&&... place) {
    if constexpr (own<A>) return a.all_reduce(p);
    else return composed_all_reduce(a, p, std::forward<Place>(place)...);
  }
  template <class A>
  static load_plan plan(const A& a, const problem& p) {
    load_plan l;
    if constexpr (own<A>) {
      if constexpr (requires { a.all_reduce_loads(p); }) l.per_step = a.all_reduce_loads(p);
      else l.per_step = detail_schedule_of::walk(p, [&](const problem& q) { return a.all_reduce(q); });
    } else {
      // reduce-scatter + all-gather per segment: the full segments alike
      auto segment = [&](std::size_t len) {
        const partition blocks(len, p.size);
        load_runs r = schedule_of<collective::reduce_scatter>::loads(
            a, rs_problem{0, p.size, blocks, buf::in, buf::out, p.elem_size, p.commutative, p.stepwise_exact});
        append_loads(r, schedule_of<collective::all_gather>::loads(a, ag_problem{0, p.size, blocks, true, 0, p.elem_size}));
        return r;
      };
      const std::size_t seg = tuning::all_reduce_segment(p.count, p.elem_size);
      l.per_step = segment(seg);
      l.periods = p.count / seg;
      if (p.count % seg != 0) l.tail = segment(p.count % seg);
    }
    return l;
  }
};

template <>
struct schedule_of<collective::broadcast> {
  using problem = bcast_problem;
  template <class A>
  static constexpr bool has = requires(const A& a, const problem& p) { a.broadcast(p); };
  template <class F>
  static decltype(auto) with_problem(int r, const call_shape& s, F&& f) {
    return f(problem{r, s.n, s.root, s.count, s.elem});
  }
  template <class A, class... Place>
  static schedule build(const A& a, const problem& p, Place&&...) {
    return a.broadcast(p);
  }
  template <class A>
  static load_runs loads(const A& a, const problem& p) {
    if constexpr (requires { a.broadcast_loads(p); }) return a.broadcast_loads(p);
    else return detail_schedule_of::walk(p, [&](const problem& q) { return a.broadcast(q); });
  }
};

template <>
struct schedule_of<collective::reduce> {
  using problem = reduce_problem;
  template <class A>
  static constexpr bool has = requires(const A& a, const problem& p) { a.reduce(p); };
  template <class F>
  static decltype(auto) with_problem(int r, const call_shape& s, F&& f) {
    return f(problem{r, s.n, s.root, s.count, s.elem, s.commutative, s.stepwise_exact});
  }
  template <class A, class... Place>
  static schedule build(const A& a, const problem& p, Place&&...) {
    return a.reduce(p);
  }
  template <class A>
  static load_runs loads(const A& a, const problem& p) {
    if constexpr (requires { a.reduce_loads(p); }) return a.reduce_loads(p);
    else return detail_schedule_of::walk(p, [&](const problem& q) { return a.reduce(q); });
  }
};

template <>
struct schedule_of<collective::all_to_all> {
  using problem = a2a_problem;
  template <class A>
  static constexpr bool has = requires(const A& a, const problem& p) { a.all_to_all(p); };
  /// Every block `count` elements (all_to_all, not all_to_all_v): the counts live in f's call.
  template <class F>
  static decltype(auto) with_problem(int r, const call_shape& s, F&& f) {
    const auto un = std::size_t(s.n);
    std::vector<std::size_t> counts(un, s.count), offs(un);
    for (std::size_t i = 0; i < un; ++i) offs[i] = i * s.count;
    return f(problem{r, s.n, counts, offs, counts, offs, s.elem, true});
  }
  template <class A, class... Place>
  static schedule build(const A& a, const problem& p, Place&&...) {
    return a.all_to_all(p);
  }
  template <class A>
  static load_runs loads(const A& a, const problem& p) {
    return detail_schedule_of::walk(p, [&](const problem& q) { return a.all_to_all(q); });
  }
};

/// The loads of one call of collective C (for all but all_reduce: one run of steps).
template <collective C, class A>
load_plan plan_of(const A& a, const typename schedule_of<C>::problem& p) {
  if constexpr (requires { schedule_of<C>::plan(a, p); }) return schedule_of<C>::plan(a, p);
  else return {schedule_of<C>::loads(a, p), 1, {}};
}

namespace detail_schedule_of {
template <std::size_t I, class F>
constexpr decltype(auto) visit_from(collective c, F& f) {
  constexpr collective C = collectives[I].id;
  if constexpr (I + 1 == kCollectives) {
    return f.template operator()<C>();
  } else {
    if (c == C) return f.template operator()<C>();
    return visit_from<I + 1>(c, f);
  }
}
}  // namespace detail_schedule_of

/// Calls f.template operator()<C>() for the collective c names: a generic lambda
/// `[&]<collective C>() { ... schedule_of<C> ... }` runs for the one collective at hand.
template <class F>
constexpr decltype(auto) visit_collective(collective c, F&& f) {
  return detail_schedule_of::visit_from<0>(c, f);
}

// Every listed collective has its schedule_of (a missing one fails to compile here).
template <std::size_t... I>
constexpr bool all_specialised(std::index_sequence<I...>) {
  return ((sizeof(schedule_of<collectives[I].id>) > 0) && ...);
}
static_assert(all_specialised(std::make_index_sequence<kCollectives>{}));

}  // namespace collx::algo
