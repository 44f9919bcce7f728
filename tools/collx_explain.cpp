// collx-explain: what each algorithm policy does for one collective, and what it costs.
//
// A collx policy is a pure function from a problem (this rank, the rank count, the block layout)
// to a schedule: a list of steps, each a few sends and receives that run together. Nothing here
// runs a collective (unless --measure): the tool asks each policy for every rank's schedule,
// exactly as the collectives do (collx::model::schedules), and prints
//   - the schedule as a table, one line per operation:
//       t3  rank 1  sends block 2 to rank 2
//       t3  rank 1  receives block 1 from rank 0 and reduces it into out block 1 = recv (+) in block 1
//   - the per-rank counts read off the same data (what transport::counting records in a real
//     run), beside the textbook formula (ring all-reduce: 2(N-1) steps, 2(N-1)/N·D bytes sent);
//   - the cost model's prediction, time = α·steps + β·bytes + γ·reduced on the critical path,
//     with the α, β, γ used and where they came from (collx-perf --calibrate, or shipped defaults);
//   - a summary: every policy's predicted time, the one algo::automatic picks, and the message
//     sizes at which the best policy changes.
// docs/algorithms.md derives every formula printed here; docs/ring-vs-tree.md is built from this
// tool's output.
//
//   collx-explain all_reduce -n 8 --bytes 64MiB        every policy, predicted time, crossovers
//   collx-explain -n 5 reduce_scatter                  any collective: all_reduce reduce_scatter
//                                                      all_gather broadcast reduce all_to_all
//   collx-explain -n 8 --bytes 1M --root 3 broadcast
//   collx-explain --noncommutative all_reduce          the rank-order-preserving paths
//   collx-explain all_reduce -n 8 --dot ring.dot --policy ring     a schedule as Graphviz
//   collx-explain all_reduce -n 4 --bytes 1M --measure --transport shm   predicted vs measured
//   collx-explain all_reduce -n 8 --csv 8 1G          predicted time and busbw per policy and size
//   collx-explain all_reduce --nodes 2,2 --bytes 64M   on nodes: the two-level model, every flat
//                                                      policy and two_level, bytes between nodes
//   collx-explain --topology [--nodes 3,2]             this machine's NUMA domains and CPUs (hwloc),
//                                                      where each local rank would be pinned, the nodes
//   collx-explain all_reduce -n 4 --order              the order each policy adds block b in, and the
//                                                      deterministic mode's (docs/precision.md)
//
// The tool also checks that every send meets a receive of the same size at the same step on its
// peer, and exits non-zero if one does not (so it doubles as a test).
#include <collx/algo/calibration.hpp>
#include <collx/collx.hpp>
#include <collx/algo/model.hpp>
#include <collx/algo/nodes_model.hpp>
#include <collx/algo/order.hpp>
#include <collx/core/machine.hpp>
#ifdef COLLX_EXPLAIN_HWLOC
#include <collx/core/hwloc.hpp>
#endif

#include <chrono>

#include "heap_meter.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <unistd.h>
#include <vector>

namespace {

using collx::buf;
using collx::partition;
using collx::region;
using collx::schedule;
namespace algo = collx::algo;

using coll = algo::collective;
namespace model = collx::model;

struct config {
  int n = 4;
  coll c = coll::all_reduce;
  std::size_t bytes = std::size_t(64) << 10;  // D: the largest buffer a rank passes (nccl-tests' "size")
  int root = 0;
  bool commutative = true;
  std::string transport = "shm";  // whose α, β, γ the model uses
  std::string policy;             // only this policy (default: every policy)
  long steps = 64;                // schedule lines to print per policy (-1: all)
  std::string dot;                // --dot FILE ("-": stdout)
  bool measure = false;
  bool csv = false;
  std::size_t csv_min = 8, csv_max = std::size_t(1) << 30;
  std::string perf;               // collx-perf for --measure
  model::params params;           // the model's parameters for `transport`
  std::vector<int> nodes;         // --nodes: ranks per node (then N is their sum)
  bool round_robin = false;       // --round-robin: ranks dealt out over the nodes
  std::string net = "tcp";        // --net: the transport between nodes (--transport: within)
  bool topology = false;          // --topology
  bool order = false;             // --order
};

model::problem problem_of(const config& cfg) {
  return model::problem::of_bytes(cfg.c, cfg.n, cfg.bytes, 4, cfg.root, cfg.commutative);
}

// The element type is float: 4 bytes. Schedules count elements; everything printed is bytes.
constexpr std::size_t elem = 4;

int timeline(const std::vector<schedule>& all) { return model::timeline(all); }

// ---- naming regions: element offsets back to blocks ------------------------------------------

/// Turns a region into words: "block 2", "blocks 0-1", "half A chunk 1", "scratch block 3".
/// `layout` is the N-block partition of the buffers with the full layout. Policies that cut the
/// buffer otherwise name their pieces: the double binary tree its halves (one per tree) and their
/// pipeline chunks, the ring's chain broadcast/reduce its chunks, and the ring's compact
/// reduce-scatter keeps partials in two scratch slots instead of a full-layout buffer.
struct namer {
  std::size_t in_total = 0, out_total = 0;  // elements of in and out
  partition layout;
  std::optional<partition> halves;  // tree all_reduce
  int chunks_per_half = 1;
  std::optional<partition> chain;  // ring broadcast/reduce
  std::size_t slot = 0;            // ring reduce_scatter: elements per scratch slot (0: full layout)

  static std::string range(std::size_t a, std::size_t e) {
    return "elements [" + std::to_string(a) + ", " + std::to_string(e) + ")";
  }

  /// Names [off, off + cnt) of a buffer with the full layout.
  std::string pieces(std::size_t off, std::size_t cnt) const {
    if (cnt == 0) return "nothing";
    if (halves) {  // the double binary tree works on halves and their chunks, not on N blocks
      for (int t = 0; t < halves->parts; ++t) {
        const std::string h = halves->parts == 1 ? "all (tree A)" : std::string("half ") + char('A' + t);
        if (off == halves->offset(t) && cnt == halves->count(t)) return h;
        const partition ch(halves->count(t), chunks_per_half);
        for (int c = 0; c < ch.parts; ++c)
          if (off == halves->offset(t) + ch.offset(c) && cnt == ch.count(c)) return h + " chunk " + std::to_string(c);
      }
    }
    if (off == 0 && cnt == layout.total) return layout.parts > 1 ? "all blocks" : "block 0";
    if (chain)
      for (int c = 0; c < chain->parts; ++c)
        if (off == chain->offset(c) && cnt == chain->count(c)) return "chunk " + std::to_string(c);
    int lo = -1;
    for (int i = 0; i < layout.parts; ++i) {
      if (layout.offset(i) == off && layout.count(i) > 0 && lo < 0) lo = i;
      if (lo >= 0 && layout.end(i) == off + cnt) {
        return i == lo ? "block " + std::to_string(lo) : "blocks " + std::to_string(lo) + "-" + std::to_string(i);
      }
    }
    return range(off, off + cnt);
  }

