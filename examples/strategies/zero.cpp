// zero: ZeRO stages 1, 2 and 3 (FSDP), with mixed precision as in the ZeRO paper.
//
// Each rank keeps bf16 parameters and gradients (2 + 2 bytes per parameter) and fp32 master
// weights and Adam moments (K = 12 bytes per parameter): (2 + 2 + K) Psi on every rank when
// nothing is sharded (stage 0, plain data parallelism). The stages shard, over the dp group of N
// ranks, one more of these each:
//   stage 1  the optimizer state: each rank updates 1/N of the parameters. Gradients are
//            reduce-scattered (each rank needs only its shard's), the updated bf16 shards
//            all-gathered back: 2 Psi per step, the same as one all_reduce.
//   stage 2  + the gradients: each layer's gradient goes to its shard as soon as backward has it
//            (reduce_scatter, overlapped with the layers below), and only the shard is kept.
//   stage 3  + the parameters (FSDP): each layer's are all-gathered just before use, in forward
//            and again in backward, the next layer's prefetched while this one computes, and
//            dropped after: 3 Psi per step.
// Each layer is sharded on its own, padded to a multiple of N, as FSDP shards its flat units.
//
//   zero [-np N] [--transport threads|shm|tcp] [--steps S] [--stage 0|1|2|3|all] [--batch B]
//        [--width W] [--depth D]
//
// Prints, per stage, the bytes each rank holds (the buffers it allocated) against the paper's
// (2 + 2 + K) Psi and its sharded forms, the collectives of a step and the bytes this rank sent
// (measured by transport::counting) against 2 Psi / 3 Psi, and the checks: every stage equals
// stage 0 bit for bit (collx's all_reduce is a reduce-scatter and then an all-gather, so
// sharding changes no arithmetic), and stage 0's first loss and averaged gradient match one
// process's within the bf16 roundings of the ranks' gradients.
#include "common.hpp"

