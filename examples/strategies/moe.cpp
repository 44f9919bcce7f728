// moe: expert parallelism. A mixture-of-experts layer whose experts live on different ranks.
//
//   out = x + sum over the token's top-k experts e of  p_e(x) * expert_e(x)
//   p = softmax(x Wr)   (the router, replicated on every rank; the gates are these
//                        probabilities, not renormalized over the k chosen as GShard's top-2 is)
//   expert_e(x) = tanh(x W1_e) W2_e   (expert e lives on rank e / experts-per-rank)
//
// Each rank routes its own T tokens. An expert takes at most C = ceil(cf * k * T / E) of a rank's
// tokens (the capacity, cf the capacity factor); the choices beyond it are dropped (the token
// passes through the residual only), first choices before second ones. The tokens travel to
// their experts and back by all_to_all_v, whose counts come from the router: first an all_to_all
// of the counts, then the rows. Backward sends the gradients the same two ways, and the router's
// gradient is all_reduced (it is replicated, like a data-parallel weight).
//
//   moe [-np N] [--transport threads|shm|tcp] [--steps S] [--top-k 1|2] [--capacity-factor CF]
//       [--experts-per-rank E] [--tokens T] [--hidden H] [--skew B]
//
// Prints the group, per step the dispatch and combine (calls, bytes), the tokens dropped and the
// padding a fixed-capacity all_to_all would have sent, the load per expert and per rank (max /
// mean), whether the run matches one process, and then a skewed router (--skew: a bias towards
// rank 0's experts) at capacity factors 1 to 4: rank 0 congested, and what a larger capacity costs.
#include "common.hpp"

namespace {

using namespace strategies;
using S = double;
using M = mat<S>;

struct config {
  int n = 1, epr = 2, k = 2, tokens = 32, h = 16, f = 32;
  double cf = 1.25, lr = 0.1, skew = 0;
  int experts() const { return n * epr; }
  int capacity() const { return int(std::ceil(cf * k * tokens / double(experts()))); }
};

struct params {
  M Wr;                // h x E, every rank
  std::vector<M> W1, W2;  // this rank's experts (or all of them on one process)
};

params init(const config& c, int first_expert, int count) {
  params p;
  p.Wr.resize(c.h, c.experts());
  for (int i = 0; i < c.h; ++i)
    for (int e = 0; e < c.experts(); ++e) p.Wr(i, e) = hashed(0, 0, i, e) / std::sqrt(double(c.h));
  for (int e = first_expert; e < first_expert + count; ++e) {
    M a(c.h, c.f), b(c.f, c.h);
    for (int i = 0; i < c.h; ++i)
      for (int j = 0; j < c.f; ++j) a(i, j) = hashed(1 + e, 1, i, j) / std::sqrt(double(c.h));
    for (int j = 0; j < c.f; ++j)
      for (int i = 0; i < c.h; ++i) b(j, i) = hashed(1 + e, 2, j, i) / std::sqrt(double(c.f));
    p.W1.push_back(a);
    p.W2.push_back(b);
  }
  return p;
}

/// One rank's routing of its tokens: for each expert, the (token, choice) pairs it keeps, in
/// order; the gate of each; and what was routed before the capacity cut.
struct routing {
  M P;                                              // T x E: the router's probabilities
  std::vector<std::vector<std::pair<int, int>>> kept;  // per expert: (token, j-th choice)
  std::vector<std::vector<int>> choice;             // per token: its k experts
  std::vector<int> routed;                          // per expert, before the cut
  std::uint64_t dropped = 0;
};

routing route(const config& c, const M& X, const M& Wr, double skew, int skew_experts) {
  routing r;
  const int E = c.experts(), T = int(X.rows());
  M logits = X * Wr;
  for (int e = 0; e < skew_experts; ++e) logits.col(e).array() += skew;
  r.P.resize(T, E);
  for (int i = 0; i < T; ++i) {
    const double mx = logits.row(i).maxCoeff();
    r.P.row(i) = (logits.row(i).array() - mx).exp().matrix();
    r.P.row(i) /= r.P.row(i).sum();
  }
  r.choice.assign(T, {});
  for (int i = 0; i < T; ++i) {
    std::vector<int> order(E);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return r.P(i, a) > r.P(i, b); });
    r.choice[i].assign(order.begin(), order.begin() + c.k);
  }
  r.kept.assign(E, {});
  r.routed.assign(E, 0);
  const int C = c.capacity();
  for (int j = 0; j < c.k; ++j)  // first choices first, as GShard does
    for (int i = 0; i < T; ++i) {
      const int e = r.choice[i][j];
      ++r.routed[e];
      if (int(r.kept[e].size()) < C) r.kept[e].push_back({i, j});
      else ++r.dropped;
    }
  return r;
}

