#pragma once
// The Megatron-LM MLP block, split over a tensor-parallel group of t ranks, three ways
// (tensor_parallel.cpp, sequence_parallel.cpp):
//
//   X_{l+1} = X_l + GeLU(X_l A + a) B + b        A: h x f, B: f x h, f = 4h
//
// - tp: A is split by columns and B by rows (rank i: A_i, a_i, B_i; b whole). Each rank computes
//   Z_i = GeLU(X A_i + a_i) and its part Z_i B_i of the output; one all_reduce sums the parts
//   (Megatron's g). In backward the gradient at X is a sum of the ranks' parts: one all_reduce
//   (Megatron's f). Two all_reduces of s x h per block and step.
// - tp-gather: the column-parallel output Z is all-gathered (s x f) and every rank multiplies by
//   the whole B; backward needs the all_reduce at X still. The gather moves f/h = 4 times the
//   data of one all_reduce's half.
// - sp: the activations outside the split (the residual stream X) are split along the sequence
//   instead of replicated: rank i holds s/t of the rows. The block all-gathers X before A
//   (Megatron-SP's g) and reduce-scatters after B (its g-bar); backward does the reverse: an
//   all_gather of the output's gradient, a reduce_scatter of the input's. These four move the
//   bytes of tp's two all_reduces (an all_reduce is a reduce-scatter then an all-gather), and the
//   replicated s x h activations drop to s/t x h per rank. On top of them, the input X is
//   all-gathered once more in backward (for A's gradient) rather than kept whole, as Megatron-SP
//   does, and the bias b, applied to the rank's rows only, has its gradient summed over the
//   group (an all_reduce of h).
#include "common.hpp"

namespace strategies::megatron {

using S = double;
using M = mat<S>;
using ring = collx::algo::ring;  // every call: the volumes below are the ring's

enum class mode { tp, tp_gather, sp };
inline const char* name(mode m) { return m == mode::tp ? "tp" : m == mode::tp_gather ? "tp-gather" : "sp"; }

inline double gelu(double x) { return 0.5 * x * (1 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))); }
inline double gelu_d(double x) {
  const double k = 0.7978845608028654, u = k * (x + 0.044715 * x * x * x), th = std::tanh(u);
  return 0.5 * (1 + th) + 0.5 * x * (1 - th * th) * k * (1 + 3 * 0.044715 * x * x);
}

struct shape {
  int h = 48, f = 192, layers = 3;
  int tokens_per_rank = 8;  // s = t x this, so the sequence splits evenly
  double lr = 0.05;
};

/// One block's parameters; on a rank, its columns [c0, c0 + fc) of A and a, the same rows of B.
struct block {
  M A, B;      // h x fc, fc x h
  vec<S> a, b;  // fc, h
};

/// A block's initial parameters (uniform, scaled by 1/sqrt(fan-in)), the same on every rank:
/// columns c0 .. c0 + fc of A and a, those rows of B, and b.
inline block init_block(const shape& sh, int l, int c0, int fc) {
  block k;
  k.A.resize(sh.h, fc);
  k.B.resize(fc, sh.h);
  k.a.resize(fc);
  k.b.resize(sh.h);
  for (int i = 0; i < sh.h; ++i)
    for (int j = 0; j < fc; ++j) k.A(i, j) = hashed(l, 0, i, c0 + j) / std::sqrt(double(sh.h));
  for (int j = 0; j < fc; ++j) {
    k.a(j) = 0.1 * hashed(l, 1, 0, c0 + j);
    for (int i = 0; i < sh.h; ++i) k.B(j, i) = hashed(l, 2, c0 + j, i) / std::sqrt(double(sh.f));
  }
  for (int i = 0; i < sh.h; ++i) k.b(i) = 0.1 * hashed(l, 3, 0, i);
  return k;
}

/// What a run of one mode leaves: its blocks' parameters (its shard), the loss per step, the
/// activation bytes it kept for backward per block, and the ledger of its last step.
struct outcome {
  std::vector<block> blocks;
  std::vector<double> losses;
  std::uint64_t activation_bytes = 0;  // per block
  ledger led;
};