namespace {

using namespace strategies;
using bf16 = collx::bfloat16;
using ring = collx::algo::ring;

constexpr const char* kUsage =
    "zero [-np N] [--transport threads|shm|tcp] [--steps S] [--stage 0|1|2|3|all] [--batch B per rank] [--width W] [--depth D]";

constexpr float kLr = 1e-3f, kB1 = 0.9f, kB2 = 0.999f, kEps = 1e-8f;

/// Bytes a rank holds, by kind, as it allocates and frees them: what stays (persistent) and the
/// largest the transient buffers reached at once.
struct tracker {
  std::map<std::string, std::uint64_t> persistent;
  std::uint64_t transient = 0, peak_transient = 0;
  template <class V>
  void keep(const std::string& k, const V& v) { persistent[k] += v.size() * sizeof(typename V::value_type); }
  void take(std::uint64_t b) { peak_transient = std::max(peak_transient, transient += b); }
  void drop(std::uint64_t b) { transient -= b; }
};

/// A buffer counted as transient while it lives.
template <class E>
struct scratch {
  tracker* t;
  std::vector<E> v;
  scratch(tracker& tr, std::size_t n) : t(&tr), v(n) { t->take(n * sizeof(E)); }
  ~scratch() { t->drop(v.size() * sizeof(E)); }
  scratch(const scratch&) = delete;
  scratch& operator=(const scratch&) = delete;
};

/// The model's layers, each padded to a multiple of N.
struct layout {
  mlp net;
  int n = 1;
  std::size_t padded(int l) const { return (net.layer_size(l) + n - 1) / n * n; }
  std::size_t shard(int l) const { return padded(l) / n; }
  /// Where layer l starts in the layers' padded blocks laid end to end.
  std::size_t start(int l) const {
    std::size_t s = 0;
    for (int k = 0; k < l; ++k) s += padded(k);
    return s;
  }
  std::size_t psi() const {
    std::size_t s = 0;
    for (int l = 0; l < net.layers(); ++l) s += padded(l);
    return s;
  }
};

/// Adam on `count` elements: the fp32 master weights, moments and the bf16 gradient.
void adam(float* w, float* m, float* v, const bf16* g, std::size_t count, int t) {
  const float c1 = 1 - std::pow(kB1, float(t)), c2 = 1 - std::pow(kB2, float(t));
  for (std::size_t k = 0; k < count; ++k) {
    const float gk = float(g[k]);
    m[k] = kB1 * m[k] + (1 - kB1) * gk;
    v[k] = kB2 * v[k] + (1 - kB2) * gk * gk;
    w[k] -= kLr * (m[k] / c1) / (std::sqrt(v[k] / c2) + kEps);
  }
}

std::vector<float> widen(const bf16* p, std::size_t n) {
  std::vector<float> f(n);
  for (std::size_t k = 0; k < n; ++k) f[k] = float(p[k]);
  return f;
}

/// Forward and backward of one layer in fp32 from bf16 parameters; the gradient rounded to bf16.
struct step_math {
  const mlp& net;
  std::vector<mat<float>> h;
  mat<float> dy;
  void forward(int l, const bf16* p) {
    const auto w = widen(p, net.layer_size(l));
    net.forward(l, w.data(), h[l], h[l + 1]);
  }
  /// `fp32`, when given, receives the gradient before it is rounded.
  void backward(int l, const bf16* p, bf16* g, float* fp32 = nullptr) {
    const auto w = widen(p, net.layer_size(l));
    std::vector<float> gf(net.layer_size(l));
    mat<float> dx;
    net.backward(l, w.data(), h[l], h[l + 1], dy, gf.data(), dx);
    dy.swap(dx);
    for (std::size_t k = 0; k < gf.size(); ++k) g[k] = bf16(gf[k]);
    if (fp32 != nullptr) std::copy(gf.begin(), gf.end(), fp32);
  }
  double start(const mlp& m, int step, std::size_t first, std::size_t rows, std::size_t global) {
    h.assign(m.layers() + 1, {});
    h[0] = inputs<float>(std::size_t(step) * global + first, rows, m.dims[0]);
    return 0;
  }
  double loss(std::size_t rows) { return loss_grad<float>(h.back(), targets<float>(h[0], net.dims.back()), rows, dy); }
};

struct result {
  std::vector<float> master;  // this rank's view: the whole model (stage 0) or its shards, in layer order
  std::vector<double> losses;
  // Stage 0, step 0: the averaged bf16 gradient, and the ranks' mean of |their own bf16
  // gradient| (the scale its rounding errors are relative to), padded layers end to end.
  std::vector<float> grad0, abs0;
};

/// Stage `stage` on the dp group; returns the master weights this rank holds.
result train(comm_t& dp, const layout& L, int stage, int steps, int batch, bool print) {
  const mlp& m = L.net;
  const int n = dp.size(), r = dp.rank(), layers = m.layers();
  const std::size_t global = std::size_t(batch) * n;
  tracker mem;
  const bool shard_os = stage >= 1, shard_g = stage >= 2, shard_p = stage >= 3;
  const auto init = init_params(m);
  // Per layer: its bf16 parameters (whole, or the shard), its bf16 gradient (whole, or the
  // shard), and the fp32 master, m and v (whole, or the shard).
  std::vector<std::vector<bf16>> P(layers), G(layers);
  std::vector<std::vector<float>> W(layers), M(layers), V(layers);
  for (int l = 0; l < layers; ++l) {
    const std::size_t full = L.padded(l), sh = L.shard(l), o = m.offset(l), size = m.layer_size(l);
    std::vector<float> w(full, 0.0f);
    for (std::size_t k = 0; k < size; ++k) w[k] = float(init[o + k]);
    const std::size_t os_at = shard_os ? std::size_t(r) * sh : 0, os_n = shard_os ? sh : full;
    W[l].assign(w.begin() + os_at, w.begin() + os_at + os_n);
    M[l].assign(os_n, 0.0f);
    V[l].assign(os_n, 0.0f);
    const std::size_t p_at = shard_p ? std::size_t(r) * sh : 0, p_n = shard_p ? sh : full;
    P[l].resize(p_n);
    for (std::size_t k = 0; k < p_n; ++k) P[l][k] = bf16(w[p_at + k]);
    G[l].assign(shard_g ? sh : full, bf16(0.0f));
    mem.keep("parameters (bf16)", P[l]);
    mem.keep("gradients (bf16)", G[l]);
    mem.keep("optimizer (fp32 w, m, v)", W[l]);
    mem.keep("optimizer (fp32 w, m, v)", M[l]);
    mem.keep("optimizer (fp32 w, m, v)", V[l]);
  }
  result res;
  ledger led;
  led.group = "dp";
  step_math sm{m, {}, {}};
  // Stage 3: layer l's whole parameters, gathered (a prefetch in flight, or done). The call is
  // waited for before its buffer goes, whichever way this one is replaced or destroyed.
  struct gathered {
    std::unique_ptr<scratch<bf16>> buf;
    collx::work w;
    gathered() = default;
    gathered(gathered&&) = default;
    gathered& operator=(gathered&& o) noexcept {
      w = collx::work{};  // waits
      buf = std::move(o.buf);
      w = std::move(o.w);
      return *this;
    }
    ~gathered() { w = collx::work{}; }
  };
  auto gather = [&](int l) {
    gathered g;
    g.buf = std::make_unique<scratch<bf16>>(mem, L.padded(l));
    led.add("all_gather params", L.padded(l), sizeof(bf16));
    g.w = collx::async::all_gather(dp, std::span<const bf16>(P[l]), std::span<bf16>(g.buf->v), ring{});
    return g;
  };
  auto wait = [&](collx::work& w, const char* kind) { waited(led, kind, [&] { w.wait(); }); };

  for (int step = 0; step < steps; ++step) {
    led.start(dp);
    sm.start(m, step, std::size_t(r) * batch, batch, global);
    // ---- forward
    if (shard_p) {
      gathered cur = gather(0);
      for (int l = 0; l < layers; ++l) {
        wait(cur.w, "all_gather params");
        gathered next;
        if (l + 1 < layers) next = gather(l + 1);  // prefetched while layer l computes
        sm.forward(l, cur.buf->v.data());
        cur = std::move(next);  // layer l's parameters are dropped
      }
    } else {
      for (int l = 0; l < layers; ++l) sm.forward(l, P[l].data());
    }
    double loss = sm.loss(batch);
    // ---- backward: last layer first; each layer's gradient leaves as soon as it is computed
    // The buffers first: on an error the calls (destroyed first) are waited for before them.
    std::vector<std::unique_ptr<scratch<bf16>>> grad_tmp(layers);
    std::vector<collx::work> grad_calls(layers);
    const bool keep0 = stage == 0 && step == 0;
    if (keep0) res.abs0.assign(L.psi(), 0.0f);
    gathered cur;
    if (shard_p) cur = gather(layers - 1);
    for (int l = layers; l-- > 0;) {
      const bf16* params = P[l].data();
      gathered next;
      if (shard_p) {
        wait(cur.w, "all_gather params");
        if (l > 0) next = gather(l - 1);
        params = cur.buf->v.data();
      }
      const std::size_t full = L.padded(l), sh = L.shard(l);
      if (!shard_g) {
        std::fill(G[l].begin(), G[l].end(), bf16(0.0f));
        sm.backward(l, params, G[l].data());
        if (stage == 0) {
          if (keep0)
            for (std::size_t k = 0; k < full; ++k) res.abs0[L.start(l) + k] = std::abs(float(G[l][k]));
          led.add("all_reduce(avg) grads", full, sizeof(bf16));
          grad_calls[l] = collx::async::all_reduce(dp, std::span<bf16>(G[l]), collx::ops::avg{}, ring{});
        } else {  // in place: this rank's block of the whole gradient
          led.add("reduce_scatter(avg) grads", full, sizeof(bf16));
          grad_calls[l] = collx::async::reduce_scatter(dp, std::span<const bf16>(G[l]),
                                                       std::span<bf16>(G[l].data() + std::size_t(r) * sh, sh), collx::ops::avg{}, ring{});
        }
      } else {
        // The whole gradient only until it has been reduce-scattered into the shard. At most
        // two are alive: this layer's, and the previous one's still in flight.
        if (l + 2 < layers) {
          wait(grad_calls[l + 2], "reduce_scatter(avg) grads");
          grad_tmp[l + 2].reset();
        }
        grad_tmp[l] = std::make_unique<scratch<bf16>>(mem, full);
        sm.backward(l, params, grad_tmp[l]->v.data());
        led.add("reduce_scatter(avg) grads", full, sizeof(bf16));
        grad_calls[l] = collx::async::reduce_scatter(dp, std::span<const bf16>(grad_tmp[l]->v), std::span<bf16>(G[l]),
                                                     collx::ops::avg{}, ring{});
      }
      cur = std::move(next);
    }
    for (auto& w : grad_calls) wait(w, stage == 0 ? "all_reduce(avg) grads" : "reduce_scatter(avg) grads");
    grad_tmp.clear();
    if (keep0)
      for (int l = 0; l < layers; ++l)
        for (const bf16 x : G[l]) res.grad0.push_back(float(x));
    // ---- the optimizer: on what this rank owns
    for (int l = 0; l < layers; ++l) {
      const std::size_t sh = L.shard(l);
      const bf16* g = shard_g ? G[l].data() : shard_os ? G[l].data() + std::size_t(r) * sh : G[l].data();
      adam(W[l].data(), M[l].data(), V[l].data(), g, W[l].size(), step + 1);
      if (shard_p) {
        for (std::size_t k = 0; k < sh; ++k) P[l][k] = bf16(W[l][k]);
      } else if (shard_os) {  // the updated shard, then everyone's
        bf16* mine = P[l].data() + std::size_t(r) * sh;
        for (std::size_t k = 0; k < sh; ++k) mine[k] = bf16(W[l][k]);
        timed(led, "all_gather params", L.padded(l), sizeof(bf16),
              [&] { collx::all_gather(dp, std::span<const bf16>(mine, sh), std::span<bf16>(P[l]), ring{}); });
      } else {
        for (std::size_t k = 0; k < W[l].size(); ++k) P[l][k] = bf16(W[l][k]);
      }
    }
    led.stop(dp);
    collx::all_reduce(dp, std::span<double>(&loss, 1), collx::ops::avg{});
    if (keep0) collx::all_reduce(dp, std::span<float>(res.abs0), collx::ops::avg{});  // for the check only
    res.losses.push_back(loss);
    if (print && r == 0) {
      std::printf("  step %d: loss %.6f\n", step, loss);
      led.print();
    }
    // The volume: ring all_reduce 2 (N-1)/N Psi elements; reduce-scatter and all-gather (N-1)/N
    // Psi each; stage 3 gathers twice.
    const double per = double(n - 1) / n * double(L.psi()) * sizeof(bf16);
    const double want = (stage == 3 ? 3.0 : 2.0) * per;
    if (print && r == 0)
      std::printf("    %s Psi: %s (N-1)/N x %zu x 2 B = %s; measured %s (%.4f x)\n", stage == 3 ? "3" : "2",
                  stage == 3 ? "3" : "2", L.psi(), ledger::human(want).c_str(), ledger::human(double(led.sent)).c_str(),
                  n > 1 ? double(led.sent) / want : 1.0);
    ledger::expect(double(led.sent), want, 0.5, "zero stage " + std::to_string(stage) + ": rank " + std::to_string(r));
  }
  if (print && r == 0) {
    const double psi = double(L.psi()), k = 12;
    const double want_p = shard_p ? 2 * psi / n : 2 * psi, want_g = shard_g ? 2 * psi / n : 2 * psi,
                 want_o = shard_os ? k * psi / n : k * psi;
    std::printf("  memory per rank (Psi = %zu, N = %d, K = 12):\n", L.psi(), n);
    const char* f_p = shard_p ? "2 Psi / N" : "2 Psi";
    const char* f_g = shard_g ? "2 Psi / N" : "2 Psi";
    const char* f_o = shard_os ? "K Psi / N" : "K Psi";
    auto row = [&](const char* what, const char* formula, double want, std::uint64_t got) {
      std::printf("    %-26s %-10s %12.0f B   measured %12llu B\n", what, formula, want, (unsigned long long)got);
    };
    row("parameters (bf16)", f_p, want_p, mem.persistent["parameters (bf16)"]);
    row("gradients (bf16)", f_g, want_g, mem.persistent["gradients (bf16)"]);
    row("optimizer (fp32 w, m, v)", f_o, want_o, mem.persistent["optimizer (fp32 w, m, v)"]);
    std::uint64_t total = 0;
    for (auto& [key, b] : mem.persistent) total += b;
    row("total", "", want_p + want_g + want_o, total);
    std::printf("    %-26s %-10s %12s     peak %12llu B (gathered layers, gradients in flight)\n", "transient", "", "",
                (unsigned long long)mem.peak_transient);
  }
  // The memory check: what each rank allocated is the formula's (Psi is a multiple of N).
  const double psi = double(L.psi());
  const double want_total = (shard_p ? 2 * psi / n : 2 * psi) + (shard_g ? 2 * psi / n : 2 * psi) + (shard_os ? 12 * psi / n : 12 * psi);
  std::uint64_t total = 0;
  for (auto& [key, b] : mem.persistent) total += b;
  if (double(total) != want_total)
    throw std::runtime_error("zero stage " + std::to_string(stage) + ": rank " + std::to_string(r) + " holds " + std::to_string(total) +
                             " B, the formula says " + std::to_string(want_total));
  for (int l = 0; l < layers; ++l) res.master.insert(res.master.end(), W[l].begin(), W[l].end());
  return res;
}

struct reference {
  std::vector<float> grad0;  // step 0's gradient before rounding, layer by layer (unpadded)
  std::vector<double> losses;
};

/// The whole model on one process, stage 0's math on the whole batch.
reference one_process(const layout& L1, int steps, std::size_t global) {
  const mlp& m = L1.net;
  const auto init = init_params(m);
  std::vector<std::vector<float>> W(m.layers()), M(m.layers()), V(m.layers());
  std::vector<std::vector<bf16>> P(m.layers()), G(m.layers());
  for (int l = 0; l < m.layers(); ++l) {
    W[l].assign(init.begin() + std::ptrdiff_t(m.offset(l)), init.begin() + std::ptrdiff_t(m.offset(l) + m.layer_size(l)));
    M[l].assign(W[l].size(), 0.0f);
    V[l].assign(W[l].size(), 0.0f);
    P[l].assign(W[l].begin(), W[l].end());
    G[l].resize(W[l].size());
  }
  step_math sm{m, {}, {}};
  reference ref;
  ref.grad0.resize(m.size());
  for (int step = 0; step < steps; ++step) {
    sm.start(m, step, 0, global, global);
    for (int l = 0; l < m.layers(); ++l) sm.forward(l, P[l].data());
    ref.losses.push_back(sm.loss(global));
    for (int l = m.layers(); l-- > 0;) sm.backward(l, P[l].data(), G[l].data(), step == 0 ? ref.grad0.data() + m.offset(l) : nullptr);
    for (int l = 0; l < m.layers(); ++l) {
      adam(W[l].data(), M[l].data(), V[l].data(), G[l].data(), W[l].size(), step + 1);
      for (std::size_t k = 0; k < W[l].size(); ++k) P[l][k] = bf16(W[l][k]);
    }
  }
  return ref;
}

}  // namespace

