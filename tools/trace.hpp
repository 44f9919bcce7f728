#pragma once
// What collx-trace (collx_trace.cpp) makes of a job's flight-recorder dumps: one
// collx-rank<R>.json per job rank (include/collx/comm/flight.hpp writes them), read back, lined up
// communicator by communicator, and told as
//   - where each rank is: its last call on each communicator, and which ranks are behind (the
//     lowest sequence number; a rank with no dump at all is named too);
//   - the first call that mismatched: one sequence number of one communicator where the ranks
//     called different collectives, sizes, element types, ops or roots;
//   - who waits on whom: every running or failed call's peer, followed rank to rank to the one
//     that waits on nobody (the cause, or a dead rank);
//   - the straggler table: per communicator, per rank, over the recorded window, how long it
//     waited, how long the others waited on it, and how much of that its late arrival explains.
// Header-only so that the suite (tests/test_flight.cpp) checks the very analysis the tool prints.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <collx/comm/flight.hpp>

namespace collx_trace {

// ---- a small JSON reader (what the dumps contain: objects, arrays, strings, integers) -------

struct json {
  enum kind_t { null, boolean, number, string, array, object } kind = null;
  double num = 0;
  long long inum = 0;  // numbers are read exactly when they are integers (nanoseconds need 64 bits)
  bool b = false;
  std::string str;
  std::vector<json> items;     // an array's
  std::vector<std::string> keys;  // an object's member names, their values in items