/// A block's gradients, and the activations its backward needs.
struct grads {
  M A, B;
  vec<S> a, b;
};
struct saved {
  M X, U, Z;
};

/// Block k forward in the tp split: X + GeLU(X A_i + a_i) B_i summed over the group (an
/// all_reduce over tp, Megatron's g; nullptr: one process holding all of A and B) + b.
inline M tp_forward(comm_t* tp, ledger& led, const block& k, const M& X, saved& sv) {
  sv.X = X;
  sv.U = X * k.A;
  sv.U.rowwise() += k.a.transpose();
  sv.Z = sv.U.unaryExpr([](double x) { return gelu(x); });
  M Y = sv.Z * k.B;
  if (tp != nullptr)
    timed(led, *tp, "all_reduce Y (g)", std::uint64_t(Y.size()), sizeof(S),
          [&] { collx::all_reduce(*tp, std::span<S>(Y.data(), std::size_t(Y.size())), collx::ops::sum{}, ring{}); });
  Y.rowwise() += k.b.transpose();
  return X + Y;
}
/// Its backward: from d, the gradient at its output, the block's gradients into g and the
/// gradient at its input returned (the ranks' parts of it summed over tp: Megatron's f).
inline M tp_backward(comm_t* tp, ledger& led, const block& k, const saved& sv, const M& d, grads& g) {
  g.b = d.colwise().sum().transpose();
  const M dZ = d * k.B.transpose();
  g.B = sv.Z.transpose() * d;
  const M dU = dZ.cwiseProduct(sv.U.unaryExpr([](double x) { return gelu_d(x); }));
  g.A = sv.X.transpose() * dU;
  g.a = dU.colwise().sum().transpose();
  M dX = dU * k.A.transpose();
  if (tp != nullptr)
    timed(led, *tp, "all_reduce dX (f)", std::uint64_t(dX.size()), sizeof(S),
          [&] { collx::all_reduce(*tp, std::span<S>(dX.data(), std::size_t(dX.size())), collx::ops::sum{}, ring{}); });
  return d + dX;
}
inline void sgd(block& k, const grads& g, double lr) {
  k.A -= lr * g.A;
  k.B -= lr * g.B;
  k.a -= lr * g.a;
  k.b -= lr * g.b;
}

/// The same training on one process: all of A, B; all `s` tokens of each step from token
/// `step * s` on.
inline std::vector<block> one_process(const shape& sh, int s, int steps) {
  std::vector<block> bl;
  for (int l = 0; l < sh.layers; ++l) bl.push_back(init_block(sh, l, 0, sh.f));
  for (int step = 0; step < steps; ++step) {
    std::vector<saved> sv(sh.layers);
    ledger none;
    M X = inputs<S>(std::size_t(step) * s, s, sh.h);
    const M T = targets<S>(X, sh.h);
    for (int l = 0; l < sh.layers; ++l) X = tp_forward(nullptr, none, bl[l], X, sv[l]);
    M d;
    loss_grad<S>(X, T, std::size_t(s), d);
    for (int l = sh.layers; l-- > 0;) {
      grads g;
      d = tp_backward(nullptr, none, bl[l], sv[l], d, g);
      sgd(bl[l], g, sh.lr);
    }
  }
  return bl;
}

