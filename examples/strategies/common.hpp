#pragma once
// What the strategy programs share (examples/strategies/*.cpp):
// - the command line: -np N, --transport threads|shm|tcp, --steps S, and each program's own;
// - the launch: N ranks over the chosen transport, each wrapped in transport::counting so the
//   bytes every rank sends are measured, not inferred;
// - a per-group ledger of the collectives a step makes (kind, calls, elements, bytes, time) and the
//   bytes the transport moved for it, printed for rank 0's groups;
// - the model: a stack of linear layers with tanh between them and a mean-squared-error loss, on
//   synthetic data that any rank can generate for any sample (so each rank can also run the whole
//   model on one process and compare);
// - the comparison with that single-process run: the largest difference, and the tolerance.
#include <collx/collx.hpp>

#include <Eigen/Dense>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <numeric>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace strategies {

// ---- command line ---------------------------------------------------------------------------

struct cli {
  int np = 4;
  std::string transport = "threads";
  int steps = 3;
  std::map<std::string, std::string> extra;  // --name value, or --name (then "1")

  int get(const std::string& k, int dflt) const {
    auto it = extra.find(k);
    return it == extra.end() ? dflt : std::atoi(it->second.c_str());
  }
  double getf(const std::string& k, double dflt) const {
    auto it = extra.find(k);
    return it == extra.end() ? dflt : std::atof(it->second.c_str());
  }
  std::string gets(const std::string& k, const std::string& dflt) const {
    auto it = extra.find(k);
    return it == extra.end() ? dflt : it->second;
  }
  bool has(const std::string& k) const { return extra.count(k) != 0; }
};

/// Parses the common flags and `known` (the program's own: name -> takes a value).
inline cli parse(int argc, char** argv, const std::map<std::string, bool>& known, const char* usage) {
  cli c;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s: %s needs a value\nusage: %s\n", argv[0], a.c_str(), usage);
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "-np" || a == "--np") c.np = std::atoi(value().c_str());
    else if (a == "--transport") c.transport = value();
    else if (a == "--steps") c.steps = std::atoi(value().c_str());
    else if (a.rfind("--", 0) == 0 && known.count(a.substr(2))) {
      const std::string k = a.substr(2);
      c.extra[k] = known.at(k) ? value() : "1";
    } else {
      std::fprintf(stderr, "%s: unknown argument %s\nusage: %s\n", argv[0], a.c_str(), usage);
      std::exit(2);
    }
  }
  if (c.np < 1 || (c.transport != "threads" && c.transport != "shm" && c.transport != "tcp")) {
    std::fprintf(stderr, "usage: %s\n", usage);
    std::exit(2);
  }
  return c;
}

/// Every rank's transport: the chosen one behind transport::any (so each program instantiates
/// its collectives once, not once per transport), counted.
template <class T>
using counted = collx::transport::counting<collx::transport::any>;
using comm_t = collx::communicator<counted<void>>;

/// Runs body(comm) on c.np ranks over the chosen transport. Over shm and tcp the ranks are
/// processes: each prints its own lines (the programs print from rank 0) and a rank that throws
/// fails the job. Returns the exit status. (common.cpp: the transports are compiled once.)
int launch(const cli& c, const std::function<void(comm_t&)>& body);

// ---- the ledger -------------------------------------------------------------------------------

using clk = std::chrono::steady_clock;

/// The collectives one group makes in a step: per kind, calls, elements and payload bytes (what
/// the call was asked to move), the time this rank spent in them (or waiting for them), and the
/// bytes the group's transport sent for them (transport::counting).
struct ledger {
  struct row {
    std::uint64_t calls = 0, elems = 0, bytes = 0;
    double seconds = 0;
    std::uint64_t sent = 0;  // measured: what the transport sent during these calls (blocking ones)
  };
  std::string group;
  std::map<std::string, row> rows;
  std::uint64_t sent_at_start = 0, sent = 0;

  template <class C>
  void start(const C& comm) {
    rows.clear();
    sent = 0;
    sent_at_start = comm.transport().counts().bytes_sent;
  }
  template <class C>
  void stop(const C& comm) {
    sent = comm.transport().counts().bytes_sent - sent_at_start;
  }
  void add(const std::string& kind, std::uint64_t elems, std::size_t elem_size, double seconds = 0) {
    row& r = rows[kind];
    ++r.calls;
    r.elems += elems;
    r.bytes += elems * elem_size;
    r.seconds += seconds;
  }
  void add_time(const std::string& kind, double seconds) { rows[kind].seconds += seconds; }
  /// The measured bytes of the calls of one kind.
  std::uint64_t sent_by(const std::string& kind) const {
    auto it = rows.find(kind);
    return it == rows.end() ? 0 : it->second.sent;
  }
  /// Throws unless `got` (measured) is `want` (a formula) within `slack` bytes.
  static void expect(double got, double want, double slack, const std::string& what) {
    if (std::abs(got - want) > slack)
      throw std::runtime_error(what + ": sent " + std::to_string(got) + " B, the formula says " + std::to_string(want) + " B");
  }
  double seconds() const {
    double t = 0;
    for (auto& [k, r] : rows) t += r.seconds;
    return t;
  }
  std::uint64_t total_bytes() const {
    std::uint64_t b = 0;
    for (auto& [k, r] : rows) b += r.bytes;
    return b;
  }

