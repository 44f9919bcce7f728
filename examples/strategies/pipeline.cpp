// pipeline: pipeline parallelism. The model's layers are cut into p stages, one per rank; a batch
// is cut into m micro-batches that flow forward through the stages and their gradients back, over
// send/recv. Two schedules:
//   gpipe  every micro-batch forward, then every one backward: each stage holds the activations of
//          all m micro-batches at the turn;
//   1f1b   (PipeDream-Flush, Megatron's) after p - s - 1 warm-up forwards, stage s alternates one
//          forward and one backward: it holds at most p - s micro-batches' activations.
// Both leave the same bubble, (p - 1) / (m + p - 1) of the step idle on every stage, when a
// backward costs twice a forward. Each stage's compute is made to take that long (a wait of
// --unit-ms per forward, twice for a backward, the core left free as a GPU's kernel leaves it) so
// the bubble can be measured in wall time; it is also measured exactly with a logical clock that
// each message carries.
// Between two of its computations a stage posts its sends and its receives together (collx::fused:
// one step), as Megatron's send_forward_recv_backward does: a stage sending an activation forward
// while its neighbour sends a gradient back would otherwise wait on each other.
//
//   pipeline [-np P] [--transport threads|shm|tcp] [--steps S] [--micro-batches M]
//            [--schedule gpipe|1f1b|both] [--unit-ms U] [--layers-per-stage L]
#include "common.hpp"

#include <thread>

