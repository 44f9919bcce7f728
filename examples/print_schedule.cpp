// print_schedule: what each algorithm policy actually does, step by step, for every rank.
//
// A collx policy is a pure function from a problem (this rank, the rank count, the block layout)
// to a schedule: a list of steps, each a few sends and receives that run together. Nothing here
// runs a collective: the program asks each policy for every rank's schedule, exactly as the
// collectives do, and prints it as a table
//
//   t3  rank 1  sends block 2 to rank 2
//   t3  rank 1  receives block 1 from rank 0 and reduces it into out block 1 = recv (+) in block 1
//
// followed by the per-rank message and byte counts read off the same data, beside the textbook
// formula (ring all-reduce: 2(N-1) steps, 2(N-1)/N·D bytes sent per rank). docs/algorithms.md
// derives every formula printed here.
//
//   print_schedule                          all_reduce, N = 4, D = 64 KiB of float
//   print_schedule -n 5 reduce_scatter      any collective: all_reduce reduce_scatter all_gather
//                                           broadcast reduce all_to_all
//   print_schedule -n 8 -b 1M --root 3 broadcast
//   print_schedule --noncommutative all_reduce    the rank-order-preserving paths
//
// The program also checks that every send meets a receive of the same size at the same step on
// its peer, and exits non-zero if one does not (so it doubles as a test).
#include <collx/collx.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