  void print() const {
    for (auto& [k, r] : rows)
      std::printf("    %-6s %-28s %4llu calls %10llu elems %11s  %8.3f ms%s\n", group.c_str(), k.c_str(),
                  (unsigned long long)r.calls, (unsigned long long)r.elems, human(double(r.bytes)).c_str(), r.seconds * 1e3,
                  r.sent ? ("  sent " + human(double(r.sent))).c_str() : "");
    std::printf("    %-6s %-28s %49s sent by this rank (measured)\n", group.c_str(), "", human(double(sent)).c_str());
  }
  static std::string human(double b) {
    char s[32];
    if (b >= 1 << 20) std::snprintf(s, sizeof s, "%.2f MiB", b / (1 << 20));
    else if (b >= 1 << 10) std::snprintf(s, sizeof s, "%.2f KiB", b / (1 << 10));
    else std::snprintf(s, sizeof s, "%.0f B", b);
    return s;
  }
};

/// Times f() and records it in `l` as one call of `kind` moving `elems` of `elem_size` bytes.
template <class F>
void timed(ledger& l, const std::string& kind, std::uint64_t elems, std::size_t elem_size, F&& f) {
  const auto t0 = clk::now();
  f();
  l.add(kind, elems, elem_size, std::chrono::duration<double>(clk::now() - t0).count());
}
/// The same, over `comm`: also what its transport sent during the call (a blocking one).
template <class C, class F>
void timed(ledger& l, C& comm, const std::string& kind, std::uint64_t elems, std::size_t elem_size, F&& f) {
  const std::uint64_t before = comm.transport().counts().bytes_sent;
  timed(l, kind, elems, elem_size, std::forward<F>(f));
  l.rows[kind].sent += comm.transport().counts().bytes_sent - before;
}
/// Times f() (a wait) and adds it to `kind`'s time.
template <class F>
void waited(ledger& l, const std::string& kind, F&& f) {
  const auto t0 = clk::now();
  f();
  l.add_time(kind, std::chrono::duration<double>(clk::now() - t0).count());
}

// ---- the model --------------------------------------------------------------------------------

template <class S>
using mat = Eigen::Matrix<S, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class S>
using vec = Eigen::Matrix<S, Eigen::Dynamic, 1>;

/// A stack of linear layers, dims[0] -> dims[1] -> ... -> dims[L]; tanh after each but the last.
/// Layer l's parameters are W_l (dims[l+1] x dims[l], row-major) then b_l (dims[l+1]), one flat
/// block per layer; the model's parameters are the layers' blocks in order.
struct mlp {
  std::vector<int> dims;
  int layers() const { return int(dims.size()) - 1; }
  std::size_t layer_size(int l) const { return std::size_t(dims[l + 1]) * dims[l] + dims[l + 1]; }
  std::size_t offset(int l) const {
    std::size_t o = 0;
    for (int k = 0; k < l; ++k) o += layer_size(k);
    return o;
  }
  std::size_t size() const { return offset(layers()); }

  /// Layer l forward: out = act(in W^T + b).
  template <class S>
  void forward(int l, const S* p, const mat<S>& in, mat<S>& out) const {
    const int o = dims[l + 1], i = dims[l];
    Eigen::Map<const mat<S>> W(p, o, i);
    Eigen::Map<const vec<S>> b(p + std::size_t(o) * i, o);
    out = in * W.transpose();
    out.rowwise() += b.transpose();
    if (l + 1 < layers()) out = out.array().tanh();
  }
  /// Layer l backward: from d_out (the gradient at its output) and its input and output, the
  /// gradient of its parameters into g (overwritten) and the gradient at its input into d_in.
  template <class S>
  void backward(int l, const S* p, const mat<S>& in, const mat<S>& out, const mat<S>& d_out, S* g, mat<S>& d_in) const {
    const int o = dims[l + 1], i = dims[l];
    mat<S> dA = d_out;
    if (l + 1 < layers()) dA = (d_out.array() * (S(1) - out.array().square())).matrix();
    Eigen::Map<const mat<S>> W(p, o, i);
    Eigen::Map<mat<S>> gW(g, o, i);
    Eigen::Map<vec<S>> gb(g + std::size_t(o) * i, o);
    gW.noalias() = dA.transpose() * in;
    gb = dA.colwise().sum().transpose();
    d_in.noalias() = dA * W;
  }
};