  /// What a region holds, whichever buffer it is in.
  std::string what(const region& r) const {
    if (r.count == 0) return "an empty message";
    if (r.b == buf::tmp) {
      if (slot) return "the partial in scratch slot " + std::to_string(r.offset / slot);
      // Scratch has the full layout; a second full-size copy (recursive halving's non-commutative
      // path alternates two) is named as such.
      const std::size_t copy = layout.total ? r.offset / layout.total : 0;
      const std::string p = pieces(r.offset - copy * layout.total, r.count);
      return copy ? p + " (2nd scratch copy)" : p;
    }
    const std::size_t total = r.b == buf::in ? in_total : out_total;
    if (total != layout.total) return r.offset == 0 && r.count == total ? "(its own block)" : range(r.offset, r.offset + r.count);
    return pieces(r.offset, r.count);
  }

  /// A place in memory: "out block 2", "in all blocks", "scratch block 3".
  std::string where(const region& r) const {
    const char* b = r.b == buf::in ? "in " : r.b == buf::out ? "out " : "scratch ";
    if (r.b == buf::tmp && slot) return "scratch slot " + std::to_string(r.offset / slot);
    return b + what(r);
  }
};

// ---- counting what a schedule moves ----------------------------------------------------------

/// Every send must meet a receive of the same size from the same pair at the same step, in the
/// same order. Returns "" or the first problem.
std::string check_matching(const std::vector<schedule>& all) {
  std::map<std::tuple<int, int>, std::vector<std::pair<int, std::size_t>>> sent, got;
  const int n = int(all.size());
  for (int r = 0; r < n; ++r) {
    const schedule& s = all[std::size_t(r)];
    for (const collx::step& st : s.steps()) {
      for (auto i = st.sends_begin; i < st.sends_end; ++i) sent[{r, s.sends()[i].peer}].push_back({st.time, s.sends()[i].src.count});
      for (auto i = st.recvs_begin; i < st.recvs_end; ++i) got[{s.recvs()[i].peer, r}].push_back({st.time, s.recvs()[i].dst.count});
    }
  }
  if (sent != got) return "a send and its receive differ in step or size";
  return {};
}

// ---- the textbook formulas -------------------------------------------------------------------

using algo::formula;

/// The policy's textbook formula, from its own file (algo/textbook.hpp); none for a policy
/// without one.
template <class Algo>
formula textbook(const Algo&, const config& cfg) {
  if constexpr (requires(const algo::textbook_case& k) { Algo::textbook(k); })
    return Algo::textbook(algo::textbook_case{cfg.c, cfg.n, cfg.bytes, elem, cfg.commutative, cfg.root});
  else
    return {};
}

// ---- printing --------------------------------------------------------------------------------

std::string human(double bytes) {
  char b[32];
  if (bytes >= double(1 << 30) * 4) std::snprintf(b, sizeof b, "%.4g GiB", bytes / (1 << 30));
  else if (bytes >= 1 << 20) std::snprintf(b, sizeof b, "%.4g MiB", bytes / (1 << 20));
  else if (bytes >= 1 << 10) std::snprintf(b, sizeof b, "%.4g KiB", bytes / (1 << 10));
  else std::snprintf(b, sizeof b, "%.0f B", bytes);
  return b;
}

std::string human_time(double s) {
  char b[32];
  if (s >= 1) std::snprintf(b, sizeof b, "%.3g s", s);
  else if (s >= 1e-3) std::snprintf(b, sizeof b, "%.3g ms", s * 1e3);
  else std::snprintf(b, sizeof b, "%.3g us", s * 1e6);
  return b;
}

/// Where a message is sent from, when that is worth saying: " (from in)", " (from out)".
std::string from(const region& r) {
  if (r.count == 0) return "";
  return r.b == buf::in ? " (from in)" : r.b == buf::out ? " (from out)" : " (from scratch)";
}

std::string combine_text(const collx::recv_op& r, const namer& nm) {
  if (r.how == collx::combine::received_left) return nm.where(r.dst) + " = recv (+) " + nm.where(r.with);
  return nm.where(r.dst) + " = " + nm.where(r.with) + " (+) recv";
}

/// The model's numbers for one policy: the critical path and the predicted time.
void print_model_lines(const model::cost& cost, const config& cfg) {
  const model::params& p = cfg.params;
  std::printf("   model: critical path %lld steps, %s moved (%s of it while also receiving), %s reduced\n", (long long)cost.steps,
              human(double(cost.bytes)).c_str(), human(double(cost.both)).c_str(), human(double(cost.reduced)).c_str());
  model::params flat = p;
  flat.cores = 0;
  std::printf("   predicted: alpha x %lld + beta x (%llu + %.2f x %llu) + gamma x %llu = %s\n", (long long)cost.steps,
              (unsigned long long)cost.bytes, p.delta, (unsigned long long)cost.both, (unsigned long long)cost.reduced,
              human_time(model::predict(cost, flat)).c_str());
  if (model::predict(cost, p) != model::predict(cost, flat)) {
    std::uint32_t lo = UINT32_MAX, hi = 0;
    for (const auto& st : cost.per_step) lo = std::min(lo, st.active), hi = std::max(hi, st.active);
    std::printf("   sharing cores: steps with %u..%u active ranks, each charged max(1, a/%d)/(%d/%d) of a full step: %s\n", lo,
                hi, p.cores, p.ranks, p.cores, human_time(model::predict(cost, p)).c_str());
  }
}

/// Above this many ranks a policy's operation table and per-rank counts (which walk every rank's
/// schedule, and print N lines per step) give way to the model's profile alone.
constexpr int kTableRanks = 64;

template <class Algo>
bool print_policy(const Algo& a, const config& cfg) {
  if constexpr (!Algo::keeps_rank_order) {
    if (!cfg.commutative) {
      std::printf("\n== %s: no schedule. This policy combines in ring order, not rank order, so a reducing\n"
                  "   collective refuses a non-commutative op at compile time.\n",
                  Algo::name);
      return true;
    }
  }
  if (cfg.n > kTableRanks) {
    const model::problem pr = problem_of(cfg);
    if (!model::supports<Algo>(pr.coll, pr.commutative)) return true;
    std::printf("\n== %s %s, N = %d, D = %s (N > %d: the model's profile only; the operation table and per-rank\n"
                "   counts walk every rank's schedule and are printed up to N = %d)\n",
                Algo::name, model::name(cfg.c), cfg.n, human(double(cfg.bytes)).c_str(), kTableRanks, kTableRanks);
    print_model_lines(model::profile(a, pr), cfg);
    return true;
  }
  int ag_shift = -1;
  const std::vector<schedule> all = model::schedules(a, problem_of(cfg), &ag_shift);
  if (all.empty()) return true;
  const int n = cfg.n;
  const std::size_t D = cfg.bytes / elem, k = D / std::size_t(n);

  namer nm{D, D, partition(D, n), std::nullopt, 1, std::nullopt, 0};
  switch (cfg.c) {
    case coll::reduce_scatter:
      nm = {k * std::size_t(n), k, partition(k * std::size_t(n), n), std::nullopt, 1, std::nullopt, 0};
      if (std::is_same_v<Algo, algo::ring>) nm.slot = partition(k * std::size_t(n), n).max_count();
      break;
    case coll::all_gather: nm = {k, k * std::size_t(n), partition(k * std::size_t(n), n), std::nullopt, 1, std::nullopt, 0}; break;
    case coll::all_to_all: nm = {k * std::size_t(n), k * std::size_t(n), partition(k * std::size_t(n), n), std::nullopt, 1, std::nullopt, 0}; break;
    case coll::all_reduce:
      if (ag_shift < 0 && std::is_same_v<Algo, algo::tree>) {  // the double binary tree: name halves and chunks as tree.hpp cuts them
        const partition halves(D, cfg.commutative ? 2 : 1);
        nm.halves = halves;
        nm.chunks_per_half = algo::chunks(halves.count(0), elem, algo::tuning::pipeline_chunk_bytes).parts;
      }
      break;
    case coll::broadcast:
    case coll::reduce:
      if (std::is_same_v<Algo, algo::ring>) nm.chain = algo::chunks(D, elem, algo::tuning::pipeline_chunk_bytes);
      break;
  }

  std::printf("\n== %s %s, N = %d, D = %s%s%s\n", Algo::name, model::name(cfg.c), n,
              human(double(cfg.bytes)).c_str(),
              cfg.c == coll::broadcast || cfg.c == coll::reduce ? (", root " + std::to_string(cfg.root)).c_str() : "",
              cfg.commutative ? "" : ", non-commutative op");
  if (ag_shift >= 0) std::printf("   reduce-scatter at t0..t%d, then all-gather from t%d\n", ag_shift - 1, ag_shift);
  if (nm.halves && nm.halves->parts == 2)
    std::printf("   half A (elements [0, %zu)) goes through tree A, half B through tree B, at once\n", nm.halves->count(0));
  if (nm.halves && nm.halves->parts == 1)
    std::printf("   all of the buffer goes through tree A, whose subtrees are ranges of consecutive ranks\n");
  if (std::is_same_v<Algo, algo::recursive_doubling> && cfg.c == coll::all_reduce) {
    const int p = algo::floor_pow2(n);
    std::printf("   at step k each of the p = %d ranks taking part exchanges its whole vector with the one 2^k away\n"
                "   (among them) and reduces: log2 p = %d steps", p, algo::ceil_log2(p));
    if (p != n) std::printf(";\n   N = %d is not a power of two: ranks 0..%d first fold in pairs (the even one sends to the odd,\n"
                            "   which takes part), and the result goes back to the even ones at the end", n, 2 * (n - p) - 1);
    std::printf("\n");
  }

  // The table: one line per operation, by step time and rank. A step's local copies run before its
  // messages; a step with only copies is merged into the next.
  int last = 0;
  for (const schedule& s : all)
    if (!s.steps().empty()) last = std::max(last, s.steps().back().time);
  std::size_t max_tmp = 0;
  // The ring's compact reduce-scatter keeps partials in two scratch slots: remember which block's
  // partial each slot holds (the block it was reduced with), to name what is sent from it.
  std::vector<std::map<std::size_t, std::string>> slot_holds(std::size_t(n), std::map<std::size_t, std::string>{});
  auto msg = [&](int r, const region& x) {
    if (x.b == buf::tmp && nm.slot) {
      const auto it = slot_holds[std::size_t(r)].find(x.offset);
      if (it != slot_holds[std::size_t(r)].end()) return "the partial of " + it->second;
    }
    return nm.what(x);
  };
  long printed = 0, skipped = 0;
  for (int t = 0; t <= last; ++t) {
    for (int r = 0; r < n; ++r) {
      const schedule& s = all[std::size_t(r)];
      max_tmp = std::max(max_tmp, s.tmp_elems());
      for (const collx::step& st : s.steps()) {
        if (st.time != t) continue;
        auto line = [&](const std::string& text) {
          if (cfg.steps >= 0 && printed >= cfg.steps) {
            ++skipped;
            return;
          }
          ++printed;
          std::printf("  t%-3d rank %-3d %s\n", t, r, text.c_str());
        };
        for (auto i = st.copies_begin; i < st.copies_end; ++i)
          line("copies " + nm.where(s.copies()[i].src) + " to " + nm.where(s.copies()[i].dst));
        for (auto i = st.sends_begin; i < st.sends_end; ++i)
          line("sends " + msg(r, s.sends()[i].src) + " to rank " + std::to_string(s.sends()[i].peer) + from(s.sends()[i].src));
        for (auto i = st.recvs_begin; i < st.recvs_end; ++i) {
          const collx::recv_op& o = s.recvs()[i];
          if (o.dst.b == buf::tmp && nm.slot && o.how != collx::combine::copy)
            slot_holds[std::size_t(r)][o.dst.offset] = nm.what(o.with);
          std::string text = "receives " + msg(r, o.dst) + " from rank " + std::to_string(o.peer);
          if (o.dst.count == 0) text += " (it still costs a message)";
          else text += o.how == collx::combine::copy ? " into " + nm.where(o.dst) : ", reduces: " + combine_text(o, nm);
          line(text);
        }
      }
    }
  }
  if (skipped) std::printf("  ... %ld more lines (--steps all prints them)\n", skipped);
  if (max_tmp) std::printf("   scratch: up to %s per rank\n", human(double(max_tmp * elem)).c_str());

  const std::string problem = check_matching(all);
  if (!problem.empty()) std::printf("   SCHEDULE ERROR: %s\n", problem.c_str());
  if (n == 1) {
    std::printf("   N = 1: no messages, only local copies\n");
    return problem.empty();
  }

  // What each rank moves, read off the schedules, and the formula beside it.
  const formula f = textbook(a, cfg);
  std::printf("   %-6s %6s %10s %12s %10s %12s %12s\n", "rank", "steps", "msgs sent", "bytes sent", "msgs recv",
              "bytes recv", "bytes reduced");
  std::size_t total_sent = 0, max_counted = 0;
  const model::cost cost = model::analyse(all, elem);
  const auto& tl = cost.ranks;
  for (int r = 0; r < n; ++r) {
    const auto& t = tl[std::size_t(r)];
    if (r < 16 || r == n - 1)
      std::printf("   %-6d %6llu %10llu %12llu %10llu %12llu %12llu\n", r, (unsigned long long)t.steps,
                  (unsigned long long)t.messages_sent, (unsigned long long)t.bytes_sent,
                  (unsigned long long)t.messages_received, (unsigned long long)t.bytes_received,
                  (unsigned long long)t.bytes_reduced);
    else if (r == 16)
      std::printf("   ...\n");
    total_sent += t.bytes_sent;
    max_counted = std::max<std::size_t>(max_counted, f.received ? t.bytes_received : t.bytes_sent);
  }
  const int span = timeline(all);
  std::printf("   timeline: %d steps; formula %s = %d%s\n", span, f.steps_text.c_str(), f.steps,
              span == f.steps ? " (matches)" : " (differs)");
  std::size_t counted = 0;
  std::string whose;
  switch (f.whom) {
    case formula::who::each: {
      std::size_t lo = SIZE_MAX, hi = 0;
      for (const auto& t : tl) {
        lo = std::min<std::size_t>(lo, f.received ? t.bytes_received : t.bytes_sent);
        hi = std::max<std::size_t>(hi, f.received ? t.bytes_received : t.bytes_sent);
      }
      counted = hi;
      whose = lo == hi ? "every rank " : "ranks " + std::to_string(lo) + " to ";
      break;
    }
    case formula::who::one_rank:
      counted = f.received ? tl[std::size_t(f.rank)].bytes_received : tl[std::size_t(f.rank)].bytes_sent;
      whose = "rank " + std::to_string(f.rank) + " ";
      break;
    case formula::who::max: counted = max_counted; whose = "at most "; break;
    case formula::who::total: counted = total_sent; whose = "all ranks "; break;
  }
  const double diff = double(counted) - f.bytes;
  std::printf("   bytes %s: %s%zu; formula %s = %.0f%s\n", f.received ? "received" : "sent", whose.c_str(), counted,
              f.bytes_text.c_str(), f.bytes,
              f.pow2_only ? " (for N a power of two; here the first 2(N-p) ranks fold in pairs, which moves up to D\n"
                            "   more on them: see docs/algorithms.md)"
              : diff == 0                                  ? " (matches)"
              : std::abs(diff) <= double(2 * n * int(elem) * f.segments) ? " (matches up to partition rounding)"
                                                           : " (differs)");
  print_model_lines(cost, cfg);

  return problem.empty();
}

std::optional<std::size_t> parse_size(std::string_view s) {  // 64K, 1M, 64MiB, 1G, 4096
  if (s.empty()) return std::nullopt;
  std::size_t mult = 1;
  for (std::string_view suffix : {"iB", "B"})
    if (s.size() > suffix.size() && s.substr(s.size() - suffix.size()) == suffix) {
      s.remove_suffix(suffix.size());
      break;
    }
  const char last = s.empty() ? 0 : s.back();
  if (last == 'K' || last == 'k') mult = std::size_t(1) << 10;
  if (last == 'M' || last == 'm') mult = std::size_t(1) << 20;
  if (last == 'G' || last == 'g') mult = std::size_t(1) << 30;
  if (mult != 1) s.remove_suffix(1);
  const std::string str(s);
  if (str.empty() || str.find_first_not_of("0123456789") != std::string::npos || str.size() > 15) return std::nullopt;
  const unsigned long long v = std::strtoull(str.c_str(), nullptr, 10);
  if (v > (1ull << 40) / mult) return std::nullopt;  // sizes up to 1 TiB
  return std::size_t(v) * mult;
}

/// Whether --policy (a comma-separated list; empty: all) names p.
bool selected(const config& cfg, model::choice p) {
  if (cfg.policy.empty()) return true;
  const std::string list = "," + cfg.policy + ",";
  return list.find("," + std::string(model::name(p)) + ",") != std::string::npos;
}

/// The policies to show: those --policy names, or every one that has the collective.
std::vector<model::choice> shown(const config& cfg) {
  std::vector<model::choice> v;
  for (model::choice p : model::all_policies)
    if (selected(cfg, p) && model::supports(p, cfg.c, true)) v.push_back(p);
  return v;
}

/// The candidates the model weighs for this call, restricted to --policy.
std::vector<model::candidate> candidates(const config& cfg, const model::problem& pr) {
  std::vector<model::candidate> v;
  for (auto& c : model::evaluate(pr, cfg.params))
    if (selected(cfg, c.policy)) v.push_back(std::move(c));
  return v;
}

/// The least predicted time among the candidates (automatic's pick when --policy is not given).
model::choice best_of(const config& cfg, const model::problem& pr) {
  const auto v = candidates(cfg, pr);
  if (v.empty()) return model::best(pr, cfg.params);
  return std::min_element(v.begin(), v.end(), [](const auto& a, const auto& b) { return a.seconds < b.seconds; })->policy;
}

/// nccl-tests' bus bandwidth factor of a collective.
double bus_factor(coll c, int n) {
  if (n <= 1) return 1.0;
  if (c == coll::all_reduce) return 2.0 * (n - 1) / n;
  if (c == coll::broadcast || c == coll::reduce) return 1.0;
  return double(n - 1) / n;
}

/// The sizes (bytes) at which the model's best policy changes, between lo and hi, with the
/// policy that wins above each: found by doubling, then bisection to the element.
std::vector<std::pair<std::size_t, model::choice>> crossovers(const config& cfg, std::size_t lo, std::size_t hi) {
  const std::size_t unit = elem * (model::problem::split(cfg.c) ? std::size_t(cfg.n) : 1);
  auto best = [&](std::size_t b) {
    return best_of(cfg, model::problem::of_bytes(cfg.c, cfg.n, b, elem, cfg.root, cfg.commutative));
  };
  std::vector<std::pair<std::size_t, model::choice>> v;
  lo = std::max(lo, unit);
  model::choice cur = best(lo);
  v.push_back({lo, cur});
  for (std::size_t b = lo; b < hi;) {
    const std::size_t next = std::min(hi, b * 2);
    const model::choice c = best(next);
    if (c != cur) {
      std::size_t a = b, z = next;  // best(a) == cur, best(z) == c
      while (z - a > unit) {
        const std::size_t m = a + (z - a) / 2 / unit * unit;
        if (m == a) break;
        if (best(m) == cur) a = m;
        else z = m;
      }
      cur = best(z);
      v.push_back({z, cur});
    }
    b = next;
  }
  return v;
}

void print_summary(const config& cfg) {
  const model::problem pr = problem_of(cfg);
  const auto cands = candidates(cfg, pr);
  if (cands.empty() || cfg.n < 2) return;
  const std::size_t heap0 = heap_meter::start();
  const auto t0 = std::chrono::steady_clock::now();
  const model::choice pick = model::best(pr, cfg.params);
  const double decision_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  const std::size_t decision_heap = heap_meter::held_since(heap0);
  const model::choice best = best_of(cfg, pr);
  std::printf("\n== the cost model: %s, N = %d, D = %s%s\n", model::name(cfg.c), cfg.n, human(double(pr.bytes())).c_str(),
              cfg.commutative ? "" : ", non-commutative op");
  std::printf("   time = alpha x steps + beta x (bytes + delta x both) + gamma x reduced, on the critical path\n");
  std::printf("   alpha %.3g s/step, beta %.3g s/B (%.2f GB/s), gamma %.3g s/B (%.2f GB/s), delta %.2f\n", cfg.params.alpha,
              cfg.params.beta, cfg.params.beta > 0 ? 1e-9 / cfg.params.beta : 0.0, cfg.params.gamma,
              cfg.params.gamma > 0 ? 1e-9 / cfg.params.gamma : 0.0, cfg.params.delta);
  std::printf("   from: %s\n", cfg.params.source.c_str());
  if (cfg.params.cores > 0 && cfg.params.ranks > cfg.params.cores)
    std::printf("   measured with %d ranks on %d cores: a step with a active ranks costs max(1, a/%d)/(%d/%d) of a full one\n",
                cfg.params.ranks, cfg.params.cores, cfg.params.cores, cfg.params.ranks, cfg.params.cores);
  std::printf("   %-20s %7s %12s %12s %12s %10s\n", "policy", "steps", "bytes", "reduced", "predicted", "busbw");
  for (const auto& c : cands) {
    const double bw = c.seconds > 0 ? double(pr.bytes()) / c.seconds * bus_factor(cfg.c, cfg.n) / 1e9 : 0;
    std::printf("   %-20s %7lld %12llu %12llu %12s %7.2f GB/s%s\n", model::name(c.policy), (long long)c.c.steps,
                (unsigned long long)c.c.bytes, (unsigned long long)c.c.reduced, human_time(c.seconds).c_str(), bw,
                c.policy == pick ? "   <- algo::automatic" : c.policy == best ? "   <- the best of these" : "");
  }
  std::printf("   algo::automatic's decision for this shape: %.3f ms, %s of memory held (model::best on a new shape;\n"
              "   bench/model_bench.cpp measures it at N = 64, 256, 1024)\n",
              decision_ms, human(double(decision_heap)).c_str());
  const auto xs = crossovers(cfg, 8, std::size_t(1) << 30);
  std::printf("   the best %s by size (8 B .. 1 GiB, this model):\n", cfg.policy.empty() ? "policy" : "of these");
  for (std::size_t i = 0; i < xs.size(); ++i) {
    const std::string to = i + 1 < xs.size() ? "below " + human(double(xs[i + 1].first)) : "and up";
    std::printf("     from %-12s %-14s %s\n", human(double(xs[i].first)).c_str(), to.c_str(), model::name(xs[i].second));
  }
  if (std::getenv("COLLX_ALGO"))
    std::printf("   (COLLX_ALGO=%s is set: algo::automatic follows it where it applies)\n", std::getenv("COLLX_ALGO"));
}

/// "a,b,c" -> {"a", "b", "c"} ("" -> {""}).
std::vector<std::string> comma_list(const std::string& v) {
  std::vector<std::string> out;
  for (std::size_t a = 0; a <= v.size();) {
    const std::size_t e = std::min(v.find(',', a), v.size());
    out.push_back(v.substr(a, e - a));
    a = e + 1;
  }
  return out;
}

/// The bytes out of each node of two_level's schedule by its formula (nodes of any sizes), for
/// the collectives that have one; -1 where it is not stated.
double two_level_formula(coll c, double D, int M) {
  switch (c) {
    case coll::all_reduce: return 2.0 * (M - 1) / M * D;
    case coll::reduce_scatter:
    case coll::all_gather: return double(M - 1) / M * D;
    default: return -1;
  }
}

/// --nodes: the communicator laid out on nodes; each candidate's predicted time on two levels
/// (algo/nodes_model.hpp) and the bytes its busiest node sends to the others. Returns false when
/// two_level's counted bytes miss their formula.
bool print_nodes(const config& cfg) {
  const collx::node_map nm = collx::node_map::of_sizes(cfg.nodes, cfg.round_robin);
  const int M = nm.nodes();
  const model::levels lv{model::params_for(cfg.transport, nm.widest()), model::params_for(cfg.net, nm.size())};
  const model::problem pr = problem_of(cfg);
  const double D = double(pr.bytes());
  std::printf("\n== on %d nodes: %s\n", M, nm.describe().c_str());
  std::printf("   within a node: %s (%s)\n   between nodes: %s (%s), a node's ranks sharing its link\n", cfg.transport.c_str(),
              lv.node.source.c_str(), cfg.net.c_str(), lv.net.source.c_str());
  std::printf("   a step costs max(the busiest rank's step on its node, the busiest node's step to the others) + gamma x reduced\n");
  const auto v = model::evaluate_on_nodes(pr, nm, lv);
  const auto pick = model::best_on_nodes(pr, nm, lv);
  std::printf("   %-20s %12s %18s %10s\n", "policy", "predicted", "out of a node", "busbw");
  bool ok = true;
  for (const auto& c : v) {
    const std::string name = c.two_level ? "two_level" : model::name(c.policy);
    const double bw = c.seconds > 0 ? D / c.seconds * bus_factor(cfg.c, cfg.n) / 1e9 : 0;
    const bool picked = c.two_level == pick.two_level && (c.two_level || c.policy == pick.policy);
    std::printf("   %-20s %12s %18s %7.2f GB/s%s\n", name.c_str(), human_time(c.seconds).c_str(), human(double(c.between_nodes)).c_str(),
                bw, picked ? "   <- algo::automatic" : "");
  }
  if (model::two_level_supports(cfg.c, cfg.commutative) && M > 1) {
    const auto all = model::two_level_schedules(pr, nm);
    const auto out = model::bytes_between_nodes(all, nm, pr.elem);
    const double f = two_level_formula(cfg.c, D, M);
    if (f >= 0) {
      std::printf("   two_level's bytes out of each node, counted from its schedules: ");
      for (std::size_t j = 0; j < out.size(); ++j) std::printf("%s%s", j ? ", " : "", human(double(out[j])).c_str());
      const bool even = pr.count % std::size_t(nm.widest() * M) == 0;
      std::printf("\n   the formula: %s = %s%s\n", cfg.c == coll::all_reduce ? "2(M-1)/M x D" : "(M-1)/M x D", human(f).c_str(),
                  even ? "" : " (the count does not divide into equal shards: the counts differ by a few elements)");
      for (std::uint64_t b : out)
        if (even && double(b) != f && nm.widest() * M == nm.size()) ok = false;
      if (!ok) std::printf("   MISMATCH between the counted bytes and the formula\n");
    }
  }
  return ok;
}

/// --topology: this machine (hwloc's view where collx-explain was built with it, checked against
/// sysfs's, which transport::two_level places ranks by), where each of L local ranks goes, and
/// the job laid out on --nodes with the transport of each level. False where hwloc and sysfs
/// disagree.
bool print_topology(const config& cfg) {
  const collx::machine sys = collx::read_machine();
  collx::machine m = sys;
  bool ok = true;
  std::printf("== this machine: %s\n", m.host.c_str());
#ifdef COLLX_EXPLAIN_HWLOC
  const collx::machine_hwloc h = collx::read_machine_hwloc();
  m = h.m;
  std::printf("   from hwloc: %d package%s, %d cores, %d hardware threads\n", h.packages, h.packages == 1 ? "" : "s", h.cores, h.threads);
  // sysfs (what two_level places by) must say the same
  bool same = sys.numa.size() == m.numa.size();
  for (std::size_t i = 0; same && i < m.numa.size(); ++i) same = sys.numa[i].cpus == m.numa[i].cpus;
  std::printf("   sysfs (/sys/devices/system/node) agrees with hwloc on the domains and their CPUs: %s\n", same ? "yes" : "NO");
  ok = same;
#else
  std::printf("   from sysfs (/sys/devices/system/node; this collx-explain was built without hwloc)\n");
#endif
  using collx::detail_machine::format_list;
  for (const auto& d : m.numa)
    std::printf("   NUMA domain %d: CPUs %s, %s of memory\n", d.id, format_list(d.cpus).c_str(),
                d.memory_bytes ? human(double(d.memory_bytes)).c_str() : "? bytes");
  std::printf("   this process may run on CPUs %s%s\n", format_list(m.allowed).c_str(),
              m.pinned() ? " (pinned: transport::two_level leaves it there)" : "");
  const std::vector<int> sizes = cfg.nodes.empty() ? std::vector<int>{cfg.n} : cfg.nodes;
  const collx::node_map nm = collx::node_map::of_sizes(sizes, cfg.round_robin);
  std::printf("\n== the job: %d ranks on %d node%s, %s within a node, %s between nodes\n", nm.size(), nm.nodes(),
              nm.nodes() == 1 ? "" : "s", cfg.transport.c_str(), nm.nodes() > 1 ? cfg.net.c_str() : "nothing");
  for (int j = 0; j < nm.nodes(); ++j) {
    const auto& mem = nm.members[std::size_t(j)];
    std::string ranks;
    for (std::size_t i = 0; i < mem.size(); ++i) ranks += (i ? ", " : "") + std::to_string(mem[i]);
    std::printf("   node %d: ranks %s\n", j, ranks.c_str());
    const int L = int(mem.size());
    for (int l = 0; l < L; ++l) {
      const int d = m.domain_of(l, L);
      std::printf("     rank %d (local %d): NUMA domain %d, CPUs %s (COLLX_PIN=1, if its launcher did not pin it)\n", mem[std::size_t(l)], l,
                  m.numa[std::size_t(d)].id, format_list(m.numa[std::size_t(d)].cpus).c_str());
    }
  }
  std::printf("   (a job's own topology, each node's machine as it read it: COLLX_TOPO_DUMP=FILE)\n");
  return ok;
}

/// --csv: predicted time and bus bandwidth per policy and size (powers of two), for plots.
void print_csv(const config& cfg) {
  std::printf("bytes,policy,predicted_us,busbw_GBps,best\n");
  for (std::size_t b = cfg.csv_min; b <= cfg.csv_max; b *= 2) {
    const model::problem pr = model::problem::of_bytes(cfg.c, cfg.n, b, elem, cfg.root, cfg.commutative);
    if (pr.count == 0) continue;
    const model::choice pick = best_of(cfg, pr);
    for (const auto& c : candidates(cfg, pr)) {
      const double bw = double(pr.bytes()) / c.seconds * bus_factor(cfg.c, cfg.n) / 1e9;
      std::printf("%zu,%s,%.6g,%.6g,%d\n", pr.bytes(), model::name(c.policy), c.seconds * 1e6, bw, c.policy == pick);
    }
  }
}

/// --dot: one policy's schedule as a Graphviz digraph: time runs left to right, one row per
/// rank; an arrow per message, labelled with its size, red where the receiver reduces it.
bool write_dot(const config& cfg) {
  const auto sel = shown(cfg);
  const model::choice p = cfg.policy.empty() || sel.empty() ? model::best(problem_of(cfg), cfg.params) : sel.front();
  const std::vector<schedule> all = model::schedules(p, problem_of(cfg));
  if (all.empty()) {
    std::fprintf(stderr, "collx-explain: %s has no %s schedule\n", model::name(p), model::name(cfg.c));
    return false;
  }
  std::FILE* f = cfg.dot == "-" ? stdout : std::fopen(cfg.dot.c_str(), "w");
  if (!f) {
    std::fprintf(stderr, "collx-explain: cannot write %s\n", cfg.dot.c_str());
    return false;
  }
  const int n = cfg.n, T = timeline(all);
  std::fprintf(f, "// collx-explain %s -n %d --bytes %zu --policy %s --dot\n", model::name(cfg.c), n, cfg.bytes, model::name(p));
  std::fprintf(f, "digraph collx {\n  label=\"%s %s, N = %d, D = %s\";\n  labelloc=t;\n  rankdir=LR;\n  newrank=true;\n",
               model::name(p), model::name(cfg.c), n, human(double(cfg.bytes)).c_str());
  std::fprintf(f, "  node [shape=circle, fontsize=9, width=0.35, fixedsize=true];\n  edge [fontsize=8];\n");
  for (int r = 0; r < n; ++r) {
    std::fprintf(f, "  start%d [label=\"rank %d\", shape=plaintext, fixedsize=false];\n", r, r);
    std::fprintf(f, "  start%d -> r%dt0 [style=invis];\n", r, r);
    for (int t = 0; t <= T; ++t) {
      std::fprintf(f, "  r%dt%d [label=\"t%d\"];\n", r, t, t);
      if (t < T) std::fprintf(f, "  r%dt%d -> r%dt%d [color=gray80, arrowhead=none, weight=10];\n", r, t, r, t + 1);
    }
  }
  for (int t = 0; t <= T; ++t) {
    std::fprintf(f, "  { rank=same;");
    for (int r = 0; r < n; ++r) std::fprintf(f, " r%dt%d;", r, t);
    std::fprintf(f, " }\n");
  }
  // Receives by (from, to, time), in order, to tell which messages are reduced.
  std::map<std::tuple<int, int, int>, std::vector<bool>> reduced;
  for (int r = 0; r < n; ++r)
    for (const collx::step& st : all[std::size_t(r)].steps())
      for (auto i = st.recvs_begin; i < st.recvs_end; ++i) {
        const auto& o = all[std::size_t(r)].recvs()[i];
        reduced[{o.peer, r, st.time}].push_back(o.how != collx::combine::copy);
      }
  for (int r = 0; r < n; ++r)
    for (const collx::step& st : all[std::size_t(r)].steps()) {
      std::map<int, std::size_t> nth;
      for (auto i = st.sends_begin; i < st.sends_end; ++i) {
        const auto& o = all[std::size_t(r)].sends()[i];
        const auto& red = reduced[{r, o.peer, st.time}];
        const std::size_t k = nth[o.peer]++;
        const bool reduces = k < red.size() && red[k];
        // A message of step t arrives for step t's end: drawn from t to t+1.
        std::fprintf(f, "  r%dt%d -> r%dt%d [label=\"%s\"%s];\n", r, st.time, o.peer, st.time + 1,
                     human(double(o.src.count * elem)).c_str(), reduces ? ", color=red, fontcolor=red" : "");
      }
    }
  std::fprintf(f, "}\n");
  if (f != stdout) {
    std::fclose(f);
    std::printf("wrote %s (%s; render with: dot -Tpng %s -o schedule.png)\n", cfg.dot.c_str(), model::name(p), cfg.dot.c_str());
  }
  return true;
}

/// --measure: runs collx-perf for each policy at this size and prints predicted and measured time.
bool measure(const config& cfg) {
  const std::string perf_transport(collx::find_transport(cfg.transport)->flag);
  const model::problem pr = problem_of(cfg);
  const std::size_t b = pr.bytes();
  const int iters = b < (std::size_t(64) << 10) ? 1000 : b <= (std::size_t(4) << 20) ? 50 : 5;
  std::printf("\n== predicted and measured: %s -np %d, %s, transport %s (%s)\n", model::name(cfg.c), cfg.n,
              human(double(b)).c_str(), perf_transport.c_str(), cfg.perf.c_str());
  std::printf("   %-20s %12s %12s %10s\n", "policy", "predicted", "measured", "meas/pred");
  if (cfg.perf.find('\'') != std::string::npos) {
    std::fprintf(stderr, "collx-explain: cannot run collx-perf from a path with a quote in it: %s\n", cfg.perf.c_str());
    return false;
  }
  bool ok = true;
  std::vector<std::string> names;
  for (model::choice p : shown(cfg)) names.push_back(model::name(p));
  if (cfg.policy.empty()) names.push_back("automatic");
  for (const std::string& name : names) {
    const std::string cmd = "'" + cfg.perf + "' --transport " + perf_transport + " -np " + std::to_string(cfg.n) + " --op " +
                            model::name(cfg.c) + " --algo " + name + " -b " + std::to_string(b) + " -e " + std::to_string(b) +
                            " -n " + std::to_string(iters) + " -w " + std::to_string(std::max(2, iters / 20)) +
                            (cfg.c == coll::broadcast || cfg.c == coll::reduce ? " -r " + std::to_string(cfg.root) : "") +
                            " 2>&1";
    std::FILE* pp = popen(cmd.c_str(), "r");
    double us = -1;
    char line[512];
    while (pp && std::fgets(line, sizeof line, pp)) {
      if (line[0] == '#') continue;
      unsigned long long size = 0, count = 0;
      char type[32], redop[32];
      int root = 0;
      double t = 0;
      if (std::sscanf(line, "%llu %llu %31s %31s %d %lf", &size, &count, type, redop, &root, &t) == 6) us = t;
    }
    const int rc = pp ? pclose(pp) : -1;
    const auto pol = model::parse_policy(name);
    const model::choice predicted_policy = pol ? *pol : model::best(pr, cfg.params);
    const double pred = model::predict(model::analyse(predicted_policy, pr), cfg.params) * 1e6;
    if (us < 0 || rc != 0) {
      std::printf("   %-20s %9.2f us %12s   (collx-perf failed: %s)\n", name.c_str(), pred, "-", cmd.c_str());
      ok = false;
      continue;
    }
    std::printf("   %-20s %9.2f us %9.2f us %10.2f%s\n", name.c_str(), pred, us, us / pred,
                pol ? "" : (std::string("   (ran ") + model::name(predicted_policy) + ")").c_str());
  }
  return ok;
}

int usage(const char* argv0) {
  std::fprintf(stderr,
               "usage: %s [COLLECTIVE] [-n N] [--bytes SIZE] [--root R] [--noncommutative] [--transport T]\n"
               "                     [--policy P,..] [--alpha S] [--beta S] [--gamma S] [--steps K|all]\n"
               "                     [--dot FILE] [--measure] [--csv MIN MAX] [--nodes A,B,..] [--round-robin] [--net T] [--topology]\n"
               "                     [--order]\n"
               "  COLLECTIVE        all_reduce (default), reduce_scatter, all_gather, broadcast, reduce, all_to_all\n"
               "  -n N              ranks (default 4)\n"
               "  -b, --bytes SIZE  the largest buffer a rank passes (nccl-tests' size), e.g. 64K (default), 64MiB\n"
               "  --root R          root of broadcast and reduce (default 0)\n"
               "  --noncommutative  the rank-order-preserving paths\n"
               "  --transport T     whose alpha, beta, gamma the model uses, and --measure runs over:\n"
               "                    threads, shm (default) or tcp\n"
               "  --policy P[,P..]  only these policies (ring, tree, recursive_halving, recursive_doubling, pairwise);\n"
               "                    the summary and crossovers then weigh only them\n"
               "  --alpha S, --beta S, --gamma S, --delta D   what-if model parameters (seconds per step, per byte,\n"
               "                    per byte reduced; delta in [0, 1]: 0 full duplex, 1 an exchange costs two messages)\n"
               "  --steps K|all     schedule lines printed per policy (default 64)\n"
               "  --dot FILE        write one policy's schedule (--policy, else the model's pick) as Graphviz ('-': stdout)\n"
               "  --measure         also run each policy with collx-perf and print predicted and measured time\n"
               "                    (collx-perf: $COLLX_PERF, else next to this program or in ../bench/, else PATH)\n"
               "  --csv MIN MAX     print predicted time and busbw per policy for sizes MIN..MAX (x2), as CSV\n"
               "  --nodes A,B,..    the ranks laid out on nodes of A, B, .. ranks (N is their sum): the two-level\n"
               "                    model (--transport within a node, --net between, default tcp), two_level beside\n"
               "                    the flat policies, and the bytes out of each node counted against the formula\n"
               "  --round-robin     with --nodes: ranks dealt out over the nodes in turn\n"
               "  --net T           with --nodes: the transport between nodes (tcp, shm, threads)\n"
               "  --topology        this machine's NUMA domains and CPUs (hwloc), and where each rank of the job\n"
               "                    (-n, or --nodes) is placed\n"
               "  --order           the order each policy adds each block's contributions in (all_reduce,\n"
               "                    reduce_scatter, reduce), and the deterministic mode's: rank order\n",
               argv0);
  return 2;
}

/// --order: the expression each policy computes block b's result by (algo/order.hpp), every
/// rank's schedule run on symbols; then algo::deterministic's, which is rank order for every
/// block. Floating-point addition rounds at every "+", so different expressions may give
/// different bits (docs/precision.md).
bool print_order(const config& cfg) {
  if (cfg.c != coll::all_reduce && cfg.c != coll::reduce_scatter && cfg.c != coll::reduce) {
    std::fprintf(stderr, "collx-explain --order: %s does not reduce (all_reduce, reduce_scatter or reduce)\n", model::name(cfg.c));
    return false;
  }
  if (cfg.n > 16) {
    std::fprintf(stderr, "collx-explain --order: at most 16 ranks (the expressions grow with N)\n");
    return false;
  }
  const bool rs = cfg.c == coll::reduce_scatter;
  // one element per block: rank q's result for reduce_scatter, the root's (rank 0's) blocks else
  const model::problem pr{cfg.c, cfg.n, rs ? 1 : std::size_t(cfg.n), elem, cfg.root, cfg.commutative};
  const std::size_t in = std::size_t(cfg.n), out = rs ? 1 : std::size_t(cfg.n);
  std::printf("The order %s adds block b in over N = %d ranks (xq: rank q's contribution; every + rounds once)\n",
              model::name(cfg.c), cfg.n);
  auto show = [&](const char* name, const std::vector<schedule>& all) {
    if (all.empty()) return;  // (no schedule for this collective and op)
    const auto got = algo::addition_order(all, in, out);
    std::printf("%s\n", name);
    const int who = cfg.c == coll::reduce ? cfg.root : 0;
    for (int b = 0; b < cfg.n; ++b) {
      const std::string& e = rs ? got[std::size_t(b)][0] : got[std::size_t(who)][std::size_t(b)];
      std::printf("  block %d%s: %s\n", b, rs ? (" (on rank " + std::to_string(b) + ")").c_str() : "", e.c_str());
    }
  };
  for (model::choice p : shown(cfg))
    model::visit(p, [&](const auto& a) { show(a.name, model::schedules(a, pr)); });
  show("deterministic (algo::deterministic<P>, any P; options::deterministic, COLLX_DETERMINISTIC=1)",
       model::schedules(algo::deterministic<>{}, pr));
  return true;
}

/// collx-perf for --measure.
std::string find_perf(const char* argv0) {
  if (const char* e = std::getenv("COLLX_PERF"); e != nullptr && *e != 0) return e;
  std::string dir = argv0;
  dir = dir.find('/') == std::string::npos ? "." : dir.substr(0, dir.rfind('/'));
  for (const std::string& c : {dir + "/collx-perf", dir + "/../bench/collx-perf"})
    if (access(c.c_str(), X_OK) == 0) return c;
  return "collx-perf";
}

}  // namespace