/// Trains `steps` steps in mode md over tp (the tensor-parallel group).
inline outcome train(comm_t& tp, const shape& sh, mode md, int steps) {
  const int t = tp.size(), r = tp.rank(), h = sh.h;
  const int s = sh.tokens_per_rank * t, sr = sh.tokens_per_rank;  // all tokens; this rank's (sp)
  const collx::partition cols(std::size_t(sh.f), t);
  const int c0 = int(cols.offset(r)), fc = int(cols.count(r)), fmax = int(cols.max_count());
  outcome o;
  o.led.group = "tp";
  for (int l = 0; l < sh.layers; ++l) o.blocks.push_back(init_block(sh, l, c0, fc));
  // tp-gather multiplies by the whole B: every rank holds it (and updates it identically).
  std::vector<M> Bfull;
  if (md == mode::tp_gather)
    for (int l = 0; l < sh.layers; ++l) Bfull.push_back(init_block(sh, l, 0, sh.f).B);
  ledger& led = o.led;
  auto ar = [&](M& x, const char* kind) {
    timed(led, tp, kind, std::uint64_t(x.size()), sizeof(S), [&] { collx::all_reduce(tp, std::span<S>(x.data(), x.size()), collx::ops::sum{}, ring{}); });
  };
  auto ag_rows = [&](const M& part, M& whole, const char* kind) {  // along the sequence: rows
    whole.resize(part.rows() * t, part.cols());
    timed(led, tp, kind, std::uint64_t(whole.size()), sizeof(S), [&] {
      collx::all_gather(tp, std::span<const S>(part.data(), part.size()), std::span<S>(whole.data(), whole.size()), ring{});
    });
  };
  auto rs_rows = [&](const M& whole, M& part, const char* kind) {
    part.resize(whole.rows() / t, whole.cols());
    timed(led, tp, kind, std::uint64_t(whole.size()), sizeof(S), [&] {
      collx::reduce_scatter(tp, std::span<const S>(whole.data(), whole.size()), std::span<S>(part.data(), part.size()),
                            collx::ops::sum{}, ring{});
    });
  };
  for (int step = 0; step < steps; ++step) {
    led.start(tp);
    if (md == mode::tp) {  // the block code one process runs too (tp_forward, tp_backward)
      M X = inputs<S>(std::size_t(step) * s, s, h);
      const M T = targets<S>(X, h);
      std::vector<saved> sv(sh.layers);
      std::uint64_t kept = 0;
      for (int l = 0; l < sh.layers; ++l) {
        X = tp_forward(&tp, led, o.blocks[l], X, sv[l]);
        kept += std::uint64_t(sv[l].X.size() + sv[l].U.size() + sv[l].Z.size()) * sizeof(S);
      }
      o.activation_bytes = kept / std::uint64_t(sh.layers);
      M d;
      o.losses.push_back(loss_grad<S>(X, T, std::size_t(s), d));
      for (int l = sh.layers; l-- > 0;) {
        grads g;
        d = tp_backward(&tp, led, o.blocks[l], sv[l], d, g);
        sgd(o.blocks[l], g, sh.lr);
      }
      led.stop(tp);
      continue;
    }
    // tp-gather and sp
    std::vector<M> X(sh.layers + 1), U(sh.layers), Z(sh.layers), Zall(sh.layers);
    const M X0 = inputs<S>(std::size_t(step) * s, s, h), T0 = targets<S>(X0, h);
    // sp: this rank's rows of the sequence
    X[0] = md == mode::sp ? M(X0.middleRows(std::ptrdiff_t(r) * sr, sr)) : X0;
    const M T = md == mode::sp ? M(T0.middleRows(std::ptrdiff_t(r) * sr, sr)) : T0;
    std::uint64_t kept = 0;
    for (int l = 0; l < sh.layers; ++l) {
      block& k = o.blocks[l];
      M Xin;
      if (md == mode::sp) ag_rows(X[l], Xin, "all_gather X (g)");
      const M& Xw = md == mode::sp ? Xin : X[l];
      U[l] = Xw * k.A;
      U[l].rowwise() += k.a.transpose();
      Z[l] = U[l].unaryExpr([](double x) { return gelu(x); });
      M Y;
      if (md == mode::tp_gather) {
        // Z's column blocks, each padded to fmax columns, gathered: t blocks of s x fmax.
        M Zp = M::Zero(s, fmax);
        Zp.leftCols(fc) = Z[l];
        Zall[l].resize(std::ptrdiff_t(s) * t, fmax);
        timed(led, tp, "all_gather Z", std::uint64_t(Zall[l].size()), sizeof(S), [&] {
          collx::all_gather(tp, std::span<const S>(Zp.data(), Zp.size()), std::span<S>(Zall[l].data(), Zall[l].size()), ring{});
        });
        Y = M::Zero(s, h);
        for (int i = 0; i < t; ++i)
          Y += Zall[l].middleRows(std::ptrdiff_t(i) * s, s).leftCols(int(cols.count(i))) *
               Bfull[l].middleRows(std::ptrdiff_t(cols.offset(i)), int(cols.count(i)));
      } else {
        M mine;  // this rank's rows of the sum of the ranks' parts
        rs_rows(M(Z[l] * k.B), mine, "reduce_scatter Y (g-bar)");
        Y = mine;
      }
      Y.rowwise() += k.b.transpose();
      X[l + 1] = X[l] + Y;
      kept += std::uint64_t(X[l].size() + U[l].size() + Z[l].size() + Zall[l].size()) * sizeof(S);
    }
    o.activation_bytes = kept / std::uint64_t(sh.layers);
    M d;
    double loss = loss_grad<S>(X.back(), T, std::size_t(s), d);
    for (int l = sh.layers; l-- > 0;) {
      block& k = o.blocks[l];
      // d: the gradient at X[l+1] (all rows, or this rank's in sp)
      vec<S> gb = d.colwise().sum().transpose();
      M dfull;  // the output's gradient over all s rows
      if (md == mode::sp) {
        timed(led, tp, "all_reduce grad b", std::uint64_t(gb.size()), sizeof(S),
              [&] { collx::all_reduce(tp, std::span<S>(gb.data(), gb.size()), collx::ops::sum{}, ring{}); });
        ag_rows(d, dfull, "all_gather dY (g-bar')");
      } else {
        dfull = d;
      }
      M dZ, gB;
      if (md == mode::tp_gather) {
        const M dZall = dfull * Bfull[l].transpose();  // s x f: every rank has all of it
        dZ = dZall.middleCols(c0, fc);
        M gBf = M::Zero(sh.f, h);
        for (int i = 0; i < t; ++i)
          gBf.middleRows(std::ptrdiff_t(cols.offset(i)), int(cols.count(i))) =
              Zall[l].middleRows(std::ptrdiff_t(i) * s, s).leftCols(int(cols.count(i))).transpose() * dfull;
        Bfull[l] -= sh.lr * gBf;
        gB = gBf.middleRows(c0, fc);
      } else {
        dZ = dfull * k.B.transpose();
        gB = Z[l].transpose() * dfull;
      }
      const M dU = dZ.cwiseProduct(U[l].unaryExpr([](double x) { return gelu_d(x); }));
      M Xin;
      if (md == mode::sp) ag_rows(X[l], Xin, "all_gather X again (bwd)");
      const M& Xw = md == mode::sp ? Xin : X[l];
      const M gA = Xw.transpose() * dU;
      const vec<S> ga = dU.colwise().sum().transpose();
      M dX = dU * k.A.transpose();  // this rank's part of the gradient at X (all rows)
      if (md == mode::sp) {
        M mine;
        rs_rows(dX, mine, "reduce_scatter dX (g')");
        dX = mine;
      } else {
        ar(dX, "all_reduce dX (f)");
      }
      d = (d + dX).eval();
      sgd(k, grads{gA, gB, ga, gb}, sh.lr);
    }
    led.stop(tp);
    if (md == mode::sp) collx::all_reduce(tp, std::span<double>(&loss, 1), collx::ops::sum{});
    o.losses.push_back(loss);
  }
  return o;
}

