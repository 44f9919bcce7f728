#pragma once
// Builds every rank's schedule for one collective and policy, without running anything, so
// tests can check them against each other (matching), against themselves (hazards) and against
// cost formulas.
#include <collx/collx.hpp>

#include <string>
#include <vector>

namespace collx_test {

enum class coll { all_reduce, reduce_scatter, all_gather, broadcast, reduce, all_to_all };

inline const char* name(coll c) {
  switch (c) {
    case coll::all_reduce: return "all_reduce";
    case coll::reduce_scatter: return "reduce_scatter";
    case coll::all_gather: return "all_gather";
    case coll::broadcast: return "broadcast";
    case coll::reduce: return "reduce";
    case coll::all_to_all: return "all_to_all";
  }
  return "?";
}

/// The schedules of all n ranks, as the collectives build them (all_reduce: the policy's own, or
/// reduce-scatter + all-gather appended). `count` is the collective's count argument.
template <class Algo>
std::vector<collx::schedule> schedules(const Algo& a, coll c, int n, std::size_t count, int root = 0,
                                       bool commutative = true, std::size_t elem = 4) {
  using namespace collx;
  std::vector<schedule> v;
  std::vector<std::size_t> counts(static_cast<std::size_t>(n), count), offs(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) offs[std::size_t(i)] = std::size_t(i) * count;
  for (int r = 0; r < n; ++r) {
    switch (c) {
      case coll::all_reduce:
        if constexpr (requires(const algo::ar_problem& p) { a.all_reduce(p); }) {
          v.push_back(a.all_reduce({r, n, count, elem, commutative, buf::in}));
        } else if constexpr (requires(const algo::rs_problem& p) { a.reduce_scatter(p); }) {
          // Two executions, one after the other: the all-gather starts on a common timeline
          // after the longest reduce-scatter.
          const partition b(count, n);
          int shift = 0;
          for (int q = 0; q < n; ++q)
            shift = std::max(shift, a.reduce_scatter({q, n, b, buf::in, buf::out, elem, commutative}).span());
          schedule s = a.reduce_scatter({r, n, b, buf::in, buf::out, elem, commutative});
          s.append(a.all_gather({r, n, b, true, 0, elem}), shift);
          v.push_back(s);
        }
        break;
      case coll::reduce_scatter:
        if constexpr (requires(const algo::rs_problem& p) { a.reduce_scatter(p); })
          v.push_back(a.reduce_scatter({r, n, partition(count * std::size_t(n), n), buf::in, buf::none, elem, commutative}));
        break;
      case coll::all_gather:
        if constexpr (requires(const algo::ag_problem& p) { a.all_gather(p); })
          v.push_back(a.all_gather({r, n, partition(count * std::size_t(n), n), false, 0, elem}));
        break;
      case coll::broadcast:
        if constexpr (requires(const algo::bcast_problem& p) { a.broadcast(p); })
          v.push_back(a.broadcast({r, n, root, count, elem}));
        break;
      case coll::reduce:
        if constexpr (requires(const algo::reduce_problem& p) { a.reduce(p); })
          v.push_back(a.reduce({r, n, root, count, elem, commutative}));
        break;
      case coll::all_to_all:
        if constexpr (requires(const algo::a2a_problem& p) { a.all_to_all(p); })
          v.push_back(a.all_to_all(algo::a2a_problem{r, n, std::span<const std::size_t>(counts), std::span<const std::size_t>(offs), std::span<const std::size_t>(counts), std::span<const std::size_t>(offs), elem, true}));
        break;
    }
  }
  return v;
}

/// Every send must meet a receive of the same size in the same step of its peer, in the same
/// order among the messages of that pair; no step may send from memory it receives into.
/// Returns "" or the first problem found.
inline std::string check_consistent(const std::vector<collx::schedule>& all) {
  using namespace collx;
  const int n = int(all.size());
  struct msg { int time; std::size_t count; };
  // per (from, to): ordered list of (time, count) sent and received
  std::vector<std::vector<msg>> sent(std::size_t(n * n)), got(std::size_t(n * n));
  for (int r = 0; r < n; ++r) {
    const schedule& s = all[std::size_t(r)];
    int last = -1;
    for (const step& st : s.steps()) {
      if (st.time <= last) return "rank " + std::to_string(r) + ": step times not increasing";
      last = st.time;
      for (auto i = st.sends_begin; i < st.sends_end; ++i) {
        const send_op& o = s.sends()[i];
        if (o.peer < 0 || o.peer >= n || o.peer == r) return "rank " + std::to_string(r) + ": bad peer";
        sent[std::size_t(r * n + o.peer)].push_back({st.time, o.src.count});
        for (auto j = st.recvs_begin; j < st.recvs_end; ++j) {
          const region& d = s.recvs()[j].dst;
          if (d.b == o.src.b && d.count && o.src.count && d.offset < o.src.offset + o.src.count &&
              o.src.offset < d.offset + d.count)
            return "rank " + std::to_string(r) + " t" + std::to_string(st.time) + ": sends from memory it receives into";
        }
      }
      for (auto i = st.recvs_begin; i < st.recvs_end; ++i) {
        const recv_op& o = s.recvs()[i];
        if (o.peer < 0 || o.peer >= n || o.peer == r) return "rank " + std::to_string(r) + ": bad peer";
        got[std::size_t(o.peer * n + r)].push_back({st.time, o.dst.count});
        if (o.how != combine::copy && o.with.count != o.dst.count) return "combine operand sizes differ";
      }
    }
  }
  for (int f = 0; f < n; ++f)
    for (int t = 0; t < n; ++t) {
      const auto& a = sent[std::size_t(f * n + t)];
      const auto& b = got[std::size_t(f * n + t)];
      if (a.size() != b.size())
        return "rank " + std::to_string(f) + " sends " + std::to_string(a.size()) + " messages to rank " +
               std::to_string(t) + ", which receives " + std::to_string(b.size());
      for (std::size_t i = 0; i < a.size(); ++i)
        if (a[i].time != b[i].time || a[i].count != b[i].count)
          return "message " + std::to_string(i) + " from rank " + std::to_string(f) + " to " + std::to_string(t) +
                 ": sent at t" + std::to_string(a[i].time) + " (" + std::to_string(a[i].count) + " elements), received at t" +
                 std::to_string(b[i].time) + " (" + std::to_string(b[i].count) + ")";
    }
  return {};
}

/// The length of the global timeline: the number of steps on the critical path.
inline int span(const std::vector<collx::schedule>& all) {
  int s = 0;
  for (const auto& x : all)
    for (const auto& st : x.steps())
      if (st.sends_end > st.sends_begin || st.recvs_end > st.recvs_begin) s = std::max(s, st.time + 1);
  return s;
}

}  // namespace collx_test
