#pragma once
// What every collective shares: argument checks, the compile-time checks of its policy and op,
// and the resolution of algo::automatic to a concrete policy.
#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string_view>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "../algo/automatic.hpp"
#include "../algo/deterministic.hpp"
#include "../algo/policies.hpp"
#include "../algo/nodes_model.hpp"
#include "../algo/two_level.hpp"
#include "../algo/binomial.hpp"
#include "../algo/calibration.hpp"
#include "executor.hpp"
#include "../algo/model.hpp"

namespace collx::detail {

template <class X>
inline constexpr bool is_span_v = false;
template <class X, std::size_t N>
inline constexpr bool is_span_v<std::span<X, N>> = true;

/// True when two spans share memory without being the same range.
template <class A, class B>
bool partially_overlap(std::span<A> a, std::span<B> b) {
  const auto* a0 = reinterpret_cast<const std::byte*>(a.data());
  const auto* b0 = reinterpret_cast<const std::byte*>(b.data());
  const auto* a1 = a0 + a.size_bytes();
  const auto* b1 = b0 + b.size_bytes();
  if (a.empty() || b.empty()) return false;
  return a0 < b1 && b0 < a1 && !(a0 == b0 && a1 == b1);
}

inline std::string n_elems(std::size_t n) { return std::to_string(n) + (n == 1 ? " element" : " elements"); }

/// The compile-time checks of a reducing collective: E, Op and Algo fit together.
template <class E, class Op, class Algo>
constexpr bool check_reducing() {
  static_assert(check_op<Op, E>());
  static_assert(check_policy<Algo>());
  if constexpr (!std::is_same_v<Algo, algo::automatic>)
    static_assert(is_commutative_v<Op> || Algo::keeps_rank_order,
                  "collx: this policy combines in ring order, not rank order, so it cannot honour an op declared "
                  "`commutative = false`: use collx::algo::tree{}, collx::algo::recursive_halving{} or "
                  "collx::algo::automatic{}");
  return true;
}

/// automatic_choice's answer for algo::two_level (not one of algo::policies: the two-level model
/// chooses it, or COLLX_ALGO names it, on a communicator laid out on several nodes).
inline constexpr algo::choice two_level_choice = algo::choice(algo::policies::size);

/// COLLX_ALGO parsed (grammar in algo/automatic.hpp): per collective a choice, kModel (named
/// `automatic`: the model, whatever the global value) or kUnset, and the global choice or
/// kUnset. Throws errc::invalid_argument naming what is wrong.
struct algo_override {
  static constexpr std::int8_t kUnset = -1, kModel = -2;
  std::array<std::int8_t, algo::kCollectives> per = [] {
    std::array<std::int8_t, algo::kCollectives> a{};
    a.fill(kUnset);
    return a;
  }();
  std::int8_t all = -1;
};

inline algo_override parse_algo_override(std::string_view v) {
  algo_override o;
  auto bad = [&](const std::string& why) -> void {
    throw error(errc::invalid_argument, "COLLX_ALGO=\"" + std::string(v) + "\": " + why);
  };
  auto policies = [] {
    std::string s;
    for (auto p : model::all_policies) s += std::string(s.empty() ? "" : ", ") + model::name(p);
    return s + ", two_level, automatic";
  };
  std::size_t at = 0;
  while (at <= v.size()) {
    const std::size_t comma = std::min(v.find(',', at), v.size());
    std::string_view item = v.substr(at, comma - at);
    at = comma + 1;
    while (!item.empty() && item.front() == ' ') item.remove_prefix(1);
    while (!item.empty() && item.back() == ' ') item.remove_suffix(1);
    if (item.empty()) continue;
    const std::size_t eq = item.find('=');
    const std::string_view pname = eq == std::string_view::npos ? item : item.substr(eq + 1);
    std::int8_t pol = algo_override::kModel;
    if (pname == "two_level") {
      pol = std::int8_t(two_level_choice);
    } else if (pname != "automatic") {
      const auto p = model::parse_policy(pname);
      if (!p) bad("unknown policy '" + std::string(pname) + "' (policies: " + policies() + ")");
      pol = std::int8_t(*p);
    }
    if (eq == std::string_view::npos) {
      o.all = pol == algo_override::kModel ? algo_override::kUnset : pol;
      continue;
    }
    const std::string_view cname = item.substr(0, eq);
    const auto c = model::parse_collective(cname);
    if (!c) {
      std::string cs;
      for (auto x : model::all_collectives) cs += std::string(cs.empty() ? "" : ", ") + model::name(x);
      bad("unknown collective '" + std::string(cname) + "' (collectives: " + cs + ")");
    }
    if (pol == std::int8_t(two_level_choice) && !model::two_level_supports(*c, true))
      bad("two_level has no " + std::string(model::name(*c)) + " schedule");
    if (pol >= 0 && pol != std::int8_t(two_level_choice) && !model::supports(algo::choice(pol), *c, true))
      bad(std::string(model::name(algo::choice(pol))) + " has no " + model::name(*c) + " schedule");
    o.per[std::size_t(*c)] = pol;
  }
  return o;
}

/// automatic's own traffic (its setup's broadcast, a trial's pooled timings): schedule `s` run
/// over `bytes` of host memory at `p`, a call of its own named "automatic".
template <class T>
void automatic_exchange(communicator<T>& comm, const schedule& s, std::byte* p, std::size_t bytes) {
  auto call = make_call<std::byte, no_op>(comm, "automatic", "tree", bytes, 0);
  on_transport_memory(comm, p, bytes, [&](std::byte* q) { execute(comm, call, s, static_cast<const std::byte*>(q), q, no_op{}); });
}

/// The link between nodes, measured: what a calibration file cannot know, since
/// `collx-perf --calibrate --transport tcp` times loopback on one host. Rank 0 and the first rank
/// on another node pass messages over the transport between nodes: 8 B back and forth (α: half
/// the round trip, collx's own cost included, as the model's α is), 512 KiB and 1 MiB back and
/// forth (β: the slope between the two, so a burst the link lets through at once, as a token
/// bucket does, is not read as bandwidth: from 8 B to 1 MiB read a 1 Gbit/s bucket of 256 KB as
/// 1.24 Gbit/s), and 1 MiB both ways at once (δ: what sending while receiving adds). Medians of
/// kRounds each, after a first round that opens the link. Collective over the
/// communicator: every rank makes the same calls (the others' schedules are empty: their calls
/// still count, so every rank's next call has the same number), the two measure, rank 0 gets the
/// numbers. 10 MiB each way in all: 0.15 s of traffic at 1 Gbit/s (0.7 s measured with a job's
/// setup between namespaces), 14 s at 10 Mbit/s, once per communicator; the calls have the
/// communicator's deadlines (options::timeout), so a link that slow wants COLLX_PROBE_LINK=0 or a
/// longer timeout. β is 0 where 1 MiB took no longer than 512 KiB (noise on a fast link): then
/// the calibration's numbers stay.
struct link_measure {
  double alpha = 0, beta = 0, delta = 0;
  int peer = -1;
};
template <class T>
link_measure measure_link_between_nodes(communicator<T>& comm, const node_map& nm) {
  link_measure m;
  for (int r = 1; r < comm.size() && m.peer < 0; ++r)
    if (!nm.same_node(0, r)) m.peer = r;
  if (m.peer < 0) return m;
  const int me = comm.rank();
  const bool measures = me == 0 || me == m.peer;
  constexpr std::size_t kSmall = 8, kMid = std::size_t(512) << 10, kLarge = std::size_t(1) << 20;
  constexpr int kRounds = 3, kSmallRounds = 9;  // (8 B costs nothing: more rounds, for the namespaces' noisy wakeups)
  const int other = me == 0 ? m.peer : 0;
  std::vector<std::byte> b(2 * kLarge, std::byte{0});
  auto median_of = [&](std::size_t bytes, bool both_ways, int rounds) {
    schedule s;
    const region first{buf::out, 0, bytes}, second{buf::out, kLarge, bytes};
    if (!measures) {
    } else if (both_ways) {
      s.at(0);
      s.send(other, first);
      s.recv(other, second);
    } else {  // rank 0 sends, the peer answers
      s.at(0);
      me == 0 ? s.send(other, first) : s.recv(other, first);
      s.at(1);
      me == 0 ? s.recv(other, second) : s.send(other, second);
    }
    std::vector<double> t;
    for (int k = 0; k <= rounds; ++k) {
      const auto t0 = std::chrono::steady_clock::now();
      automatic_exchange(comm, s, b.data(), b.size());
      if (k > 0) t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    std::nth_element(t.begin(), t.begin() + rounds / 2, t.end());
    return t[std::size_t(rounds / 2)];
  };
  const double small = median_of(kSmall, false, kSmallRounds) / 2, mid = median_of(kMid, false, kRounds) / 2,
               large = median_of(kLarge, false, kRounds) / 2, both = median_of(kLarge, true, kRounds);
  if (me != 0) return m;
  m.alpha = small;
  if (large <= mid) return m;  // (no slope to read: m.beta stays 0)
  m.beta = (large - mid) / double(kLarge - kMid);
  m.delta = std::clamp((both - large) / (m.beta * double(kLarge)), 0.0, 1.0);
  return m;
}

/// algo::automatic's first call on a communicator: reads this rank's COLLX_ALGO (an error here
/// if misspelt) and its parameters, then takes rank 0's, so every rank decides alike.
template <class T>
void automatic_setup(communicator<T>& comm) {
  auto& st = comm.automatic();
  if (st.ready) return;
  struct blob {
    typename communicator<T>::automatic_state::numbers n, node, net;
    bool levels;
    bool probe;  // measure the link between nodes (measure_link_between_nodes)
    std::int8_t per[algo::kCollectives];
    std::int8_t all;
    bool tune;
    char source[640];
  } b{};
  static_assert(std::is_trivially_copyable_v<blob>);
  // Every rank checks its own COLLX_ALGO (a misspelt value is an error wherever it is set);
  // a rank that fails here tells its peers, which are about to wait for it in the broadcast.
  // Only rank 0 reads the calibration files: the others take its numbers anyway, and a
  // thousand ranks reading $HOME at once is a storm on a shared file system.
  algo_override o;
  model::params p, pn, pt;
  auto numbers = [](const model::params& q) -> typename communicator<T>::automatic_state::numbers {
    return {q.alpha, q.beta, q.gamma, q.delta, q.cores, q.ranks, q.curve, q.fit};
  };
  try {
    o = parse_algo_override(env_string("COLLX_ALGO"));
    const long long tune = env_int("COLLX_AUTOTUNE", 0ll, 1ll, 0ll);
    if (comm.rank() == 0) {
      p = model::params_for(transport_kind(comm.transport()), comm.size());
      b.tune = tune == 1;
      // Laid out on nodes: each level's, from its own transport (algo/nodes_model.hpp).
      with_levels(comm.transport(), [&](const char* within, const char* between, const node_map& nm) {
        pn = model::params_for(within, nm.widest());
        pt = model::params_for(between, comm.size());
        b.levels = true;
        // (only where the two-level model runs: several nodes, not one rank on each)
        b.probe = !nm.flat() && env_int("COLLX_PROBE_LINK", 0ll, 1ll, 1ll) == 1;
        p.source = "node: " + pn.source + "; between nodes: " + pt.source;
      });
    }
  } catch (const std::exception& e) {
    comm.transport().abort(e.what());
    throw;
  }
  b.n = numbers(p);
  b.node = numbers(pn);
  b.net = numbers(pt);
  std::copy(o.per.begin(), o.per.end(), b.per);
  b.all = o.all;
  std::snprintf(b.source, sizeof b.source, "%s", p.source.c_str());
  if (comm.size() > 1) {
    schedule s;
    algo::binomial::broadcast(s, 0, comm.rank(), comm.size(), 0, {buf::out, 0, sizeof b});
    automatic_exchange(comm, s, reinterpret_cast<std::byte*>(&b), sizeof b);
    if (b.probe) {
      // Between nodes: the link measured, in place of loopback's numbers (a line: no curve, no
      // per-policy fit), then rank 0's numbers to every rank again.
      with_levels(comm.transport(), [&](const char*, const char*, const node_map& nm) {
        const link_measure m = measure_link_between_nodes(comm, nm);
        if (comm.rank() != 0 || m.peer < 0) return;  // (rank 0 has the numbers)
        char line[160] = "; between nodes: 1 MiB took no longer than 512 KiB, its numbers kept";
        const std::size_t used = strnlen(b.source, sizeof b.source);
        const auto say = [&] { std::snprintf(b.source + used, sizeof b.source - used, "%s", line); };
        if (m.beta <= 0) return say();
        b.net.alpha = m.alpha;
        b.net.beta = m.beta;
        b.net.delta = m.delta;
        b.net.curve = {};
        b.net.fit = {};
        b.net.cores = b.net.ranks = 0;
        std::snprintf(line, sizeof line, "; between nodes measured now (ranks 0 and %d): alpha %.1f us, %.3g Gbit/s, delta %.2f", m.peer,
                      m.alpha * 1e6, 8e-9 / m.beta, m.delta);
        say();
      });
      automatic_exchange(comm, s, reinterpret_cast<std::byte*>(&b), sizeof b);
    }
  }
  st.n = b.n;
  st.node = b.node;
  st.net = b.net;
  st.levels = b.levels;
  std::copy(std::begin(b.per), std::end(b.per), st.forced.begin());
  st.forced_all = b.all;
  st.source = std::string(b.source, strnlen(b.source, sizeof b.source));
  st.tune = b.tune && !b.levels;  // (laid out on nodes: the two-level model alone, as yet)
  st.ready = true;
}

/// COLLX_AUTOTUNE: a new shape's trial, or none when the model has one candidate worth trying
/// (algo/automatic.hpp). `v`: every candidate with its predicted time.
template <class Trial>
bool plan_trial(std::vector<model::candidate> v, algo::choice pick, Trial& tr) {
  std::sort(v.begin(), v.end(), [](const model::candidate& a, const model::candidate& b) { return a.seconds < b.seconds; });
  double best = 0;
  for (const model::candidate& x : v)
    if (x.policy == pick) best = x.seconds;
  const int most = best > 5e-3 ? 2 : int(tr.cand.size());
  // the model's pick and its closest rivals, the pick tried last
  std::vector<algo::choice> c{pick};
  for (const model::candidate& x : v)
    if (x.policy != pick && int(c.size()) < most && x.seconds <= 2.5 * best) c.push_back(x.policy);
  if (c.size() < 2) return false;
  tr.k = std::int8_t(c.size());
  for (int i = 0; i < tr.k; ++i) tr.cand[std::size_t(i)] = std::int8_t(c[std::size_t(tr.k - 1 - i)]);
  tr.model = std::int8_t(tr.k - 1);
  tr.reps = std::int8_t(best < 20e-6 ? 4 : best < 200e-6 ? 2 : 1);
  tr.predicted = best;
  tr.done = -1;  // the first call runs the model's pick, untimed: it pays what a first call pays
  return true;
}

/// COLLX_AUTOTUNE: every candidate of a shape has been timed; the ranks pool their timings (a
/// gather to rank 0 and a broadcast of the table, bytes only) and take the same verdict.
template <class T, class Trial>
algo::choice settle_trial(communicator<T>& comm, const model::problem& pr, const Trial& tr) {
  const int n = comm.size(), k = tr.k;
  const std::size_t row = sizeof(double) * std::size_t(k);
  std::vector<double> table(std::size_t(n) * std::size_t(k));
  std::copy_n(tr.fastest.begin(), k, table.begin() + std::ptrdiff_t(comm.rank()) * k);
  schedule s;
  const int t = algo::binomial::gather(s, 0, comm.rank(), n, 0, partition(std::size_t(n) * row, n), buf::out);
  algo::binomial::broadcast(s, t, comm.rank(), n, 0, {buf::out, 0, std::size_t(n) * row});
  automatic_exchange(comm, s, reinterpret_cast<std::byte*>(table.data()), table.size() * sizeof(double));
  std::array<double, std::tuple_size_v<decltype(tr.fastest)>> slowest{};
  for (int r = 0; r < n; ++r)
    for (int i = 0; i < k; ++i) slowest[std::size_t(i)] = std::max(slowest[std::size_t(i)], table[std::size_t(r * k + i)]);
  const int won = algo::settle(std::span<const double>(slowest.data(), std::size_t(k)), tr.model);
  const algo::choice pick = algo::choice(tr.cand[std::size_t(won)]);
  if (comm.debug().on(debug_level::info)) {
    std::string m = "algo::automatic: " + std::string(model::name(pr.coll)) + " of " + std::to_string(pr.count) + " x " +
                    std::to_string(pr.elem) + " B over " + std::to_string(n) + " ranks" +
                    (comm.identity().is_job() ? std::string() : " on " + comm.identity().name) + ", tried";
    char b[192];
    for (int i = 0; i < k; ++i) {
      std::snprintf(b, sizeof b, "%s %s %.2f us", i ? "," : "", model::name(algo::choice(tr.cand[std::size_t(i)])), slowest[std::size_t(i)] * 1e6);
      m += b;
    }
    std::snprintf(b, sizeof b, " (the slowest rank's fastest of %d calls): %s; the model said %s, %.2f us", int(tr.reps),
                  model::name(pick), model::name(algo::choice(tr.cand[std::size_t(tr.model)])), tr.predicted * 1e6);
    comm.debug().write(debug_level::info, m + b);
  }
  return pick;
}

/// COLLX_DEBUG=INFO: automatic's choice for a new shape, its predicted time and the runner-up's.
inline void debug_choice(const debug_log& dbg, const model::problem& pr, const model::params& p, algo::choice best,
                         const std::string& source, const comm_identity& id) {
  auto v = model::evaluate(pr, p);
  std::sort(v.begin(), v.end(), [](const model::candidate& a, const model::candidate& b) { return a.seconds < b.seconds; });
  char b[160];
  std::string m = "algo::automatic: " + std::string(model::name(pr.coll)) + " of " + std::to_string(pr.count) + " x " +
                  std::to_string(pr.elem) + " B over " + std::to_string(pr.n) + " ranks" +
                  (id.is_job() ? std::string() : " on " + id.name) + ": " + model::name(best);
  for (const model::candidate& x : v)
    if (x.policy == best) {
      std::snprintf(b, sizeof b, ", predicted %.2f us", x.seconds * 1e6);
      m += b;
    }
  for (const model::candidate& x : v)
    if (x.policy != best) {
      std::snprintf(b, sizeof b, "; runner-up %s, %.2f us", model::name(x.policy), x.seconds * 1e6);
      m += b;
      break;
    }
  dbg.write(debug_level::info, m + " (model parameters: " + source + ")");
}

/// The policy automatic runs for this call: COLLX_ALGO's, or the model's least predicted time.
/// `count` is the collective's count argument (model::problem).
/// `trying`: set when this call is one of a shape's trials (COLLX_AUTOTUNE), which the caller
/// times (with_policy).
template <class T>
algo::choice automatic_choice(communicator<T>& comm, algo::collective c, std::size_t count, std::size_t elem,
                              bool commutative, const call_info& call,
                              typename communicator<T>::automatic_state::trial** trying = nullptr) {
  if (c == algo::collective::all_to_all) return algo::choice_of<algo::pairwise>;
  const int n = comm.size();
  if (n == 1) return commutative ? algo::choice_of<algo::ring> : algo::choice_of<algo::recursive_halving>;  // local copies only
  automatic_setup(comm);
  auto& st = comm.automatic();
  // COLLX_ALGO's two_level runs where it can: on a communicator laid out on several nodes, for a
  // collective and op it has a form for; elsewhere the model chooses, as for a global name
  const bool two_level_here = [&] {
    if constexpr (requires { comm.transport().nodes(); })
      return st.levels && !comm.transport().nodes().flat() && model::two_level_supports(c, commutative);
    else
      return false;
  }();
  std::int8_t f = st.forced[std::size_t(c)];
  if (f == std::int8_t(two_level_choice)) {
    if (two_level_here) return two_level_choice;
    f = algo_override::kModel;
  }
  if (f == algo_override::kUnset && st.forced_all == std::int8_t(two_level_choice) && two_level_here) return two_level_choice;
  if (f >= 0) {
    if (!model::supports(algo::choice(f), c, commutative))
      call.fail(errc::invalid_argument, std::string("COLLX_ALGO asks for ") + model::name(algo::choice(f)) + " for " +
                                            model::name(c) +
                                            ", which combines in ring order and cannot honour this non-commutative "
                                            "op; use tree or recursive_halving");
    return algo::choice(f);
  }
  if (f != algo_override::kModel && st.forced_all >= 0 && st.forced_all != std::int8_t(two_level_choice) &&
      model::supports(algo::choice(st.forced_all), c, commutative))
    return algo::choice(st.forced_all);
  const std::array<std::uint64_t, 4> key{std::uint64_t(c) | std::uint64_t(commutative) << 8, count, elem, std::uint64_t(n)};
  if (st.last_choice >= 0 && st.last_shape == key) return algo::choice(st.last_choice);
  if (auto it = st.decisions.find(key); it != st.decisions.end()) {
    st.last_shape = key;
    st.last_choice = it->second;
    return algo::choice(it->second);
  }
  auto params = [](const auto& x) {
    return model::params{x.alpha, x.beta, x.gamma, {}, x.cores, x.ranks, x.delta, x.curve, x.fit};
  };
  const model::params p = params(st.n);
  const model::problem pr{c, n, count, elem, 0, commutative};
  algo::choice best{};
  // Laid out on several nodes: the two-level model, among the flat policies and two_level.
  // (with_policy runs two_level where the transport itself has the node map)
  const bool on_nodes = [&] {
    if constexpr (requires { comm.transport().nodes(); }) {
      const node_map& m = comm.transport().nodes();
      if (!st.levels || m.flat()) return false;
      const model::node_candidate b = model::best_on_nodes(pr, m, model::levels{params(st.node), params(st.net)});
      best = b.two_level ? two_level_choice : b.policy;
      return true;
    } else {
      return false;
    }
  }();
  bool settled = false;  // by a trial's verdict (COLLX_AUTOTUNE), not the model alone
  if (!on_nodes && st.tune && trying != nullptr) {
    // Learning from the calls: this shape's trial, begun now or going on; once every candidate
    // has been timed, the verdict (the same on every rank) is its decision.
    auto it = st.trials.find(key);
    if (it == st.trials.end()) {
      typename communicator<T>::automatic_state::trial tr;
      if (st.trials.size() >= st.kMaxDecisions) st.trials.clear();
      if (plan_trial(model::evaluate(pr, p), model::best(pr, p), tr)) it = st.trials.emplace(key, tr).first;
    }
    if (it != st.trials.end()) {
      auto& tr = it->second;
      if (tr.done < tr.k * tr.reps) {
        *trying = &tr;
        return algo::choice(tr.cand[std::size_t(tr.done < 0 ? tr.model : tr.done / tr.reps)]);
      }
      best = settle_trial(comm, pr, tr);
      st.trials.erase(it);
      settled = true;
    }
  }
  if (!on_nodes && !settled) best = model::best(pr, p);
  if (st.decisions.size() >= st.kMaxDecisions) st.decisions.clear();
  st.decisions.emplace(key, std::int8_t(best));
  st.last_shape = key;
  st.last_choice = std::int8_t(best);
  if (comm.debug().on(debug_level::info) && !on_nodes && !settled) debug_choice(comm.debug(), pr, p, best, st.source, comm.identity());
  return best;
}

/// Calls f with the concrete policy to run: algo itself, or automatic's choice. `count` is the
/// collective's count argument (model::problem), E its element type. A call with zero elements
/// runs nothing (skip_if_empty).
template <class Op, algo::collective C, class E, class Algo, class T, class F>
void with_policy(const Algo& a, communicator<T>& comm, std::size_t count, call_info& call, F&& f) {
  if (skip_if_empty(comm, call)) return;
  if constexpr (algo::is_deterministic_v<Algo> && RunsSchedules<T>)  // (before any traffic: every rank alike)
    call.fail(errc::invalid_argument, "the deterministic mode runs on host transports: this transport runs whole schedules "
                                      "(device plans), which do not fold yet");
  constexpr bool reducing = C == algo::collective::all_reduce || C == algo::collective::reduce_scatter || C == algo::collective::reduce;
  if constexpr (reducing && !algo::is_deterministic_v<Algo> && !std::is_same_v<Op, no_op>) {
    if constexpr (order_shows_v<Op, E>) {
      if (comm.opts().deterministic) {
        // options::deterministic: the call as algo::deterministic, the given policy doing its
        // all-gather where it has one (automatic's choice where not)
        // (one instantiation, deterministic<automatic>, whatever the policy: its all-gather is
        // chosen at run time)
        algo::deterministic<> d{};
        if constexpr (algo::detail::index_in<Algo>(algo::policies{}) >= 0 &&
                      requires(const algo::ag_problem& p) { a.all_gather(p); })
          d.gather = algo::choice_of<Algo>;
        // (the name says which all-gather will run, so ranks that passed different policies
        // fail as a mismatch)
        set_name(call.sig.policy, algo::deterministic_name(d.gather));
        if (call.rec != nullptr) call.rec->policy = algo::deterministic_name(d.gather);
        return with_policy<Op, C, E>(d, comm, count, call, std::forward<F>(f));
      }
    }
  }
  if constexpr (std::is_same_v<Algo, algo::automatic>) {
    constexpr bool commutative = is_commutative_v<Op>;
    typename communicator<T>::automatic_state::trial* trying = nullptr;  // a trial's call: timed
    auto run = [&](const auto& pol) {
      set_name(call.sig.policy, std::decay_t<decltype(pol)>::name);
      if (call.rec != nullptr) call.rec->policy = std::decay_t<decltype(pol)>::name;  // the record says what ran
      if (trying == nullptr) return f(pol);
      const auto t0 = std::chrono::steady_clock::now();
      f(pol);
      const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      auto& tr = *trying;
      if (tr.done >= 0) {  // (the first call is not timed)
        double& fastest = tr.fastest[std::size_t(tr.done / tr.reps)];
        fastest = tr.done % tr.reps == 0 ? took : std::min(fastest, took);
      }
      ++tr.done;
    };
    // The chosen policy, among those of algo::policies that have a schedule for C and this op
    // (the model only chooses among those; recursive_halving serves every collective else), or,
    // on a communicator laid out on several nodes, two_level (algo/nodes_model.hpp).
    const algo::choice ch = automatic_choice(comm, C, count, sizeof(E), commutative, call, &trying);
    if constexpr (requires { comm.transport().nodes(); }) {
      if constexpr (model::two_level_supports(C, commutative)) {
        if (ch == two_level_choice) {
          run(algo::two_level{});
          return;
        }
      }
    }
    bool ran = false;
    algo::for_each_policy([&]<class P>() {
      if constexpr (model::supports<P>(C, commutative)) {
        if (!ran && ch == algo::choice_of<P>) {
          ran = true;
          run(P{});
        }
      }
    });
    if (ran) return;
    if constexpr (model::supports<algo::recursive_halving>(C, commutative)) {
      run(algo::recursive_halving{});
    } else {  // (all_to_all: pairwise, the one policy that has its schedule)
      algo::for_each_policy([&]<class P>() {
        if constexpr (model::supports<P>(C, commutative))
          if (!ran) {
            ran = true;
            run(P{});
          }
      });
    }
  } else if constexpr (algo::is_deterministic_automatic_v<Algo> && C == algo::collective::all_reduce) {
    // deterministic<automatic>: the all-gather of the policy automatic would run this
    // all_reduce with, where it has one (the same all-gather as outside the mode); else the
    // model's all-gather for the blocks of one segment (the reduction is the same whichever)
    // (commutative: the mode keeps rank order whatever the op, so a COLLX_ALGO ring applies)
    Algo d = a;
    if (d.gather == algo::choice(-1)) {
      const algo::choice whole = automatic_choice(comm, C, count, sizeof(E), true, call);
      if (std::size_t(std::uint8_t(whole)) < algo::policies::size && model::supports(whole, algo::collective::all_gather, true)) {
        d.gather = whole;
      } else {  // (recursive doubling; two_level on several nodes)
        const std::size_t seg = algo::tuning::all_reduce_segment(count, sizeof(E));
        const std::size_t n = std::size_t(comm.size()), per = seg / n + (seg % n != 0);
        d.gather = automatic_choice(comm, algo::collective::all_gather, per, sizeof(E), true, call);
        if (std::size_t(std::uint8_t(d.gather)) >= algo::policies::size) d.gather = algo::choice_of<algo::ring>;
      }
    }
    set_name(call.sig.policy, algo::deterministic_name(d.gather));
    if (call.rec != nullptr) call.rec->policy = algo::deterministic_name(d.gather);
    f(d);
  } else {
    f(a);
  }
}

}  // namespace collx::detail