namespace {

using namespace strategies;
using S = double;
constexpr double kLr = 0.05;

struct op {
  bool fwd;
  int mb;
};

std::vector<op> schedule_of(const std::string& kind, int p, int s, int m) {
  std::vector<op> ops;
  if (kind == "gpipe") {
    for (int i = 0; i < m; ++i) ops.push_back({true, i});
    for (int i = 0; i < m; ++i) ops.push_back({false, i});
  } else {
    const int warm = std::min(p - s - 1, m);
    for (int i = 0; i < warm; ++i) ops.push_back({true, i});
    for (int i = 0; i < m - warm; ++i) {
      ops.push_back({true, warm + i});
      ops.push_back({false, i});
    }
    for (int i = m - warm; i < m; ++i) ops.push_back({false, i});
  }
  return ops;
}

struct stats {
  double logical_end = 0, logical_busy = 0;  // units
  double wall_busy = 0, wall_total = 0;      // seconds
  int peak_held = 0;                         // micro-batches whose activations a stage held at once
  std::uint64_t peak_bytes = 0;
};

/// One step of schedule `kind` on stage s = pp.rank(): forward and backward of m micro-batches of
/// `mb` samples each, gradients accumulated in g.
stats run_step(comm_t& pp, const mlp& net, int lps, const std::vector<S>& p, std::vector<S>& g, const std::string& kind, int m,
               int mb, int step, double unit_ms, ledger& led) {
  const int P = pp.size(), s = pp.rank();
  const int l0 = s * lps, l1 = l0 + lps;  // this stage's layers
  const std::size_t global = std::size_t(m) * mb;
  const int d_in = net.dims[l0], d_out = net.dims[l1];
  // Per micro-batch: the stage's activations (inputs of each layer, and the output), held from
  // its forward to its backward.
  std::vector<std::vector<mat<S>>> acts(m);
  std::vector<mat<S>> grad_in(m);  // the gradient arriving from the next stage
  // The messages, each with one extra element: the sender's logical clock.
  std::vector<std::vector<S>> act_buf(m, std::vector<S>(std::size_t(mb) * d_in + 1)),
      out_buf(m, std::vector<S>(std::size_t(mb) * d_out + 1)), gout_buf(m, std::vector<S>(std::size_t(mb) * d_out + 1)),
      gin_buf(m, std::vector<S>(std::size_t(mb) * d_in + 1));
  stats st;
  double clock = 0;
  int held = 0;
  std::uint64_t held_bytes = 0;
  const auto ops = schedule_of(kind, P, s, m);
  auto compute_wait = [&](double units) {
    const auto t0 = clk::now();
    if (unit_ms > 0) std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(units * unit_ms));
    st.wall_busy += std::chrono::duration<double>(clk::now() - t0).count();
    clock += units;
    st.logical_busy += units;
  };
  auto arrived = [&](const std::vector<S>& buf) { clock = std::max(clock, buf.back()); };
  // The receive op k needs, and the send op k-1 left, posted together.
  auto exchange = [&](int k) {
    collx::fused f(pp);
    bool any = false;
    std::uint64_t posted = 0;  // bytes this rank sends in the step
    if (k > 0) {
      const op& o = ops[std::size_t(k - 1)];
      if (o.fwd && s + 1 < P) {
        out_buf[o.mb].back() = clock;
        f.send(std::span<S>(out_buf[o.mb]), s + 1);
        posted += out_buf[o.mb].size() * sizeof(S);
        led.add("send activation", out_buf[o.mb].size() - 1, sizeof(S));
        any = true;
      } else if (!o.fwd && s > 0) {
        gin_buf[o.mb].back() = clock;
        f.send(std::span<S>(gin_buf[o.mb]), s - 1);
        posted += gin_buf[o.mb].size() * sizeof(S);
        led.add("send gradient", gin_buf[o.mb].size() - 1, sizeof(S));
        any = true;
      }
    }
    int recv_mb = -1;
    bool recv_fwd = false;
    if (k < int(ops.size())) {
      const op& o = ops[std::size_t(k)];
      if (o.fwd && s > 0) {
        f.recv(std::span<S>(act_buf[o.mb]), s - 1);
        led.add("recv activation", act_buf[o.mb].size() - 1, sizeof(S));
        recv_mb = o.mb;
        recv_fwd = true;
      } else if (!o.fwd && s + 1 < P) {
        f.recv(std::span<S>(gout_buf[o.mb]), s + 1);
        led.add("recv gradient", gout_buf[o.mb].size() - 1, sizeof(S));
        recv_mb = o.mb;
      }
    }
    if (!any && recv_mb < 0) return;
    const std::uint64_t before = pp.transport().counts().bytes_sent;
    waited(led, "(time in the fused steps)", [&] { f.run(); });
    // What the transport sent is what was posted (each message: its data and the clock).
    ledger::expect(double(pp.transport().counts().bytes_sent - before), double(posted), 0,
                   "pipeline: stage " + std::to_string(s) + "'s step " + std::to_string(k));
    if (recv_mb >= 0) arrived(recv_fwd ? act_buf[recv_mb] : gout_buf[recv_mb]);
  };
  for (int k = 0; k <= int(ops.size()); ++k) {
    exchange(k);
    if (k == int(ops.size())) break;
    const op& o = ops[std::size_t(k)];
    const std::size_t first = std::size_t(step) * global + std::size_t(o.mb) * mb;
    if (o.fwd) {
      auto& h = acts[o.mb];
      h.assign(lps + 1, {});
      if (s == 0) h[0] = inputs<S>(first, mb, d_in);
      else h[0] = Eigen::Map<const mat<S>>(act_buf[o.mb].data(), mb, d_in);
      for (int l = l0; l < l1; ++l) net.forward(l, p.data() + net.offset(l), h[l - l0], h[l - l0 + 1]);
      if (s + 1 < P) std::memcpy(out_buf[o.mb].data(), h[lps].data(), std::size_t(h[lps].size()) * sizeof(S));
      std::uint64_t b = 0;
      for (auto& x : h) b += std::uint64_t(x.size()) * sizeof(S);
      ++held;
      held_bytes += b;
      st.peak_held = std::max(st.peak_held, held);
      st.peak_bytes = std::max(st.peak_bytes, held_bytes);
      compute_wait(1);
    } else {
      auto& h = acts[o.mb];
      mat<S> dy, dx;
      if (s + 1 == P) loss_grad<S>(h[lps], targets<S>(inputs<S>(first, mb, net.dims[0]), net.dims.back()), global, dy);
      else dy = Eigen::Map<const mat<S>>(gout_buf[o.mb].data(), mb, d_out);
      std::vector<S> gl;
      for (int l = l1; l-- > l0;) {
        gl.assign(net.layer_size(l), 0);
        net.backward(l, p.data() + net.offset(l), h[l - l0], h[l - l0 + 1], dy, gl.data(), dx);
        for (std::size_t k2 = 0; k2 < gl.size(); ++k2) g[net.offset(l) + k2] += gl[k2];  // accumulated over micro-batches
        dy.swap(dx);
      }
      if (s > 0) std::memcpy(gin_buf[o.mb].data(), dy.data(), std::size_t(dy.size()) * sizeof(S));
      std::uint64_t b = 0;
      for (auto& x : h) b += std::uint64_t(x.size()) * sizeof(S);
      --held;
      held_bytes -= b;
      h.clear();
      compute_wait(2);
    }
  }
  st.logical_end = clock;
  return st;
}

}  // namespace