/// The expert's forward on its rows: H = tanh(X W1), Y = H W2.
void expert_forward(const M& W1, const M& W2, const M& Xe, M& H, M& Y) {
  H = (Xe * W1).array().tanh().matrix();
  Y = H * W2;
}
/// Its backward: the weights' gradients (added to), and the gradient at its input.
void expert_backward(const M& W1, const M& W2, const M& Xe, const M& H, const M& dY, M& gW1, M& gW2, M& dX) {
  gW2 += H.transpose() * dY;
  const M dZ = ((dY * W2.transpose()).array() * (1.0 - H.array().square())).matrix();
  gW1 += Xe.transpose() * dZ;
  dX = dZ * W1.transpose();
}

/// The combine's arithmetic on one rank's tokens, given each kept choice's expert output:
/// the output, the loss's gradient, the gradients sent back to the experts (dY, in kept order),
/// and the router's gradient (added to gWr).
double combine_and_grad(const config& c, const M& X, const routing& r, const std::vector<M>& Y_of, std::size_t global, M& gWr,
                        std::vector<M>& dY_of) {
  const int T = int(X.rows()), E = c.experts();
  M out = X;
  for (int e = 0; e < E; ++e)
    for (std::size_t q = 0; q < r.kept[e].size(); ++q) {
      const int i = r.kept[e][q].first;
      out.row(i) += r.P(i, e) * Y_of[e].row(std::ptrdiff_t(q));
    }
  M d;
  const double loss = loss_grad<S>(out, targets<S>(X, c.h), global, d);
  M dP = M::Zero(T, E);
  dY_of.assign(E, {});
  for (int e = 0; e < E; ++e) {
    dY_of[e].resize(std::ptrdiff_t(r.kept[e].size()), c.h);
    for (std::size_t q = 0; q < r.kept[e].size(); ++q) {
      const int i = r.kept[e][q].first;
      dY_of[e].row(std::ptrdiff_t(q)) = r.P(i, e) * d.row(i);
      dP(i, e) += d.row(i).dot(Y_of[e].row(std::ptrdiff_t(q)));
    }
  }
  // softmax backward: dlogit = P (dP - <dP, P>)
  M dlogit(T, E);
  for (int i = 0; i < T; ++i) {
    const double s = dP.row(i).dot(r.P.row(i));
    dlogit.row(i) = (r.P.row(i).array() * (dP.row(i).array() - s)).matrix();
  }
  gWr += X.transpose() * dlogit;
  return loss;
}

/// What a rank's step measured.
struct step_stats {
  double loss = 0;
  std::vector<std::uint64_t> routed, kept;  // per expert, over all ranks
  std::uint64_t dropped = 0, rows_sent = 0;
};