/// A deterministic value in [-1, 1) for (l, which, i, j): the same on every rank.
inline double hashed(int l, int which, int i, int j) {
  std::uint64_t x = (std::uint64_t(l) << 48) ^ (std::uint64_t(which) << 40) ^ (std::uint64_t(i) << 20) ^ std::uint64_t(j);
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  x ^= x >> 31;
  return double(x >> 11) * 0x1.0p-52 - 1.0;
}

/// Initial parameters: deterministic, scaled by 1/sqrt(fan-in).
inline std::vector<double> init_params(const mlp& m) {
  std::vector<double> p(m.size());
  for (int l = 0; l < m.layers(); ++l) {
    const std::size_t o = m.offset(l), n = m.layer_size(l);
    const double s = 1.0 / std::sqrt(double(m.dims[l]));
    for (std::size_t k = 0; k < n; ++k) p[o + k] = s * std::sin(0.7 * double(o + k) + 0.3);
  }
  return p;
}

/// Synthetic data: sample i's input and target, the same on every rank.
template <class S>
mat<S> inputs(std::size_t first, std::size_t rows, int d) {
  mat<S> x(rows, d);
  for (std::size_t r = 0; r < rows; ++r)
    for (int j = 0; j < d; ++j) x(r, j) = S(std::sin(0.37 * double(first + r + 1) * double(j + 1) + 0.11 * double(j)));
  return x;
}
template <class S>
mat<S> targets(const mat<S>& x, int d_out) {
  mat<S> t(x.rows(), d_out);
  for (Eigen::Index r = 0; r < x.rows(); ++r)
    for (int j = 0; j < d_out; ++j) {
      double s = 0;
      for (Eigen::Index k = 0; k < x.cols(); ++k) s += double(x(r, k)) * std::cos(0.5 * double(j + 1) * double(k + 1));
      t(r, j) = S(std::tanh(s / std::sqrt(double(x.cols()))));
    }
  return t;
}

/// Loss 1/(2B) sum ||y - t||^2 over a batch of `global` samples, of which these rows are some:
/// the gradient at the output, and this part's share of the loss.
template <class S>
double loss_grad(const mat<S>& y, const mat<S>& t, std::size_t global, mat<S>& dy) {
  dy = (y - t) / S(global);
  return double((y - t).squaredNorm()) / (2.0 * double(global));
}

/// The same SGD training on one process: `steps` steps of the whole batch of `global` samples
/// (step k's samples from k * global on) through the whole model; returns the parameters.
inline std::vector<double> one_process_sgd(const mlp& m, int steps, std::size_t global, double lr) {
  std::vector<double> p = init_params(m), g(m.size());
  for (int step = 0; step < steps; ++step) {
    std::vector<mat<double>> h(m.layers() + 1);
    h[0] = inputs<double>(std::size_t(step) * global, global, m.dims[0]);
    for (int l = 0; l < m.layers(); ++l) m.forward(l, p.data() + m.offset(l), h[l], h[l + 1]);
    mat<double> dy, dx;
    loss_grad<double>(h.back(), targets<double>(h[0], m.dims.back()), global, dy);
    for (int l = m.layers(); l-- > 0;) {
      m.backward(l, p.data() + m.offset(l), h[l], h[l + 1], dy, g.data() + m.offset(l), dx);
      dy.swap(dx);
    }
    for (std::size_t k = 0; k < p.size(); ++k) p[k] -= lr * g[k];
  }
  return p;
}

/// The tolerance of a result that differs from one process only in the order of its sums: each
/// sum of n terms is off by at most gamma_n ~ n u relative to the sum of its terms' magnitudes
/// (Higham), u = 2^-53 in fp64; `sums` such sums in a row (steps x layers), with a factor 8 for
/// how one step's difference carries into the next.
inline double order_tolerance(double n, double sums) { return 8.0 * sums * n * std::ldexp(1.0, -53); }

// ---- the check --------------------------------------------------------------------------------

/// The largest difference between a distributed result and the single-process one, relative to
/// the largest magnitude of the reference, against a tolerance.
struct match {
  double diff = 0, scale = 0, tol = 0;
  void add(double got, double want) {
    // A run that diverged (inf, NaN) is a mismatch, not a difference that max() would drop.
    diff = std::isfinite(got) && std::isfinite(want) ? std::max(diff, std::abs(got - want)) : INFINITY;
    scale = std::max(scale, std::abs(want));
  }
  double rel() const { return scale == 0 || !std::isfinite(diff) ? diff : diff / scale; }
  bool ok() const { return rel() <= tol; }
};

/// Prints the check on rank 0 and throws on every rank if it failed (the launch then fails).
void report(comm_t& comm, match m, const std::string& what, const std::string& why);

/// Bytes of each kind of state a rank holds (the memory tables).
struct memory {
  std::map<std::string, std::uint64_t> bytes;
  void add(const std::string& k, std::uint64_t b) { bytes[k] += b; }
  std::uint64_t total() const {
    std::uint64_t t = 0;
    for (auto& [k, b] : bytes) t += b;
    return t;
  }
};

}  // namespace strategies