/// Adds a rank's shard of a block (its columns c0 .. c0 + fc) against the whole block of the
/// one-process run to m.
inline void compare_block(match& m, const block& a, const block& b, int c0, int fc) {
  const int h = int(b.A.rows());
  for (int i = 0; i < h; ++i)
    for (int j = 0; j < fc; ++j) m.add(a.A(i, j), b.A(i, c0 + j));
  for (int j = 0; j < fc; ++j) {
    m.add(a.a(j), b.a(c0 + j));
    for (int i = 0; i < h; ++i) m.add(a.B(j, i), b.B(c0 + j, i));
  }
  for (int i = 0; i < h; ++i) m.add(a.b(i), b.b(i));
}

/// Compares rank r's shard of the blocks with the one-process run's.
inline match compare(const outcome& o, const std::vector<block>& ref, const shape& sh, int t, int r) {
  const collx::partition cols(std::size_t(sh.f), t);
  match m;
  for (std::size_t l = 0; l < ref.size(); ++l) compare_block(m, o.blocks[l], ref[l], int(cols.offset(r)), int(cols.count(r)));
  return m;
}

/// The block's shape from the command line: --hidden H (f = 4H), --layers L, --tokens-per-rank K.
inline shape shape_of(const cli& c) {
  shape sh;
  sh.h = c.get("hidden", 48);
  sh.f = 4 * sh.h;
  sh.layers = c.get("layers", 3);
  sh.tokens_per_rank = c.get("tokens-per-rank", 8);
  return sh;
}

