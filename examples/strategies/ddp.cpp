// ddp: data parallelism as PyTorch's DistributedDataParallel does it.
//
// Every rank holds the whole model and trains on its own shard of each batch. Backward produces
// the gradients last layer first; as soon as a bucket of them is complete its all_reduce (avg)
// starts, while backward goes on with the layers below (collx::bucket_reducer, features/buckets.hpp).
// After the last bucket, every rank has the gradient of the whole batch and takes the same step.
//
//   ddp [-np N] [--transport threads|shm|tcp] [--steps S] [--batch B] [--width W] [--depth D]
//       [--cap-kib K]
//
// Prints the group, then per step the loss, the all_reduces (one per bucket), their bytes and
// the time backward waited for them, the bytes this rank sent against the ring's 2(N-1)/N x the
// gradient's size, and at the end whether the run matches the same training on one process.
#include "common.hpp"

namespace {

using namespace strategies;
using S = double;

constexpr const char* kUsage =
    "ddp [-np N] [--transport threads|shm|tcp] [--steps S] [--batch B per rank] [--width W] [--depth D] [--cap-kib K]";

struct setup {
  mlp net;
  int batch;  // per rank
  double lr = 0.01;
  std::size_t cap;
};

/// One SGD step of the whole model on rows [first, first + rows) of step `step`'s batch of
/// `global` samples: forward, backward layer by layer (`layer_done(l)` after layer l's gradient
/// is in g), then the update (after `before_update`).
template <class Done, class Before>
double train_step(const setup& s, std::vector<S>& p, std::vector<S>& g, int step, std::size_t first, std::size_t rows,
                  std::size_t global, Done&& layer_done, Before&& before_update) {
  const mlp& m = s.net;
  const std::size_t base = std::size_t(step) * global + first;
  std::vector<mat<S>> h(m.layers() + 1);
  h[0] = inputs<S>(base, rows, m.dims[0]);
  for (int l = 0; l < m.layers(); ++l) m.forward(l, p.data() + m.offset(l), h[l], h[l + 1]);
  mat<S> dy, dx;
  // The mean over this rank's rows: averaged over the ranks (all_reduce avg), the batch's mean.
  const double loss = loss_grad<S>(h.back(), targets<S>(h[0], m.dims.back()), rows, dy);
  for (int l = m.layers(); l-- > 0;) {
    m.backward(l, p.data() + m.offset(l), h[l], h[l + 1], dy, g.data() + m.offset(l), dx);
    dy.swap(dx);
    layer_done(l);
  }
  before_update();
  for (std::size_t k = 0; k < p.size(); ++k) p[k] -= S(s.lr) * g[k];
  return loss;
}

}  // namespace

int main(int argc, char** argv) {
  const cli c = parse(argc, argv, {{"batch", true}, {"width", true}, {"depth", true}, {"cap-kib", true}}, kUsage);
  setup s;
  const int width = c.get("width", 192), depth = c.get("depth", 4);
  s.net.dims.push_back(32);
  for (int d = 0; d < depth - 1; ++d) s.net.dims.push_back(width);
  s.net.dims.push_back(8);
  s.batch = c.get("batch", 8);
  s.cap = std::size_t(c.get("cap-kib", 256)) << 10;

  return launch(c, [&](comm_t& world) {
    const int n = world.size(), r = world.rank();
    const mlp& m = s.net;
    const std::size_t psi = m.size(), global = std::size_t(s.batch) * n;
    if (r == 0) {
      std::printf("# ddp: %d ranks over %s, model", n, c.transport.c_str());
      for (int d : m.dims) std::printf(" %d", d);
      std::printf(" (%zu parameters, %.2f MiB of fp64 gradients), batch %d per rank (%zu in all), %d steps\n", psi,
                  double(psi * sizeof(S)) / (1 << 20), s.batch, global, c.steps);
      std::printf("group dp: all %d ranks (the job's communicator): gradients averaged by all_reduce(avg)\n", n);
    }
    std::vector<S> p = init_params(m), g(psi);
    // The gradients, one per layer, in the order the forward pass creates them.
    std::vector<std::span<S>> grads;
    for (int l = 0; l < m.layers(); ++l) grads.emplace_back(g.data() + m.offset(l), m.layer_size(l));
    collx::bucket_options bo;
    bo.cap_bytes = bo.first_cap_bytes = s.cap;
    collx::bucket_reducer red(world, grads, bo, collx::ops::avg{}, collx::algo::ring{});
    if (r == 0) {
      std::printf("buckets (cap %zu KiB, gradients last layer first):", s.cap >> 10);
      for (auto& b : red.assignment()) {
        std::printf(" [");
        for (std::size_t k = 0; k < b.size(); ++k) std::printf("%s%zu", k ? " " : "", b[k]);
        std::printf("]");
      }
      std::printf("\n");
    }

    ledger dp;
    dp.group = "dp";
    for (int step = 0; step < c.steps; ++step) {
      dp.start(world);
      const auto t0 = clk::now();
      const double loss = train_step(
          s, p, g, step, std::size_t(r) * s.batch, s.batch, global,
          [&](int l) { red.ready(std::size_t(l)); },  // into its bucket, whose all_reduce may start now
          [&] { waited(dp, "all_reduce(avg) bucket", [&] { red.finish(); }); });
      const double step_s = std::chrono::duration<double>(clk::now() - t0).count();
      for (auto& b : red.assignment()) {  // one all_reduce per bucket
        std::size_t e = 0;
        for (std::size_t k : b) e += m.layer_size(int(k));
        dp.add("all_reduce(avg) bucket", e, sizeof(S));
      }
      dp.stop(world);
      double l2 = loss;
      collx::all_reduce(world, std::span<double>(&l2, 1), collx::ops::avg{});
      if (r == 0) {
        std::printf("step %d: loss %.6f, %.2f ms; backward waited for the buckets' all_reduces (the rest overlapped):\n", step,
                    l2, step_s * 1e3);
        dp.print();
        const double want = 2.0 * double(n - 1) / n * double(psi) * sizeof(S);
        std::printf("    ring all_reduce: 2(N-1)/N x %zu elements x %zu B = %s per rank; measured %s (%.4f x)\n", psi, sizeof(S),
                    ledger::human(want).c_str(), ledger::human(double(dp.sent)).c_str(), n > 1 ? double(dp.sent) / want : 1.0);
      }
      // The volume check (ring, buckets cut unevenly: less than one element per block off).
      ledger::expect(double(dp.sent), 2.0 * double(n - 1) / n * double(psi) * sizeof(S), 2.0 * n * double(red.buckets()) * sizeof(S),
                     "ddp: rank " + std::to_string(r));
    }

    // The same training on one process: the whole batch, no communication.
    const std::vector<S> q = one_process_sgd(m, c.steps, global, s.lr);
    match mt;
    for (std::size_t k = 0; k < psi; ++k) mt.add(p[k], q[k]);
    // The gradient of a batch is a sum over its B samples; split over N ranks it is summed in
    // another order (B/N on each rank, then N). The parameters are compared relative to the
    // largest of them, which the steps' differences (lr times a gradient's) are far below.
    mt.tol = order_tolerance(double(global + n), c.steps);
    report(world, mt, "parameters after " + std::to_string(c.steps) + " steps against one process", "8 S (B + N) u, fp64");
  });
}