namespace {

using collx::buf;
using collx::partition;
using collx::region;
using collx::schedule;
namespace algo = collx::algo;

enum class coll { all_reduce, reduce_scatter, all_gather, broadcast, reduce, all_to_all };
constexpr std::string_view coll_names[] = {"all_reduce", "reduce_scatter", "all_gather",
                                           "broadcast",  "reduce",         "all_to_all"};

struct config {
  int n = 4;
  coll c = coll::all_reduce;
  std::size_t bytes = std::size_t(64) << 10;  // D: the largest buffer a rank passes (nccl-tests' "size")
  int root = 0;
  bool commutative = true;
};

// The element type is float: 4 bytes. Schedules count elements; everything printed is bytes.
constexpr std::size_t elem = 4;

/// The length of the common timeline: the last step time with a message, plus one.
int timeline(const std::vector<schedule>& all) {
  int t = 0;
  for (const schedule& s : all)
    for (const collx::step& st : s.steps())
      if (st.sends_end > st.sends_begin || st.recvs_end > st.recvs_begin) t = std::max(t, st.time + 1);
  return t;
}

// ---- building every rank's schedule, as the collectives do ------------------------------------

/// The schedules of all ranks; `ag_shift` receives the step at which all_reduce's all-gather starts
/// (-1 when the policy supplies its own all_reduce).
template <class Algo>
std::vector<schedule> build(const Algo& a, const config& cfg, int& ag_shift) {
  const int n = cfg.n;
  const std::size_t D = cfg.bytes / elem;  // elements of the whole buffer
  const std::size_t k = D / std::size_t(n);  // per-rank block of the split collectives
  std::vector<schedule> v;
  ag_shift = -1;
  // all_to_all's uniform layout: k elements per peer, in rank order, on both sides.
  const std::vector<std::size_t> counts(static_cast<std::size_t>(n), k);
  std::vector<std::size_t> offs;
  for (int i = 0; i < n; ++i) offs.push_back(std::size_t(i) * k);
  for (int r = 0; r < n; ++r) {
    switch (cfg.c) {
      case coll::all_reduce:
        if constexpr (requires(const algo::ar_problem& p) { a.all_reduce(p); }) {
          // tree: the policy's own all_reduce (reduce + broadcast over a double binary tree).
          v.push_back(a.all_reduce({r, n, D, elem, cfg.commutative, buf::in}));
        } else if constexpr (requires(const algo::rs_problem& p) { a.reduce_scatter(p); }) {
          // all_reduce = reduce_scatter + all_gather over the same N blocks. The all-gather starts
          // on the common timeline once the longest reduce-scatter has ended.
          // (A reduce-scatter may end with a step that only copies a result into place; that step
          // runs before the all-gather's first messages and takes no slot of its own.)
          const partition blocks(D, n);
          std::vector<schedule> rs;
          for (int q = 0; q < n; ++q) rs.push_back(a.reduce_scatter({q, n, blocks, buf::in, buf::out, elem, cfg.commutative}));
          const int shift = timeline(rs);
          schedule s = rs[std::size_t(r)];
          s.append(a.all_gather({r, n, blocks, true, 0, elem}), shift);
          v.push_back(s);
          ag_shift = shift;
        }
        break;
      case coll::reduce_scatter:  // in: N blocks of k; out: this rank's k (compact, as reduce_scatter() passes it)
        if constexpr (requires(const algo::rs_problem& p) { a.reduce_scatter(p); })
          v.push_back(a.reduce_scatter({r, n, partition(k * std::size_t(n), n), buf::in, buf::none, elem, cfg.commutative}));
        break;
      case coll::all_gather:  // in: this rank's k; out: N blocks of k
        if constexpr (requires(const algo::ag_problem& p) { a.all_gather(p); })
          v.push_back(a.all_gather({r, n, partition(k * std::size_t(n), n), false, 0, elem}));
        break;
      case coll::broadcast:
        if constexpr (requires(const algo::bcast_problem& p) { a.broadcast(p); })
          v.push_back(a.broadcast({r, n, cfg.root, D, elem}));
        break;
      case coll::reduce:
        if constexpr (requires(const algo::reduce_problem& p) { a.reduce(p); })
          v.push_back(a.reduce({r, n, cfg.root, D, elem, cfg.commutative}));
        break;
      case coll::all_to_all:
        if constexpr (requires(const algo::a2a_problem& p) { a.all_to_all(p); })
          v.push_back(a.all_to_all(algo::a2a_problem{r, n, counts, offs, counts, offs}));
        break;
    }
  }
  return v;
}

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

struct tally {
  int steps = 0;  // steps with at least one message: what transport::counting calls steps
  std::size_t msgs_sent = 0, bytes_sent = 0, msgs_recv = 0, bytes_recv = 0, bytes_reduced = 0;
};

tally count(const schedule& s) {
  tally t;
  for (const collx::step& st : s.steps()) {
    if (st.sends_end > st.sends_begin || st.recvs_end > st.recvs_begin) ++t.steps;
    for (auto i = st.sends_begin; i < st.sends_end; ++i) {
      ++t.msgs_sent;
      t.bytes_sent += s.sends()[i].src.count * elem;
    }
    for (auto i = st.recvs_begin; i < st.recvs_end; ++i) {
      const collx::recv_op& r = s.recvs()[i];
      ++t.msgs_recv;
      t.bytes_recv += r.dst.count * elem;
      if (r.how != collx::combine::copy) t.bytes_reduced += r.dst.count * elem;
    }
  }
  return t;
}

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

/// A formula for the timeline length and for one byte count, and whose bytes it is.
struct formula {
  std::string steps_text;
  int steps = 0;
  std::string bytes_text;
  double bytes = 0;
  enum class who { each, one_rank, max, total } whom = who::each;
  int rank = 0;         // for one_rank
  bool received = false;  // the count is of bytes received, not sent
  bool pow2_only = false;  // the byte formula holds for N a power of two
};

int tree_height(int n) {  // the taller of the double binary tree's two trees
  int best = 0;
  for (int t = 0; t < 2; ++t) {
    std::vector<int> depth(std::size_t(n), 0);
    for (int r = 0; r < n; ++r)
      for (int a = r; algo::dtree(n, a, t).parent >= 0; a = algo::dtree(n, a, t).parent) ++depth[std::size_t(r)];
    best = std::max(best, *std::max_element(depth.begin(), depth.end()));
  }
  return best;
}

template <class Algo>
formula textbook(const Algo&, const config& cfg) {
  using W = formula::who;
  const int n = cfg.n, lg = algo::ceil_log2(n), p = algo::floor_pow2(n), lgp = algo::ceil_log2(p);
  const bool pow2 = n == p;
  // D: the whole buffer of all_reduce, broadcast and reduce; the N blocks of k elements of the
  // split collectives (reduce_scatter's input, all_gather's output, all_to_all's send buffer).
  const bool split = cfg.c == coll::reduce_scatter || cfg.c == coll::all_gather || cfg.c == coll::all_to_all;
  const double D = double(split ? cfg.bytes / elem / std::size_t(n) * std::size_t(n) * elem : cfg.bytes / elem * elem);
  const double share = double(n - 1) / n * D;
  const std::string lgs = pow2 ? "log2 N" : "log2 p + 2";  // recursive halving's steps per phase
  const int lgv = pow2 ? lgp : lgp + 2;
  const int chain_chunks = algo::chunks(cfg.bytes / elem, elem, algo::tuning::pipeline_chunk_bytes).parts;
  const std::string C = "C = " + std::to_string(chain_chunks) + " chunks of 256 KiB";
  if constexpr (std::is_same_v<Algo, algo::ring>) {
    switch (cfg.c) {
      case coll::all_reduce: return {"2(N-1)", 2 * (n - 1), "2(N-1)/N·D", 2 * share, W::each};
      case coll::reduce_scatter:
      case coll::all_gather: return {"N-1", n - 1, "(N-1)/N·D", share, W::each};
      case coll::broadcast:
        return {"C+N-2, " + C, chain_chunks + n - 2, "D by every rank but the chain's last", D, W::max};
      case coll::reduce:
        return {"C+N-2, " + C, chain_chunks + n - 2, "D, received and reduced, by every rank but the chain's first", D,
                W::max, 0, true};
      default: break;
    }
  } else if constexpr (std::is_same_v<Algo, algo::tree>) {
    switch (cfg.c) {
      case coll::all_reduce: {
        const int H = tree_height(n), trees = cfg.commutative ? 2 : 1;
        const std::size_t largest = partition(cfg.bytes / elem, trees).count(0);
        const int c = algo::chunks(largest, elem, algo::tuning::pipeline_chunk_bytes).parts;
        return {"2H+C-1, H = " + std::to_string(H) + " (tree height), C = " + std::to_string(c) + " chunk(s) per tree",
                2 * H + c - 1, "2(N-1)·D, all ranks together", 2.0 * (n - 1) * D, W::total};
      }
      case coll::reduce_scatter:
        return {"2·ceil(log2 N): reduce to rank 0, then scatter", 2 * lg, "(N-1)/N·D by rank 0 (the scatter)", share,
                W::one_rank, 0};
      case coll::all_gather:
        return {"2·ceil(log2 N): gather at rank 0, then broadcast", 2 * lg, "ceil(log2 N)·D by rank 0 (the broadcast)",
                lg * D, W::one_rank, 0};
      case coll::broadcast:
        return {"ceil(log2 N)", lg, "ceil(log2 N)·D by the root", lg * D, W::one_rank, cfg.root};
      case coll::reduce: {
        // A non-commutative op is reduced at rank 0 (where binomial subtrees are rank ranges), which
        // then forwards the result to the root in one more step.
        const bool forward = !cfg.commutative && cfg.root != 0;
        return {forward ? "ceil(log2 N)+1" : "ceil(log2 N)", lg + (forward ? 1 : 0),
                forward ? "ceil(log2 N)·D received by rank 0" : "ceil(log2 N)·D received by the root",
                lg * D, W::one_rank, forward ? 0 : cfg.root, true};
      }
      default: break;
    }
  } else if constexpr (std::is_same_v<Algo, algo::recursive_halving>) {
    const std::string note;
    formula f = [&]() -> formula {
    switch (cfg.c) {
      case coll::all_reduce:
        if (!cfg.commutative)
          return {"2(" + lgs + ")", 2 * lgv, "log2 p·D + (N-1)/N·D (doubling on whole vectors, then all-gather)" + note,
                  lgp * D + share, W::max};
        return {"2(" + lgs + ")", 2 * lgv, "2(N-1)/N·D" + note, 2 * share, W::max};
      case coll::reduce_scatter:
        if (!cfg.commutative) return {lgs, lgv, "log2 p·D (doubling on whole vectors)" + note, lgp * D, W::max};
        return {lgs, lgv, "(N-1)/N·D" + note, share, W::max};
      case coll::all_gather: return {lgs, lgv, "(N-1)/N·D" + note, share, W::max};
      case coll::broadcast:
        // The scatter's last time slot only copies (in place: nothing), so the all-gather starts a
        // slot later on the timeline: ceil(log2 N) + 1 + (steps of the all-gather).
        return {"ceil(log2 N)+1+(" + lgs + "): binomial scatter, then all-gather", lg + 1 + lgv,
                "2(N-1)/N·D by the root" + note, 2 * share, W::one_rank, cfg.root};
      case coll::reduce:
        return {"(" + lgs + ")+1: reduce-scatter, then every block straight to the root", lgv + 1,
                "(N-1)/N·D received by the root in the last step, after its reduce-scatter share" + note,
                cfg.commutative ? 2 * share : lgp * D + share, W::one_rank, cfg.root, true};
      default: break;
    }
    return {};
    }();
    f.pow2_only = !pow2;
    return f;
  } else if constexpr (std::is_same_v<Algo, algo::pairwise>) {
    return {"N-1", n - 1, "(N-1)/N·D", share, W::each};
  }
  return {};
}

// ---- printing --------------------------------------------------------------------------------

std::string human(double bytes) {
  char b[32];
  if (bytes >= 1 << 20) std::snprintf(b, sizeof b, "%.4g MiB", bytes / (1 << 20));
  else if (bytes >= 1 << 10) std::snprintf(b, sizeof b, "%.4g KiB", bytes / (1 << 10));
  else std::snprintf(b, sizeof b, "%.0f B", bytes);
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
  int ag_shift = -1;
  const std::vector<schedule> all = build(a, cfg, ag_shift);
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
      if (ag_shift < 0) {  // the double binary tree: name halves and chunks as tree.hpp cuts them
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

  std::printf("\n== %s %s, N = %d, D = %s%s%s\n", Algo::name, std::string(coll_names[int(cfg.c)]).c_str(), n,
              human(double(cfg.bytes)).c_str(),
              cfg.c == coll::broadcast || cfg.c == coll::reduce ? (", root " + std::to_string(cfg.root)).c_str() : "",
              cfg.commutative ? "" : ", non-commutative op");
  if (ag_shift >= 0) std::printf("   reduce-scatter at t0..t%d, then all-gather from t%d\n", ag_shift - 1, ag_shift);
  if (nm.halves && nm.halves->parts == 2)
    std::printf("   half A (elements [0, %zu)) goes through tree A, half B through tree B, at once\n", nm.halves->count(0));
  if (nm.halves && nm.halves->parts == 1)
    std::printf("   all of the buffer goes through tree A, whose subtrees are ranges of consecutive ranks\n");

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
  for (int t = 0; t <= last; ++t) {
    for (int r = 0; r < n; ++r) {
      const schedule& s = all[std::size_t(r)];
      max_tmp = std::max(max_tmp, s.tmp_elems());
      for (const collx::step& st : s.steps()) {
        if (st.time != t) continue;
        auto line = [&](const std::string& text) { std::printf("  t%-3d rank %-3d %s\n", t, r, text.c_str()); };
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
  std::vector<tally> tl;
  for (int r = 0; r < n; ++r) {
    const tally t = count(all[std::size_t(r)]);
    tl.push_back(t);
    std::printf("   %-6d %6d %10zu %12zu %10zu %12zu %12zu\n", r, t.steps, t.msgs_sent, t.bytes_sent, t.msgs_recv,
                t.bytes_recv, t.bytes_reduced);
    total_sent += t.bytes_sent;
    max_counted = std::max(max_counted, f.received ? t.bytes_recv : t.bytes_sent);
  }
  const int span = timeline(all);
  std::printf("   timeline: %d steps; formula %s = %d%s\n", span, f.steps_text.c_str(), f.steps,
              span == f.steps ? " (matches)" : " (differs)");
  std::size_t counted = 0;
  std::string whose;
  switch (f.whom) {
    case formula::who::each: {
      std::size_t lo = SIZE_MAX, hi = 0;
      for (const tally& t : tl) {
        lo = std::min(lo, f.received ? t.bytes_recv : t.bytes_sent);
        hi = std::max(hi, f.received ? t.bytes_recv : t.bytes_sent);
      }
      counted = hi;
      whose = lo == hi ? "every rank " : "ranks " + std::to_string(lo) + " to ";
      break;
    }
    case formula::who::one_rank:
      counted = f.received ? tl[std::size_t(f.rank)].bytes_recv : tl[std::size_t(f.rank)].bytes_sent;
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
              : std::abs(diff) <= double(2 * n * int(elem)) ? " (matches up to partition rounding)"
                                                           : " (differs)");

  return problem.empty();
}

std::optional<std::size_t> parse_size(std::string_view s) {  // 64K, 1M, 4096
  if (s.empty()) return std::nullopt;
  std::size_t mult = 1;
  const char last = s.back();
  if (last == 'K' || last == 'k') mult = std::size_t(1) << 10;
  if (last == 'M' || last == 'm') mult = std::size_t(1) << 20;
  if (mult != 1) s.remove_suffix(1);
  char* end = nullptr;
  const std::string str(s);
  const unsigned long long v = std::strtoull(str.c_str(), &end, 10);
  if (end == str.c_str() || *end != 0) return std::nullopt;
  return std::size_t(v) * mult;
}

int usage(const char* argv0) {
  std::fprintf(stderr,
               "usage: %s [-n N] [-b BYTES] [--root R] [--noncommutative] [COLLECTIVE]\n"
               "  COLLECTIVE: all_reduce (default), reduce_scatter, all_gather, broadcast, reduce, all_to_all\n"
               "  -n N      ranks (default 4)\n"
               "  -b BYTES  the largest buffer a rank passes, e.g. 64K (default), 1M\n",
               argv0);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  config cfg;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if ((arg == "-n" || arg == "-b" || arg == "--root") && i + 1 < argc) {
      const auto v = parse_size(argv[++i]);
      if (!v) return usage(argv[0]);
      if (arg == "-n") cfg.n = int(*v);
      else if (arg == "-b") cfg.bytes = *v;
      else cfg.root = int(*v);
    } else if (arg == "--noncommutative") {
      cfg.commutative = false;
    } else if (auto it = std::find(std::begin(coll_names), std::end(coll_names), arg); it != std::end(coll_names)) {
      cfg.c = coll(it - std::begin(coll_names));
    } else {
      return usage(argv[0]);
    }
  }
  if (cfg.n < 1 || cfg.n > 1024 || cfg.root < 0 || cfg.root >= cfg.n) return usage(argv[0]);

  std::printf("%s over N = %d ranks, D = %zu bytes of float (blocks: the buffer cut into N in rank order)\n",
              std::string(coll_names[int(cfg.c)]).c_str(), cfg.n, cfg.bytes);
  bool ok = true;
  if (cfg.c == coll::all_to_all) {
    ok = print_policy(algo::pairwise{}, cfg);
  } else {
    ok = print_policy(algo::ring{}, cfg) && ok;
    ok = print_policy(algo::tree{}, cfg) && ok;
    ok = print_policy(algo::recursive_halving{}, cfg) && ok;
  }
  return ok ? 0 : 1;
}