/// The tolerance: each sum (the f-long inner products, split in t parts, the s-long sums over
/// tokens) is taken in another order than on one process: gamma_(s + f) ~ (s + f) u per step and
/// block, with a factor 8 for how it carries on.
inline double tolerance(const shape& sh, int t, int steps) {
  return order_tolerance(double(sh.tokens_per_rank * t + sh.f), double(steps) * sh.layers);
}

/// Megatron's count: per block and step, tp makes 2 all_reduces of s x h (one forward, one
/// backward). Checks the ledger's calls and elements against it and prints the block's table.
inline void print_and_check(const outcome& o, const shape& sh, mode md, int t, bool print) {
  const std::uint64_t s = std::uint64_t(sh.tokens_per_rank) * t, sh_ = s * std::uint64_t(sh.h), L = std::uint64_t(sh.layers);
  const collx::partition cols(std::size_t(sh.f), t);
  struct want {
    const char* kind;
    std::uint64_t calls, elems;
  };
  std::vector<want> w;
  if (md == mode::tp) w = {{"all_reduce Y (g)", L, L * sh_}, {"all_reduce dX (f)", L, L * sh_}};
  else if (md == mode::tp_gather)
    w = {{"all_gather Z", L, L * s * std::uint64_t(cols.max_count()) * std::uint64_t(t)}, {"all_reduce dX (f)", L, L * sh_}};
  else
    w = {{"all_gather X (g)", L, L * sh_},          {"reduce_scatter Y (g-bar)", L, L * sh_},
         {"all_gather dY (g-bar')", L, L * sh_},    {"reduce_scatter dX (g')", L, L * sh_},
         {"all_gather X again (bwd)", L, L * sh_}, {"all_reduce grad b", L, L * std::uint64_t(sh.h)}};
  if (print) {
    std::printf("  %s, the last step's collectives (per rank; elems: the whole buffer each call moves):\n", name(md));
    o.led.print();
  }
  for (const want& x : w) {
    auto it = o.led.rows.find(x.kind);
    if (it == o.led.rows.end() || it->second.calls != x.calls || it->second.elems != x.elems)
      throw std::runtime_error(std::string(name(md)) + ": " + x.kind + ": expected " + std::to_string(x.calls) + " calls of " +
                               std::to_string(x.elems) + " elements in all");
  }
  if (o.led.rows.size() != w.size()) throw std::runtime_error(std::string(name(md)) + ": collectives other than Megatron's");
  // The bytes sent, from the ring's volumes: an all_reduce of n elements sends 2 (t-1)/t n, an
  // all_gather or reduce_scatter whose whole buffer is n, (t-1)/t n (a block short of even for
  // the bias's h: a slack of a block per call).
  double want_sent = 0;
  for (const want& x : w) want_sent += (std::string(x.kind).rfind("all_reduce", 0) == 0 ? 2.0 : 1.0) * double(t - 1) / t * double(x.elems) * sizeof(S);
  const double slack = md == mode::sp ? 2.0 * double(L) * double(sh.h / t + 1) * sizeof(S) : 0.5;
  if (print) std::printf("    bytes sent by this rank: ring formula %s, measured %s\n", ledger::human(want_sent).c_str(), ledger::human(double(o.led.sent)).c_str());
  ledger::expect(double(o.led.sent), want_sent, slack, name(md));
}

}  // namespace strategies::megatron