/// One training step over the expert group. `update` false: forward and the combine only (the
/// skew sweep).
step_stats step(comm_t& ep, const config& c, params& p, int step_no, double skew, ledger& led, bool update = true) {
  const int n = ep.size(), r = ep.rank(), E = c.experts(), epr = c.epr, T = c.tokens, h = c.h;
  const M X = inputs<S>(std::size_t(step_no) * n * T + std::size_t(r) * T, T, h);
  const routing rt = route(c, X, p.Wr, skew, skew > 0 ? epr : 0);
  // The counts: how many rows this rank sends to each expert, then what each rank sends this
  // rank's experts (an all_to_all of E/N counts per pair).
  std::vector<std::size_t> cnt_out(E), cnt_in(E);
  for (int e = 0; e < E; ++e) cnt_out[e] = rt.kept[e].size();
  timed(led, "all_to_all counts", std::uint64_t(E), sizeof(std::size_t), [&] {
    collx::all_to_all(ep, std::span<const std::size_t>(cnt_out), std::span<std::size_t>(cnt_in));
  });
  // cnt_in[src * epr + a]: rows from src for this rank's expert a.
  std::vector<std::size_t> send_counts(n), recv_counts(n);
  for (int q = 0; q < n; ++q)
    for (int a = 0; a < epr; ++a) {
      send_counts[q] += cnt_out[q * epr + a] * h;
      recv_counts[q] += cnt_in[q * epr + a] * h;
    }
  const std::size_t rows_out = std::accumulate(send_counts.begin(), send_counts.end(), std::size_t(0)) / h;
  const std::size_t rows_in = std::accumulate(recv_counts.begin(), recv_counts.end(), std::size_t(0)) / h;
  M sendbuf(std::ptrdiff_t(rows_out), h), recvbuf(std::ptrdiff_t(rows_in), h);
  {
    std::ptrdiff_t at = 0;
    for (int e = 0; e < E; ++e)
      for (auto [i, j] : rt.kept[e]) sendbuf.row(at++) = X.row(i);
  }
  auto a2av = [&](const M& in, M& out, const std::vector<std::size_t>& sc, const std::vector<std::size_t>& rc, const char* kind) {
    timed(led, kind, std::uint64_t(in.size()), sizeof(S), [&] {
      collx::all_to_all_v(ep, std::span<const S>(in.data(), std::size_t(in.size())), std::span<const std::size_t>(sc),
                          std::span<S>(out.data(), std::size_t(out.size())), std::span<const std::size_t>(rc));
    });
  };
  a2av(sendbuf, recvbuf, send_counts, recv_counts, "all_to_all_v dispatch");
  // The experts, on their rows from every rank (recvbuf: by source, then by local expert).
  std::vector<M> Xe(epr), He(epr), Ye(epr);
  std::vector<std::vector<std::pair<std::ptrdiff_t, std::ptrdiff_t>>> at_of(epr);  // (row in recvbuf, count)
  {
    std::ptrdiff_t at = 0;
    for (int q = 0; q < n; ++q)
      for (int a = 0; a < epr; ++a) {
        at_of[a].push_back({at, std::ptrdiff_t(cnt_in[q * epr + a])});
        at += std::ptrdiff_t(cnt_in[q * epr + a]);
      }
  }
  // Expert a's rows of a buffer in recvbuf's layout, one source after another.
  auto rows_of = [&](int a, const M& buf) {
    std::ptrdiff_t rows = 0;
    for (auto [o, k] : at_of[a]) rows += k;
    M x(rows, h);
    std::ptrdiff_t w = 0;
    for (auto [o, k] : at_of[a]) {
      x.middleRows(w, k) = buf.middleRows(o, k);
      w += k;
    }
    return x;
  };
  for (int a = 0; a < epr; ++a) {
    Xe[a] = rows_of(a, recvbuf);
    expert_forward(p.W1[a], p.W2[a], Xe[a], He[a], Ye[a]);
  }
  auto scatter_back = [&](const std::vector<M>& per_expert, M& buf) {  // into recvbuf's layout
    buf.resize(recvbuf.rows(), h);
    for (int a = 0; a < epr; ++a) {
      std::ptrdiff_t w = 0;
      for (auto [o, k] : at_of[a]) {
        buf.middleRows(o, k) = per_expert[a].middleRows(w, k);
        w += k;
      }
    }
  };
  M ybuf, yback(std::ptrdiff_t(rows_out), h);
  scatter_back(Ye, ybuf);
  a2av(ybuf, yback, recv_counts, send_counts, "all_to_all_v combine");
  std::vector<M> Y_of(E);
  {
    std::ptrdiff_t at = 0;
    for (int e = 0; e < E; ++e) {
      Y_of[e] = yback.middleRows(at, std::ptrdiff_t(rt.kept[e].size()));
      at += std::ptrdiff_t(rt.kept[e].size());
    }
  }
  M gWr = M::Zero(h, E);
  std::vector<M> dY_of;
  step_stats st;
  st.loss = combine_and_grad(c, X, rt, Y_of, std::size_t(n) * T, gWr, dY_of);
  if (update) {
    // Backward: the outputs' gradients to the experts (the dispatch's counts), the experts'
    // input gradients back (the combine's). Those arrive at tokens whose input is data here: a
    // layer below would take them; this model has none, so they end here (their bytes are in
    // the volume check below).
    M dsend(std::ptrdiff_t(rows_out), h), drecv(std::ptrdiff_t(rows_in), h);
    {
      std::ptrdiff_t at = 0;
      for (int e = 0; e < E; ++e) {
        dsend.middleRows(at, dY_of[e].rows()) = dY_of[e];
        at += dY_of[e].rows();
      }
    }
    a2av(dsend, drecv, send_counts, recv_counts, "all_to_all_v dispatch (bwd)");
    std::vector<M> dXe(epr);
    for (int a = 0; a < epr; ++a) {
      const M dYa = rows_of(a, drecv);
      M gW1 = M::Zero(h, c.f), gW2 = M::Zero(c.f, h);
      expert_backward(p.W1[a], p.W2[a], Xe[a], He[a], dYa, gW1, gW2, dXe[a]);
      p.W1[a] -= c.lr * gW1;
      p.W2[a] -= c.lr * gW2;
    }
    M dxbuf, dxback(std::ptrdiff_t(rows_out), h);
    scatter_back(dXe, dxbuf);
    a2av(dxbuf, dxback, recv_counts, send_counts, "all_to_all_v combine (bwd)");
    timed(led, "all_reduce router grad", std::uint64_t(gWr.size()), sizeof(S), [&] {
      collx::all_reduce(ep, std::span<S>(gWr.data(), std::size_t(gWr.size())), collx::ops::sum{}, collx::algo::ring{});
    });
    p.Wr -= c.lr * gWr;
  }
  led.stop(ep);
  // What this rank must have sent: the counts and the rows to the other ranks (twice each way
  // with backward), and the router's ring all_reduce.
  const std::size_t to_self = send_counts[r], from_self = recv_counts[r];
  double want = double(n - 1) * epr * sizeof(std::size_t) + double(rows_out * h - to_self) * sizeof(S) +
                double(rows_in * h - from_self) * sizeof(S);
  if (update) want = 2 * want - double(n - 1) * epr * sizeof(std::size_t) + 2.0 * (n - 1) / n * double(gWr.size()) * sizeof(S);
  ledger::expect(double(led.sent), want, 0.5, "moe: rank " + std::to_string(r) + " (against its counts)");
  // Loads over the group.
  std::vector<std::uint64_t> v(2 * E + 2);
  for (int e = 0; e < E; ++e) {
    v[e] = std::uint64_t(rt.routed[e]);
    v[E + e] = rt.kept[e].size();
  }
  v[2 * E] = rt.dropped;
  v[2 * E + 1] = rows_out;
  collx::all_reduce(ep, std::span<std::uint64_t>(v), collx::ops::sum{});
  st.routed.assign(v.begin(), v.begin() + E);
  st.kept.assign(v.begin() + E, v.begin() + 2 * E);
  st.dropped = v[2 * E];
  st.rows_sent = v[2 * E + 1];
  collx::all_reduce(ep, std::span<double>(&st.loss, 1), collx::ops::sum{});
  return st;
}