int main(int argc, char** argv) {
  const cli c = parse(argc, argv, {{"stage", true}, {"batch", true}, {"width", true}, {"depth", true}}, kUsage);
  const std::string which = c.gets("stage", "all");
  std::vector<int> stages;
  if (which == "all") stages = {0, 1, 2, 3};
  else stages = {0, std::atoi(which.c_str())};  // stage 0 too: the others are checked against it
  if (stages.back() == 0) stages.pop_back();
  layout L;
  const int width = c.get("width", 160), depth = c.get("depth", 4);
  L.net.dims.push_back(32);
  for (int d = 0; d < depth - 1; ++d) L.net.dims.push_back(width);
  L.net.dims.push_back(8);
  const int batch = c.get("batch", 8);

  return launch(c, [&](comm_t& world) {
    const int n = world.size(), r = world.rank();
    layout Ln = L;
    Ln.n = n;
    if (r == 0) {
      std::printf("# zero: %d ranks over %s, model", n, c.transport.c_str());
      for (int d : Ln.net.dims) std::printf(" %d", d);
      std::printf(" (%zu parameters, Psi = %zu with each layer padded to a multiple of N), batch %d per rank, %d steps, Adam\n",
                  Ln.net.size(), Ln.psi(), batch, c.steps);
      std::printf("group dp: all %d ranks; every call uses algo::ring (the paper's bandwidth-optimal volumes)\n", n);
    }
    std::vector<result> out;
    for (int st : stages) {
      if (r == 0) std::printf("stage %d%s:\n", st, st == 0 ? " (no sharding: data parallel)" : st == 3 ? " (FSDP)" : "");
      out.push_back(train(world, Ln, st, c.steps, batch, true));
    }
    // Check 1: every stage is stage 0 bit for bit (this rank's shards against stage 0's whole).
    if (out.size() > 1) {
      match same;
      same.tol = 0;
      for (std::size_t i = 1; i < out.size(); ++i) {
        std::size_t at = 0;
        for (int l = 0; l < Ln.net.layers(); ++l) {
          const std::size_t sh = Ln.shard(l), base = std::size_t(r) * sh;
          for (std::size_t k = 0; k < sh; ++k) same.add(out[i].master[at + k], out[0].master[Ln.start(l) + base + k]);
          at += sh;
        }
      }
      report(world, same, "stages 1-3 against stage 0 (fp32 master weights)", "exact: the same reductions");
    }
    // Check 2: stage 0 against one process, where they can be compared strictly: the first
    // step's loss (the same bf16 parameters: fp32 sums in another order) and its gradient. The
    // ranks round their own gradients to bf16 and the ring sums those in bf16 (N - 1 roundings)
    // and divides by N; one process has the fp32 gradient of the whole batch. Each element then
    // differs by at most (N + 2) u_bf16 (u_bf16 = 2^-8) times the ranks' mean of |their
    // gradient|, the scale of those roundings. (After the first step the runs are no longer
    // comparable element by element: Adam turns a gradient that nearly cancels into about
    // lr x its sign, whose sign the roundings may flip.)
    layout L1 = Ln;
    L1.n = 1;
    const reference ref = one_process(L1, 1, std::size_t(batch) * n);
    match lm;
    lm.add(out[0].losses[0], ref.losses[0]);
    lm.tol = 1e-5;
    report(world, lm, "stage 0's first loss against one process", "fp32 sums in another order");
    match gm;
    gm.scale = 1;
    float floor = 0;
    for (float x : ref.grad0) floor = std::max(floor, std::abs(x));
    floor *= std::ldexp(1.0f, -20);  // fp32's own order differences, where everything cancels
    for (int l = 0; l < Ln.net.layers(); ++l)
      for (std::size_t k = 0; k < Ln.net.layer_size(l); ++k) {
        const std::size_t at = Ln.start(l) + k;
        const float d = std::abs(out[0].grad0[at] - ref.grad0[Ln.net.offset(l) + k]);
        gm.diff = std::isfinite(d) ? std::max(gm.diff, double(d) / double(out[0].abs0[at] + floor)) : INFINITY;
      }
    gm.tol = double(n + 2) * std::ldexp(1.0, -8);
    report(world, gm, "stage 0's first averaged bf16 gradient against one process's fp32 one",
           "(N + 2) 2^-8 of the ranks' mean |gradient|");
  });
}