int main(int argc, char** argv) {
  const cli c = parse(argc, argv, {{"micro-batches", true}, {"schedule", true}, {"unit-ms", true}, {"layers-per-stage", true}, {"width", true}},
                      "pipeline [-np P] [--transport threads|shm|tcp] [--steps S] [--micro-batches M] [--schedule gpipe|1f1b|both] "
                      "[--unit-ms U] [--layers-per-stage L] [--width W]");
  const int m = c.get("micro-batches", 8), lps = c.get("layers-per-stage", 2), width = c.get("width", 64), mb = 4;
  const double unit_ms = c.getf("unit-ms", 2.0);
  const std::string which = c.gets("schedule", "both");
  std::vector<std::string> kinds;
  if (which == "gpipe" || which == "both") kinds.push_back("gpipe");
  if (which == "1f1b" || which == "both") kinds.push_back("1f1b");
  return launch(c, [&](comm_t& pp) {
    const int P = pp.size(), s = pp.rank();
    mlp net;
    net.dims.push_back(24);
    for (int l = 0; l < P * lps - 1; ++l) net.dims.push_back(width);
    net.dims.push_back(8);
    if (s == 0) {
      std::printf("# pipeline: %d stages over %s, %d layers each (model", P, c.transport.c_str(), lps);
      for (int d : net.dims) std::printf(" %d", d);
      std::printf("), %d micro-batches of %d samples, %d steps; a forward takes %.1f ms, a backward twice that\n", m, mb, c.steps, unit_ms);
      std::printf("group pp: stage s on rank s; activations go s -> s+1, gradients s+1 -> s\n");
    }
    const double formula = double(P - 1) / double(m + P - 1);
    for (const std::string& kind : kinds) {
      std::vector<S> p = init_params(net), g(net.size());
      ledger led;
      led.group = "pp";
      stats st;
      for (int step = 0; step < c.steps; ++step) {
        std::fill(g.begin(), g.end(), 0.0);
        led.start(pp);
        collx::barrier(pp);
        const auto t0 = clk::now();
        st = run_step(pp, net, lps, p, g, kind, m, mb, step, unit_ms, led);
        collx::barrier(pp);
        st.wall_total = std::chrono::duration<double>(clk::now() - t0).count();
        led.stop(pp);
        // Every stage updates its own layers (g is zero elsewhere).
        for (std::size_t k = 0; k < p.size(); ++k) p[k] -= kLr * g[k];
      }
      // The makespan is the last stage's clock; the bubble of a stage is what it did not compute.
      double v[2] = {st.logical_end, st.wall_total};
      collx::all_reduce(pp, std::span<double>(v, 2), collx::ops::max{});
      const double logical_bubble = 1.0 - st.logical_busy / v[0];
      const double wall_bubble = 1.0 - st.wall_busy / v[1];
      // Gather the per-stage figures on rank 0.
      std::vector<double> mine = {logical_bubble, wall_bubble, double(st.peak_held), double(st.peak_bytes)}, all(4 * std::size_t(P));
      collx::all_gather(pp, std::span<const double>(mine), std::span<double>(all));
      if (s == 0) {
        std::printf("%s: bubble (p-1)/(m+p-1) = %.4f\n  %-6s %16s %16s %14s %16s\n", kind.c_str(), formula, "stage", "bubble (logical)",
                    "bubble (wall)", "peak held", "peak act bytes");
        for (int q = 0; q < P; ++q)
          std::printf("  %-6d %16.4f %16.4f %10.0f mb %16.0f\n", q, all[4 * q], all[4 * q + 1], all[4 * q + 2], all[4 * q + 3]);
        std::printf("  the last step's messages on stage 0:\n");
        led.print();
      }
      // The checks: the logical bubble is the formula's on every stage; the activations held
      // are m (gpipe) or p - s (1f1b) micro-batches.
      if (std::abs(logical_bubble - formula) > 1e-9)
        throw std::runtime_error("pipeline " + kind + ": stage " + std::to_string(s) + "'s bubble " + std::to_string(logical_bubble) +
                                 " is not (p-1)/(m+p-1) = " + std::to_string(formula));
      const int want_held = kind == "gpipe" ? m : std::min(P - s, m);
      if (st.peak_held != want_held)
        throw std::runtime_error("pipeline " + kind + ": stage " + std::to_string(s) + " held " + std::to_string(st.peak_held) +
                                 " micro-batches, not " + std::to_string(want_held));
      // Against one process: the whole batch through the whole model, the same SGD steps.
      const std::vector<S> q = one_process_sgd(net, c.steps, std::size_t(m) * mb, kLr);
      match mt;
      for (int l = s * lps; l < (s + 1) * lps; ++l)
        for (std::size_t k = 0; k < net.layer_size(l); ++k) mt.add(p[net.offset(l) + k], q[net.offset(l) + k]);
      // The batch's gradient summed over m micro-batches instead of at once: gamma_(B) per step.
      mt.tol = order_tolerance(double(m * mb + m), c.steps);
      report(pp, mt, kind + ": each stage's layers after " + std::to_string(c.steps) + " steps against one process", "8 S (B + m) u, fp64");
    }
  });
}