/// The same training on one process: all experts, all tokens, each rank's T tokens routed (and
/// cut at the capacity) as that rank does.
params one_process(const config& c, int steps) {
  params p = init(c, 0, c.experts());
  const int E = c.experts(), T = c.tokens, n = c.n, h = c.h;
  for (int s = 0; s < steps; ++s) {
    M gWr = M::Zero(h, E);
    std::vector<M> gW1(E, M::Zero(h, c.f)), gW2(E, M::Zero(c.f, h));
    std::vector<M> Xall(n);
    std::vector<routing> rts(n);
    for (int r = 0; r < n; ++r) {
      Xall[r] = inputs<S>(std::size_t(s) * n * T + std::size_t(r) * T, T, h);
      rts[r] = route(c, Xall[r], p.Wr, 0, 0);
    }
    // Each expert on its rows from every rank, in rank order (as on its own rank).
    std::vector<M> Xe(E), He(E), Ye(E);
    for (int e = 0; e < E; ++e) {
      std::ptrdiff_t rows = 0;
      for (int r = 0; r < n; ++r) rows += std::ptrdiff_t(rts[r].kept[e].size());
      Xe[e].resize(rows, h);
      std::ptrdiff_t w = 0;
      for (int r = 0; r < n; ++r)
        for (auto [i, j] : rts[r].kept[e]) Xe[e].row(w++) = Xall[r].row(i);
      expert_forward(p.W1[e], p.W2[e], Xe[e], He[e], Ye[e]);
    }
    std::vector<M> dYe(E);
    for (int e = 0; e < E; ++e) dYe[e].resize(Xe[e].rows(), h);
    std::vector<std::ptrdiff_t> at(E, 0);
    for (int r = 0; r < n; ++r) {
      std::vector<M> Y_of(E), dY_of;
      for (int e = 0; e < E; ++e) Y_of[e] = Ye[e].middleRows(at[e], std::ptrdiff_t(rts[r].kept[e].size()));
      combine_and_grad(c, Xall[r], rts[r], Y_of, std::size_t(n) * T, gWr, dY_of);
      for (int e = 0; e < E; ++e) {
        dYe[e].middleRows(at[e], dY_of[e].rows()) = dY_of[e];
        at[e] += dY_of[e].rows();
      }
    }
    for (int e = 0; e < E; ++e) {
      M dX;
      expert_backward(p.W1[e], p.W2[e], Xe[e], He[e], dYe[e], gW1[e], gW2[e], dX);
      p.W1[e] -= c.lr * gW1[e];
      p.W2[e] -= c.lr * gW2[e];
    }
    p.Wr -= c.lr * gWr;
  }
  return p;
}