  const json* find(std::string_view k) const {
    for (std::size_t i = 0; i < keys.size(); ++i)
      if (keys[i] == k) return &items[i];
    return nullptr;
  }
  long long i(std::string_view k, long long dflt = 0) const {
    const json* v = find(k);
    return v != nullptr && v->kind == number ? v->inum : dflt;
  }
  std::string s(std::string_view k) const {
    const json* v = find(k);
    return v != nullptr && v->kind == string ? v->str : std::string();
  }
  const std::vector<json>& a(std::string_view k) const {
    static const std::vector<json> none;
    const json* v = find(k);
    return v != nullptr && v->kind == array ? v->items : none;
  }
};

struct parse_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class json_parser {
 public:
  explicit json_parser(std::string_view t) : t_(t) {}
  json parse() {
    json v = value(0);
    ws();
    if (p_ != t_.size()) fail("text after the document");
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw parse_error(what + " at byte " + std::to_string(p_));
  }
  void ws() {
    while (p_ < t_.size() && (t_[p_] == ' ' || t_[p_] == '\n' || t_[p_] == '\r' || t_[p_] == '\t')) ++p_;
  }
  bool eat(char c) {
    ws();
    if (p_ < t_.size() && t_[p_] == c) {
      ++p_;
      return true;
    }
    return false;
  }
  json value(int depth) {
    if (depth > 64) fail("nested too deep");
    ws();
    if (p_ >= t_.size()) fail("unexpected end");
    json v;
    const char c = t_[p_];
    if (c == '{') {
      ++p_;
      v.kind = json::object;
      if (eat('}')) return v;
      do {
        ws();
        if (p_ >= t_.size() || t_[p_] != '"') fail("expected a member name");
        std::string k = str();
        if (!eat(':')) fail("expected ':'");
        v.keys.push_back(std::move(k));
        v.items.push_back(value(depth + 1));
      } while (eat(','));
      if (!eat('}')) fail("expected ',' or '}'");
    } else if (c == '[') {
      ++p_;
      v.kind = json::array;
      if (eat(']')) return v;
      do v.items.push_back(value(depth + 1));
      while (eat(','));
      if (!eat(']')) fail("expected ',' or ']'");
    } else if (c == '"') {
      v.kind = json::string;
      v.str = str();
    } else if (t_.substr(p_, 4) == "true" || t_.substr(p_, 5) == "false") {
      v.kind = json::boolean;
      v.b = t_[p_] == 't';
      p_ += v.b ? 4 : 5;
    } else if (t_.substr(p_, 4) == "null") {
      p_ += 4;
    } else if (c == '-' || (c >= '0' && c <= '9')) {
      const std::size_t s = p_;
      bool integer = true;
      if (t_[p_] == '-') ++p_;
      while (p_ < t_.size() && ((t_[p_] >= '0' && t_[p_] <= '9') || t_[p_] == '.' || t_[p_] == 'e' || t_[p_] == 'E' ||
                                t_[p_] == '+' || t_[p_] == '-')) {
        integer = integer && t_[p_] >= '0' && t_[p_] <= '9';
        ++p_;
      }
      const std::string n(t_.substr(s, p_ - s));
      v.kind = json::number;
      try {
        v.num = std::stod(n);
        v.inum = integer ? std::stoll(n) : static_cast<long long>(v.num);
      } catch (const std::exception&) {
        fail("bad number '" + n + "'");
      }
    } else {
      fail(std::string("unexpected '") + c + "'");
    }
    return v;
  }
  std::string str() {
    ++p_;  // the opening quote
    std::string o;
    while (true) {
      if (p_ >= t_.size()) fail("unterminated string");
      const char c = t_[p_++];
      if (c == '"') return o;
      if (c != '\\') {
        o += c;
        continue;
      }
      if (p_ >= t_.size()) fail("unterminated string");
      const char e = t_[p_++];
      switch (e) {
        case 'n': o += '\n'; break;
        case 't': o += '\t'; break;
        case 'r': o += '\r'; break;
        case 'b': o += '\b'; break;
        case 'f': o += '\f'; break;
        case 'u': {
          if (p_ + 4 > t_.size()) fail("bad \\u escape");
          const unsigned cp = unsigned(std::stoul(std::string(t_.substr(p_, 4)), nullptr, 16));
          p_ += 4;
          if (cp < 0x80) o += char(cp);
          else o += '?';  // the dumps escape control characters only
          break;
        }
        default: o += e;
      }
    }
  }
  std::string_view t_;
  std::size_t p_ = 0;
};

// ---- the dumps, typed -----------------------------------------------------------------------

struct peer_wait {
  int peer = -1;
  long long waited_ns = 0, late_ns = 0;
};

struct call {
  unsigned long long index = 0, seq = 0, count = 0;
  std::string collective, policy, op, state, error;
  unsigned elem_size = 0;
  int root = -1, waiting_for = -1, code = 0;
  long long issued_ns = 0, start_ns = 0, end_ns = 0, waited_ns = 0;
  std::vector<peer_wait> peers;
  bool collective_call() const { return seq != 0; }  // point-to-point calls carry seq 0
  bool finished() const { return state == "done"; }
};

struct comm_dump {
  std::string name, transport;
  int rank = 0, size = 0;
  std::vector<int> job_ranks;
  unsigned long long calls_total = 0, capacity = 0, life_calls = 0;
  long long busy_ns = 0;
  std::vector<long long> life_waited_ns, life_late_ns;
  std::vector<call> calls;
  int job_rank(int r) const { return r >= 0 && std::size_t(r) < job_ranks.size() ? job_ranks[std::size_t(r)] : r; }
};

struct rank_dump {
  std::string file, host, reason;
  int job_rank = -1;
  long long pid = 0, time_ns = 0;
  std::vector<comm_dump> comms;
};

inline rank_dump read_dump_text(const std::string& text, const std::string& file) {
  json d = json_parser(text).parse();
  if (d.kind != json::object || d.find("collx_flight_recorder") == nullptr)
    throw parse_error(file + ": not a collx flight-recorder dump");
  rank_dump r;
  r.file = file;
  r.job_rank = int(d.i("job_rank", -1));
  r.host = d.s("host");
  r.reason = d.s("reason");
  r.pid = d.i("pid");
  r.time_ns = d.i("time_ns");
  for (const json& c : d.a("communicators")) {
    comm_dump m;
    m.name = c.s("name");
    m.transport = c.s("transport");
    m.rank = int(c.i("rank"));
    m.size = int(c.i("size"));
    for (const json& j : c.a("job_ranks")) m.job_ranks.push_back(int(j.inum));
    m.calls_total = (unsigned long long)c.i("calls_total");
    m.capacity = (unsigned long long)c.i("capacity");
    if (const json* w = c.find("waits")) {
      m.life_calls = (unsigned long long)w->i("calls");
      m.busy_ns = w->i("busy_ns");
      for (const json& x : w->a("waited_ns")) m.life_waited_ns.push_back(x.inum);
      for (const json& x : w->a("late_ns")) m.life_late_ns.push_back(x.inum);
    }
    for (const json& e : c.a("calls")) {
      call k;
      k.index = (unsigned long long)e.i("index");
      k.seq = (unsigned long long)e.i("seq");
      k.collective = e.s("collective");
      k.policy = e.s("policy");
      k.op = e.s("op");
      k.count = (unsigned long long)e.i("count");
      k.elem_size = unsigned(e.i("elem_size"));
      k.root = int(e.i("root", -1));
      k.state = e.s("state");
      k.issued_ns = e.i("issued_ns");
      k.start_ns = e.i("start_ns");
      k.end_ns = e.i("end_ns");
      k.waited_ns = e.i("waited_ns");
      k.waiting_for = int(e.i("waiting_for", -1));
      k.code = int(e.i("code"));
      k.error = e.s("error");
      for (const json& p : e.a("peers")) k.peers.push_back({int(p.i("peer", -1)), p.i("waited_ns"), p.i("late_ns")});
      m.calls.push_back(std::move(k));
    }
    if (m.job_ranks.size() != std::size_t(m.size) || m.rank < 0 || m.rank >= m.size)
      throw parse_error(file + ": communicator '" + m.name + "' has rank " + std::to_string(m.rank) + " of " +
                        std::to_string(m.size) + " and " + std::to_string(m.job_ranks.size()) + " job ranks");
    r.comms.push_back(std::move(m));
  }
  return r;
}

inline rank_dump read_dump(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw parse_error(path + ": cannot be read");
  std::stringstream ss;
  ss << f.rdbuf();
  return read_dump_text(ss.str(), path);
}

// ---- the job, communicator by communicator --------------------------------------------------

/// One communicator of the job as the dumps show it: its name and members, and each member's
/// record (nullptr where that rank left no dump of it).
struct group {
  std::string name;           // "world" for the job's own
  std::vector<int> job_ranks;  // rank r of the group is job rank job_ranks[r]
  std::vector<const comm_dump*> member;
  std::string label() const {
    std::string s = name + "{";
    for (std::size_t k = 0; k < job_ranks.size(); ++k) s += (k ? "," : "") + std::to_string(job_ranks[k]);
    return s + "}";
  }
};

struct job {
  job() = default;
  job(job&&) = default;  // groups point into dumps: a move keeps them, a copy would not
  job& operator=(job&&) = default;
  job(const job&) = delete;
  job& operator=(const job&) = delete;
  std::vector<rank_dump> dumps;
  std::vector<group> groups;  // in the order first seen, the job's own first
  int world = 0;              // the job's size (the largest job rank seen + 1, or world's size)
};

inline job assemble(std::vector<rank_dump> dumps) {
  job j;
  j.dumps = std::move(dumps);
  std::sort(j.dumps.begin(), j.dumps.end(), [](const rank_dump& a, const rank_dump& b) { return a.job_rank < b.job_rank; });
  std::map<std::pair<std::string, std::vector<int>>, std::size_t> at;
  for (const rank_dump& d : j.dumps)
    for (const comm_dump& c : d.comms) {
      const auto key = std::make_pair(c.name, c.job_ranks);
      auto it = at.find(key);
      if (it == at.end()) {
        it = at.emplace(key, j.groups.size()).first;
        j.groups.push_back({c.name, c.job_ranks, std::vector<const comm_dump*>(c.job_ranks.size(), nullptr)});
      }
      j.groups[it->second].member[std::size_t(c.rank)] = &c;
      for (int x : c.job_ranks) j.world = std::max(j.world, x + 1);
    }
  std::stable_sort(j.groups.begin(), j.groups.end(),
                   [](const group& a, const group& b) { return (a.name == "world") > (b.name == "world"); });
  return j;
}

// ---- findings -------------------------------------------------------------------------------

inline std::string ranks_text(std::vector<int> v) { return collx::detail::rank_ranges(std::move(v)); }  // "0-2, 4, 6-7"
inline std::string plural_ranks(const std::vector<int>& v) { return (v.size() == 1 ? "rank " : "ranks ") + ranks_text(v); }

inline std::string duration(long long ns) {
  char b[32];
  const double a = double(ns < 0 ? -ns : ns);
  if (a >= 1e9) std::snprintf(b, sizeof b, "%.2f s", double(ns) / 1e9);
  else if (a >= 1e6) std::snprintf(b, sizeof b, "%.1f ms", double(ns) / 1e6);
  else std::snprintf(b, sizeof b, "%.1f us", double(ns) / 1e3);
  return b;
}

/// "all_reduce #41" (a collective) or "send (call 7)" (point to point).
inline std::string call_name(const call& c) {
  return c.collective + (c.collective_call() ? " #" + std::to_string(c.seq) : " (call " + std::to_string(c.index) + ")");
}
/// Its shape, as a mismatch is told.
inline std::string call_shape(const call& c) {
  std::string s = c.collective + "(count " + std::to_string(c.count) + ", " + std::to_string(c.elem_size) + " B elements";
  if (!c.op.empty() && c.op != "none") s += ", " + c.op;
  if (c.root >= 0) s += ", root " + std::to_string(c.root);
  if (!c.policy.empty()) s += ", " + c.policy;
  return s + ")";
}
inline bool same_shape(const call& a, const call& b) {
  return a.collective == b.collective && a.count == b.count && a.elem_size == b.elem_size && a.root == b.root &&
         a.op == b.op && a.policy == b.policy;
}

/// Where one rank is on one communicator: its last collective call (nullptr: none recorded).
inline const call* last_collective(const comm_dump& c) {
  for (auto it = c.calls.rbegin(); it != c.calls.rend(); ++it)
    if (it->collective_call()) return &*it;
  return nullptr;
}
/// The call a rank is stuck in: its last call when that is running or failed.
inline const call* stuck_call(const comm_dump& c) {
  if (c.calls.empty()) return nullptr;
  const call& k = c.calls.back();
  return k.finished() ? nullptr : &k;
}
/// The peer a stuck call waits on (the running wait, else the one waited on longest).
inline int waits_on(const call& k) {
  if (k.waiting_for >= 0) return k.waiting_for;
  return k.peers.empty() ? -1 : k.peers.front().peer;
}

struct position_line {
  std::string text;
  bool behind = false;
};

/// Where every rank of g is, one line per distinct place, the rank furthest behind first:
/// "rank 3 (job rank 5) is in all_reduce #41, running, waiting for rank 2; ranks 0-2 are past all_reduce #42".
inline std::vector<position_line> positions(const group& g) {
  struct place {
    unsigned long long seq = 0;
    std::string what;
    std::vector<int> ranks;
  };
  std::vector<place> places;
  std::vector<int> missing;
  for (std::size_t r = 0; r < g.member.size(); ++r) {
    const comm_dump* c = g.member[r];
    if (c == nullptr) {
      missing.push_back(int(r));
      continue;
    }
    const call* k = last_collective(*c);
    const call* s = stuck_call(*c);
    place p;
    if (s != nullptr && (k == nullptr || s == &c->calls.back())) {
      p.seq = s->collective_call() ? s->seq : (k != nullptr ? k->seq : 0);
      const int on = waits_on(*s) < int(g.job_ranks.size()) ? waits_on(*s) : -1;  // (a dump may be damaged)
      p.what = "in " + call_name(*s) + ", " + s->state +
               (on >= 0 ? ", waiting for rank " + std::to_string(on) + " (job rank " + std::to_string(g.job_ranks[std::size_t(on)]) + ")" : "");
      if (s->state == "failed" && !s->error.empty()) p.what += ": " + s->error.substr(0, s->error.find('\n'));
    } else if (k != nullptr) {
      p.seq = k->seq;
      p.what = "done with " + call_name(*k);
    } else {
      p.what = "has made no collective call";
    }
    auto it = std::find_if(places.begin(), places.end(), [&](const place& q) { return q.what == p.what; });
    if (it == places.end()) {
      p.ranks.push_back(int(r));
      places.push_back(std::move(p));
    } else {
      it->ranks.push_back(int(r));
    }
  }
  std::stable_sort(places.begin(), places.end(), [](const place& a, const place& b) { return a.seq < b.seq; });
  std::vector<position_line> out;
  const unsigned long long top = places.empty() ? 0 : places.back().seq;
  for (const place& p : places) {
    std::vector<int> jr;
    for (int r : p.ranks) jr.push_back(g.job_ranks[std::size_t(r)]);
    out.push_back({plural_ranks(p.ranks) + " (job " + ranks_text(jr) + ") " + (p.ranks.size() == 1 ? "is " : "are ") + p.what,
                   p.seq < top});
  }
  if (!missing.empty()) {
    std::vector<int> jr;
    for (int r : missing) jr.push_back(g.job_ranks[std::size_t(r)]);
    out.push_back({plural_ranks(missing) + " (job " + ranks_text(jr) + ") left no dump: dead, or not asked to dump", true});
  }
  return out;
}

struct mismatch {
  bool found = false;
  unsigned long long seq = 0;
  std::vector<std::string> lines;  // one per distinct call: "ranks 0-2 (job 0-2) called all_reduce(...)"
};

/// The first sequence number of g where the ranks' recorded calls differ.
inline mismatch first_mismatch(const group& g) {
  std::map<unsigned long long, std::vector<std::pair<int, const call*>>> by_seq;
  for (std::size_t r = 0; r < g.member.size(); ++r)
    if (g.member[r] != nullptr)
      for (const call& k : g.member[r]->calls)
        if (k.collective_call()) by_seq[k.seq].emplace_back(int(r), &k);
  mismatch m;
  for (const auto& [seq, calls] : by_seq) {
    bool differ = false;
    for (const auto& [r, k] : calls) differ = differ || !same_shape(*k, *calls.front().second);
    if (!differ) continue;
    m.found = true;
    m.seq = seq;
    std::vector<std::pair<const call*, std::vector<int>>> kinds;
    for (const auto& rk : calls) {
      const call* k = rk.second;
      auto it = std::find_if(kinds.begin(), kinds.end(), [k](const auto& q) { return same_shape(*q.first, *k); });
      if (it == kinds.end()) kinds.push_back({k, {rk.first}});
      else it->second.push_back(rk.first);
    }
    for (const auto& [k, ranks] : kinds) {
      std::vector<int> jr;
      for (int r : ranks) jr.push_back(g.job_ranks[std::size_t(r)]);
      m.lines.push_back(plural_ranks(ranks) + " (job " + ranks_text(jr) + ") called " + call_shape(*k));
    }
    return m;
  }
  return m;
}

/// Who waits on whom, in job ranks: each stuck call's edge, then the chains followed to the
/// ranks that wait on nobody.
struct wait_edge {
  int from_job = -1, to_job = -1;
  std::string where;  // "all_reduce #41 of tp{4,5,6,7}"
  long long waited_ns = 0;
};

inline std::vector<wait_edge> wait_edges(const job& j) {
  std::vector<wait_edge> out;
  for (const group& g : j.groups)
    for (std::size_t r = 0; r < g.member.size(); ++r) {
      const comm_dump* c = g.member[r];
      if (c == nullptr) continue;
      const call* s = stuck_call(*c);
      if (s == nullptr) continue;
      const int on = waits_on(*s);
      if (on < 0 || std::size_t(on) >= g.job_ranks.size()) continue;
      out.push_back({g.job_ranks[r], g.job_ranks[std::size_t(on)], call_name(*s) + " of " + g.label(), s->waited_ns});
    }
  return out;
}

/// Each waiting rank's chain followed to its end: "job rank 0 -> 1 -> 3 (waits on nobody: ...)".
inline std::vector<std::string> wait_chains(const job& j) {
  const auto edges = wait_edges(j);
  std::map<int, int> next;
  for (const wait_edge& e : edges) next.emplace(e.from_job, e.to_job);
  std::map<int, std::vector<int>> by_end;
  std::map<int, std::string> why;
  for (const auto& [from, to] : next) {
    std::vector<int> seen{from};
    int at = to;
    bool cycle = false;
    while (next.count(at) != 0) {
      if (std::find(seen.begin(), seen.end(), at) != seen.end()) {
        cycle = true;
        break;
      }
      seen.push_back(at);
      at = next[at];
    }
    by_end[at].push_back(from);
    if (cycle) why[at] = "a cycle of waits (a deadlock between calls that do not match)";
  }
  std::vector<std::string> out;
  for (const auto& ef : by_end) {
    const int end = ef.first;
    const std::vector<int>& from = ef.second;
    std::string w;
    if (why.count(end)) {
      w = why[end];
    } else {
      const bool has_dump = std::any_of(j.dumps.begin(), j.dumps.end(), [&](const rank_dump& d) { return d.job_rank == end; });
      w = has_dump ? "waits on nobody: it is computing, or in a call on another communicator" : "left no dump: dead, or not asked to dump";
    }
    out.push_back("job " + plural_ranks(from) + " wait(s), directly or through others, on job rank " + std::to_string(end) +
                  ", which " + w);
  }
  return out;
}

/// One rank's row of a communicator's straggler table, over the recorded window.
struct wait_row {
  int rank = 0, job_rank = 0;
  bool present = false;
  unsigned long long calls = 0;
  long long busy_ns = 0;       // in calls
  long long waited_ns = 0;     // this rank blocked, on anyone
  long long waited_on_ns = 0;  // the others blocked on this rank
  long long late_ns = 0;       // of that, what this rank's late arrival explains
  long long life_late_ns = 0;  // the same over the communicator's whole life (the cumulative table)
};

inline std::vector<wait_row> wait_rows(const group& g) {
  std::vector<wait_row> rows(g.member.size());
  for (std::size_t r = 0; r < rows.size(); ++r) {
    rows[r].rank = int(r);
    rows[r].job_rank = g.job_ranks[r];
  }
  for (std::size_t r = 0; r < g.member.size(); ++r) {
    const comm_dump* c = g.member[r];
    if (c == nullptr) continue;
    rows[r].present = true;
    for (const call& k : c->calls) {
      ++rows[r].calls;
      if (k.end_ns > k.start_ns) rows[r].busy_ns += k.end_ns - k.start_ns;
      rows[r].waited_ns += k.waited_ns;
      for (const peer_wait& p : k.peers)
        if (p.peer >= 0 && std::size_t(p.peer) < rows.size() && std::size_t(p.peer) != r) {
          rows[std::size_t(p.peer)].waited_on_ns += p.waited_ns;
          rows[std::size_t(p.peer)].late_ns += p.late_ns;
        }
    }
    for (std::size_t p = 0; p < c->life_late_ns.size() && p < rows.size(); ++p)
      if (p != r) rows[p].life_late_ns += c->life_late_ns[p];
  }
  return rows;
}

/// The rank of g its peers' waits blame, when one stands out (collx::flight::straggler's rule).
inline int straggler(const std::vector<wait_row>& rows) {
  std::vector<std::int64_t> late, busy;
  for (const wait_row& w : rows) {
    late.push_back(w.late_ns);
    if (w.present) busy.push_back(w.busy_ns);
  }
  return collx::flight::straggler(late, busy);
}

/// The whole report, as collx-trace prints it.
inline std::string report(const job& j) {
  std::string o;
  auto line = [&](const std::string& s) { o += s + "\n"; };
  std::vector<int> have;
  for (const rank_dump& d : j.dumps) have.push_back(d.job_rank);
  line("collx-trace: " + std::to_string(j.dumps.size()) + " dump(s), job ranks " + ranks_text(have) + " of " +
       std::to_string(j.world) + ", " + std::to_string(j.groups.size()) + " communicator(s)");
  for (const rank_dump& d : j.dumps)
    line("  job rank " + std::to_string(d.job_rank) + ": " + d.file + " (host " + d.host + ", pid " + std::to_string(d.pid) +
         ", " + d.reason + ")");
  std::vector<int> absent;
  for (int r = 0; r < j.world; ++r)
    if (std::find(have.begin(), have.end(), r) == have.end()) absent.push_back(r);
  if (!absent.empty()) line("  no dump from job " + plural_ranks(absent));

  line("\n== where each rank is (its last call per communicator; the ranks behind first)");
  for (const group& g : j.groups) {
    line(g.label() + ":");
    for (const position_line& p : positions(g)) line(std::string(p.behind ? "  behind: " : "  ") + p.text);
  }

  line("\n== mismatched calls (one sequence number, different calls)");
  bool any = false;
  for (const group& g : j.groups) {
    const mismatch m = first_mismatch(g);
    if (!m.found) continue;
    any = true;
    line(g.label() + ": call #" + std::to_string(m.seq) + " differs:");
    for (const std::string& s : m.lines) line("  " + s);
  }
  if (!any) line("none in the recorded window");

  line("\n== who waits on whom (the calls still running or failed)");
  const auto edges = wait_edges(j);
  if (edges.empty()) line("nobody is waiting");
  for (const wait_edge& e : edges)
    line("job rank " + std::to_string(e.from_job) + " waits on job rank " + std::to_string(e.to_job) + " in " + e.where +
         " (blocked " + duration(e.waited_ns) + ")");
  for (const std::string& s : wait_chains(j)) line("  => " + s);

  line("\n== stragglers: per communicator, per rank, over the recorded window");
  line("   (waited: this rank blocked; on it: the others blocked on this rank; late: of that, what its late arrival explains)");
  for (const group& g : j.groups) {
    const auto rows = wait_rows(g);
    const int s = straggler(rows);
    line(g.label() + (s >= 0 ? ": straggler rank " + std::to_string(s) + " (job rank " + std::to_string(g.job_ranks[std::size_t(s)]) + ")" : ": no straggler stands out"));
    char b[256];
    std::snprintf(b, sizeof b, "  %5s %8s %7s %12s %12s %12s %12s %14s", "rank", "job rank", "calls", "in calls", "waited",
                  "on it", "late", "late (life)");
    line(b);
    std::vector<wait_row> sorted = rows;
    std::stable_sort(sorted.begin(), sorted.end(), [](const wait_row& a, const wait_row& b2) { return a.late_ns > b2.late_ns; });
    for (const wait_row& w : sorted) {
      if (!w.present) {
        std::snprintf(b, sizeof b, "  %5d %8d %7s   (no dump)   %12s %12s %14s", w.rank, w.job_rank, "-", duration(w.waited_on_ns).c_str(),
                      duration(w.late_ns).c_str(), duration(w.life_late_ns).c_str());
      } else {
        std::snprintf(b, sizeof b, "  %5d %8d %7llu %12s %12s %12s %12s %14s%s", w.rank, w.job_rank, w.calls, duration(w.busy_ns).c_str(),
                      duration(w.waited_ns).c_str(), duration(w.waited_on_ns).c_str(), duration(w.late_ns).c_str(),
                      duration(w.life_late_ns).c_str(), w.rank == s ? "  <- straggler" : "");
      }
      line(b);
    }
  }
  return o;
}

}  // namespace collx_trace