int main(int argc, char** argv) {
  config cfg;
  bool bytes_given = false;
  double alpha = -1, beta = -1, gamma = -1, delta = -1;  // --alpha/--beta/--gamma/--delta: what-if values
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    auto value = [&]() -> std::string_view { return i + 1 < argc ? argv[++i] : ""; };
    if (arg == "-n" || arg == "-b" || arg == "--bytes" || arg == "--root") {
      const auto v = parse_size(value());
      if (!v) return usage(argv[0]);
      if ((arg == "-n" || arg == "--root") && *v > 1024) return usage(argv[0]);
      if (arg == "-n") cfg.n = int(*v);
      else if (arg == "--root") cfg.root = int(*v);
      else cfg.bytes = *v, bytes_given = true;
    } else if (arg == "--noncommutative") {
      cfg.commutative = false;
    } else if (arg == "--transport") {
      const collx::transport_entry* t = collx::find_transport(value());
      if (t == nullptr || t->ranks == collx::rank_kind::device) return usage(argv[0]);
      cfg.transport = t->name;
    } else if (arg == "--policy") {
      cfg.policy = value();
      for (const std::string& one : comma_list(cfg.policy))
        if (!model::parse_policy(one)) {
          std::fprintf(stderr, "collx-explain: unknown policy '%s'\n", one.c_str());
          return 2;
        }
    } else if (arg == "--alpha" || arg == "--beta" || arg == "--gamma" || arg == "--delta") {
      char* end = nullptr;
      const std::string v(value());
      const double x = std::strtod(v.c_str(), &end);
      if (v.empty() || *end != 0 || !(x >= 0) || (arg == "--delta" && x > 1)) return usage(argv[0]);
      (arg == "--alpha" ? alpha : arg == "--beta" ? beta : arg == "--gamma" ? gamma : delta) = x;
    } else if (arg == "--steps") {
      const std::string_view v = value();
      if (v == "all") cfg.steps = -1;
      else if (const auto k = parse_size(v)) cfg.steps = long(*k);
      else return usage(argv[0]);
    } else if (arg == "--dot") {
      cfg.dot = value();
      if (cfg.dot.empty()) return usage(argv[0]);
    } else if (arg == "--measure") {
      cfg.measure = true;
    } else if (arg == "--csv") {
      const auto lo = parse_size(value()), hi = parse_size(value());
      if (!lo || !hi || *lo == 0 || *hi < *lo) return usage(argv[0]);
      cfg.csv = true;
      cfg.csv_min = *lo;
      cfg.csv_max = *hi;
    } else if (arg == "--nodes") {
      cfg.nodes.clear();
      for (const std::string& one : comma_list(std::string(value()))) {
        const auto k = parse_size(one);
        if (!k || *k < 1 || *k > 1024) return usage(argv[0]);
        cfg.nodes.push_back(int(*k));
      }
      cfg.n = 0;
      for (int k : cfg.nodes) cfg.n += k;
    } else if (arg == "--order") {
      cfg.order = true;
    } else if (arg == "--topology") {
      cfg.topology = true;
    } else if (arg == "--round-robin") {
      cfg.round_robin = true;
    } else if (arg == "--net") {
      const collx::transport_entry* t = collx::find_transport(value());
      if (t == nullptr || t->ranks == collx::rank_kind::device) return usage(argv[0]);
      cfg.net = t->name;
    } else if (const auto c = model::parse_collective(arg)) {
      cfg.c = *c;
    } else {
      return usage(argv[0]);
    }
  }
  (void)bytes_given;
  if (cfg.n < 1 || cfg.n > 1024 || cfg.root < 0 || cfg.root >= cfg.n) return usage(argv[0]);
  if (!cfg.policy.empty() && shown(cfg).empty()) {
    std::fprintf(stderr, "collx-explain: %s has no %s schedule%s\n", cfg.policy.c_str(), model::name(cfg.c),
                 cfg.commutative ? "" : " for a non-commutative op");
    return 2;
  }
  cfg.params = model::params_for(cfg.transport, cfg.n);
  if (alpha >= 0 || beta >= 0 || gamma >= 0 || delta >= 0) {
    if (alpha >= 0) cfg.params.alpha = alpha;
    if (beta >= 0) cfg.params.beta = beta;
    if (gamma >= 0) cfg.params.gamma = gamma;
    if (delta >= 0) cfg.params.delta = delta;
    cfg.params.source = "given on the command line" +
                        std::string(alpha >= 0 && beta >= 0 && gamma >= 0 && delta >= 0 ? "" : ", the rest from " + cfg.params.source);
  }
  cfg.perf = find_perf(argv[0]);
  if (cfg.topology) return print_topology(cfg) ? 0 : 1;
  if (cfg.csv) {
    print_csv(cfg);
    return 0;
  }
  if (!cfg.dot.empty()) return write_dot(cfg) ? 0 : 1;
  if (cfg.order) return print_order(cfg) ? 0 : 1;

  std::printf("%s over N = %d ranks, D = %zu bytes of float (blocks: the buffer cut into N in rank order)\n",
              model::name(cfg.c), cfg.n, cfg.bytes);
  bool ok = true;
  for (model::choice p : shown(cfg))
    ok = model::visit(p, [&](const auto& a) { return print_policy(a, cfg); }) && ok;
  print_summary(cfg);
  if (!cfg.nodes.empty()) ok = print_nodes(cfg) && ok;
  if (cfg.measure) ok = measure(cfg) && ok;
  return ok ? 0 : 1;
}