std::string max_mean(const std::vector<std::uint64_t>& v) {
  const double mx = double(*std::max_element(v.begin(), v.end()));
  const double mean = double(std::accumulate(v.begin(), v.end(), std::uint64_t(0))) / double(v.size());
  char s[64];
  std::snprintf(s, sizeof s, "max/mean %.2f", mean > 0 ? mx / mean : 0.0);
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  const cli a = parse(argc, argv,
                      {{"top-k", true}, {"capacity-factor", true}, {"experts-per-rank", true}, {"tokens", true}, {"hidden", true}, {"skew", true}},
                      "moe [-np N] [--transport threads|shm|tcp] [--steps S] [--top-k 1|2] [--capacity-factor CF] [--experts-per-rank E] "
                      "[--tokens T] [--hidden H] [--skew B]");
  config c0;
  c0.k = a.get("top-k", 2);
  c0.cf = a.getf("capacity-factor", 1.25);
  c0.epr = a.get("experts-per-rank", 2);
  c0.tokens = a.get("tokens", 32);
  c0.h = a.get("hidden", 16);
  c0.f = 2 * c0.h;
  c0.skew = a.getf("skew", 1.0);
  return launch(a, [&](comm_t& ep) {
    config c = c0;
    c.n = ep.size();
    c.k = std::min(c.k, c.experts());
    const int r = ep.rank(), E = c.experts();
    if (r == 0) {
      std::printf("# moe: %d ranks over %s; %d experts (%d per rank), top-%d, capacity factor %.2f: C = %d of a rank's %d tokens per expert;"
                  " h = %d, f = %d; %d steps\n",
                  c.n, a.transport.c_str(), E, c.epr, c.k, c.cf, c.capacity(), c.tokens, c.h, c.f, a.steps);
      std::printf("group ep: all %d ranks; expert e on rank e / %d; the router replicated (its gradient all_reduced)\n", c.n, c.epr);
    }
    params p = init(c, r * c.epr, c.epr);
    ledger led;
    led.group = "ep";
    for (int s = 0; s < a.steps; ++s) {
      led.start(ep);
      const step_stats st = step(ep, c, p, s, 0, led);
      if (r == 0) {
        std::uint64_t routed = 0, kept = 0;
        for (int e = 0; e < E; ++e) {
          routed += st.routed[e];
          kept += st.kept[e];
        }
        std::vector<std::uint64_t> rank_load(c.n, 0);
        for (int e = 0; e < E; ++e) rank_load[e / c.epr] += st.kept[e];
        const std::uint64_t padded_rows = std::uint64_t(c.n) * E * c.capacity();
        std::printf("step %d: loss %.6f; %llu choices routed, %llu kept, %llu dropped (%.1f%%); fixed-capacity all_to_all would send %llu rows, "
                    "%llu of them padding (%.1f%%)\n",
                    s, st.loss, (unsigned long long)routed, (unsigned long long)kept, (unsigned long long)st.dropped,
                    100.0 * double(st.dropped) / double(routed), (unsigned long long)padded_rows,
                    (unsigned long long)(padded_rows - kept), 100.0 * double(padded_rows - kept) / double(padded_rows));
        std::printf("  load per expert (kept):");
        for (auto k : st.kept) std::printf(" %llu", (unsigned long long)k);
        std::printf(" (%s); per rank:", max_mean(st.kept).c_str());
        for (auto k : rank_load) std::printf(" %llu", (unsigned long long)k);
        std::printf(" (%s)\n", max_mean(rank_load).c_str());
        led.print();
      }
    }
    // The check against one process: every rank's experts and the router.
    const params ref = one_process(c, a.steps);
    match m;
    for (Eigen::Index k = 0; k < p.Wr.size(); ++k) m.add(p.Wr.data()[k], ref.Wr.data()[k]);
    for (int x = 0; x < c.epr; ++x) {
      const int e = r * c.epr + x;
      for (Eigen::Index k = 0; k < p.W1[x].size(); ++k) m.add(p.W1[x].data()[k], ref.W1[e].data()[k]);
      for (Eigen::Index k = 0; k < p.W2[x].size(); ++k) m.add(p.W2[x].data()[k], ref.W2[e].data()[k]);
    }
    m.tol = order_tolerance(double(c.n * c.tokens + c.f), a.steps);
    report(ep, m, "router and experts after " + std::to_string(a.steps) + " steps against one process", "8 S (N T + f) u, fp64");

    // A skewed router: logits of rank 0's experts raised by --skew. Forward and combine only.
    if (c.skew > 0) {
      if (r == 0)
        std::printf("skewed router (+%.1f on rank 0's experts), one forward pass per capacity factor:\n"
                    "  %-6s %-4s %9s %12s %12s %14s %10s\n",
                    c.skew, "cf", "C", "dropped", "rank 0 rows", "rank load", "rows sent", "a2a ms");
      for (double cf : {1.0, 1.25, 2.0, 4.0}) {
        config cs = c;
        cs.cf = cf;
        params ps = init(cs, r * cs.epr, cs.epr);
        ledger l2;
        l2.start(ep);
        const step_stats st = step(ep, cs, ps, 0, c.skew, l2, false);
        std::vector<std::uint64_t> rank_load(cs.n, 0);
        for (int e = 0; e < E; ++e) rank_load[e / cs.epr] += st.kept[e];
        double ms = (l2.rows["all_to_all_v dispatch"].seconds + l2.rows["all_to_all_v combine"].seconds) * 1e3;
        collx::all_reduce(ep, std::span<double>(&ms, 1), collx::ops::max{});
        std::uint64_t routed = 0;
        for (auto x : st.routed) routed += x;
        if (r == 0)
          std::printf("  %-6.2f %-4d %8.1f%% %12llu %14s %10llu %10.3f\n", cf, cs.capacity(), 100.0 * double(st.dropped) / double(routed),
                      (unsigned long long)rank_load[0], max_mean(rank_load).c_str(), (unsigned long long)st.rows_sent, ms);
      }
    }
  });
}
