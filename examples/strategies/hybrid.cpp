// hybrid: data x tensor parallelism on 4 ranks, data x pipeline x tensor on 8, laid out with
// collx::mesh (torch's DeviceMesh), and how a slow rank shows up in its own groups.
//
// The model is megatron.hpp's MLP blocks. Along tp each block is split as Megatron splits it (an
// all_reduce after each half); along pp the blocks are cut into stages that pass activations
// forward and gradients back by send/recv; along dp each replica trains on its own tokens and the
// gradients of its shard are averaged (all_reduce avg) before the step.
//
//   hybrid [-np 4|8] [--transport threads|shm|tcp] [--steps S] [--mesh DxT | DxPxT]
//          [--slow-rank R] [--slow-ms X]
//
// Prints the mesh and every rank's groups, the collectives of one step per group (rank 0's),
// whether the run matches one process, and the time each rank waited in each of its groups.
// With --slow-rank, rank R sleeps X ms at the start of every step (a straggler): the others wait
// for it, first its own groups' members and through them the rest; R itself waits for nobody.
// The table shows both: per group, who waited; per rank, the total; the straggler is the rank
// that waits least while the members of its groups wait most. The program checks that it finds
// R so.
#include "megatron.hpp"

#include <thread>

namespace {

using namespace strategies;
using namespace strategies::megatron;

std::uint64_t elems_of(const ledger& l) {
  std::uint64_t e = 0;
  for (auto& [k, x] : l.rows) e += x.elems;
  return e;
}

std::vector<int> parse_mesh(const std::string& s) {
  std::vector<int> d;
  std::size_t at = 0;
  while (at <= s.size()) {
    const std::size_t x = s.find('x', at);
    d.push_back(std::atoi(s.substr(at, x == std::string::npos ? std::string::npos : x - at).c_str()));
    if (x == std::string::npos) break;
    at = x + 1;
  }
  return d;
}

}  // namespace

int main(int argc, char** argv) {
  const cli c = parse(argc, argv, {{"mesh", true}, {"slow-rank", true}, {"slow-ms", true}},
                      "hybrid [-np 4|8] [--transport threads|shm|tcp] [--steps S] [--mesh DxT|DxPxT] [--slow-rank R] [--slow-ms X]");
  const std::vector<int> dims = parse_mesh(c.gets("mesh", c.np == 8 ? "2x2x2" : c.np == 4 ? "2x2" : std::to_string(c.np) + "x1"));
  if (dims.size() != 2 && dims.size() != 3) {
    std::fprintf(stderr, "hybrid: --mesh is DxT or DxPxT\n");
    return 2;
  }
  const int slow = c.get("slow-rank", -1);
  const double slow_ms = c.getf("slow-ms", 100);
  shape base;
  base.h = 32;
  base.f = 128;
  base.tokens_per_rank = 16;  // tokens per data-parallel replica
  return launch(c, [&](comm_t& world) {
    shape sh = base;  // each rank's own (the ranks may be threads)
    const int r = world.rank();
    const bool has_pp = dims.size() == 3;
    const std::vector<std::string> names = has_pp ? std::vector<std::string>{"dp", "pp", "tp"} : std::vector<std::string>{"dp", "tp"};
    auto groups = collx::mesh(world, dims, names);
    comm_t& dp = groups.front();
    comm_t& tp = groups.back();
    comm_t* pp = has_pp ? &groups[1] : nullptr;
    const int D = dp.size(), P = pp ? pp->size() : 1, T = tp.size();
    const int stage = pp ? pp->rank() : 0, bps = 2;  // blocks per stage
    sh.layers = bps * P;
    const int s = sh.tokens_per_rank;
    if (r == 0) {
      std::printf("# hybrid: %d ranks over %s as a %s mesh (", world.size(), c.transport.c_str(), c.gets("mesh", "").empty() ? "default" : "given");
      for (std::size_t k = 0; k < dims.size(); ++k) std::printf("%s%s %d", k ? " x " : "", names[k].c_str(), dims[k]);
      std::printf(", row-major: tp varies fastest); %d MLP blocks h = %d, f = %d, %d per stage; %d tokens per replica; %d steps\n", sh.layers,
                  sh.h, sh.f, bps, s, c.steps);
    }
    // Every rank's groups, in job ranks, printed by rank 0 in rank order.
    {
      std::vector<int> mine;
      for (auto& g : groups)
        for (int q = 0; q < g.size(); ++q) mine.push_back(g.job_rank(q));
      std::vector<int> all(mine.size() * std::size_t(world.size()));
      collx::all_gather(world, std::span<const int>(mine), std::span<int>(all));
      if (r == 0)
        for (int q = 0; q < world.size(); ++q) {
          std::printf("  rank %d:", q);
          std::size_t at = mine.size() * std::size_t(q);
          for (std::size_t k = 0; k < dims.size(); ++k) {
            std::printf("  %s {", names[k].c_str());
            for (int x = 0; x < dims[k]; ++x) std::printf("%s%d", x ? " " : "", all[at++]);
            std::printf("}");
          }
          std::printf("\n");
        }
    }
    const collx::partition cols(std::size_t(sh.f), T);
    const int c0 = int(cols.offset(tp.rank())), fc = int(cols.count(tp.rank()));
    std::vector<block> bl;
    for (int l = stage * bps; l < (stage + 1) * bps; ++l) bl.push_back(init_block(sh, l, c0, fc));
    ledger led_dp, led_tp, led_pp;
    led_dp.group = "dp";
    led_tp.group = "tp";
    led_pp.group = "pp";
    double wait_dp = 0, wait_tp = 0, wait_pp = 0;  // over all steps
    for (int step = 0; step < c.steps; ++step) {
      led_dp.start(dp);
      led_tp.start(tp);
      if (pp) led_pp.start(*pp);
      if (r == slow) std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(slow_ms));
      // This replica's tokens.
      const M X0 = inputs<S>((std::size_t(step) * D + std::size_t(dp.rank())) * s, s, sh.h);
      M X = X0;
      if (stage > 0) {
        timed(led_pp, *pp, "recv activation", std::uint64_t(X.size()), sizeof(S),
              [&] { collx::recv(*pp, std::span<S>(X.data(), std::size_t(X.size())), stage - 1); });
      }
      std::vector<saved> sv(bps);
      for (int l = 0; l < bps; ++l) X = tp_forward(&tp, led_tp, bl[l], X, sv[l]);
      M d(s, sh.h);
      if (stage + 1 < P) {
        timed(led_pp, *pp, "send activation", std::uint64_t(X.size()), sizeof(S),
              [&] { collx::send(*pp, std::span<const S>(X.data(), std::size_t(X.size())), stage + 1); });
        timed(led_pp, *pp, "recv gradient", std::uint64_t(d.size()), sizeof(S),
              [&] { collx::recv(*pp, std::span<S>(d.data(), std::size_t(d.size())), stage + 1); });
      } else {
        loss_grad<S>(X, targets<S>(X0, sh.h), std::size_t(s), d);  // the replica's mean; dp averages
      }
      std::vector<grads> g(bps);
      for (int l = bps; l-- > 0;) d = tp_backward(&tp, led_tp, bl[l], sv[l], d, g[l]);
      if (stage > 0)
        timed(led_pp, *pp, "send gradient", std::uint64_t(d.size()), sizeof(S),
              [&] { collx::send(*pp, std::span<const S>(d.data(), std::size_t(d.size())), stage - 1); });
      // The shard's gradients, averaged over the replicas: one fused batch, run as one
      // all_reduce over them where they are.
      collx::fused f(dp);
      std::uint64_t elems = 0;
      auto add = [&](S* p, Eigen::Index n) {
        f.all_reduce(std::span<S>(p, std::size_t(n)), collx::ops::avg{}, collx::algo::ring{});
        elems += std::uint64_t(n);
      };
      for (auto& x : g) {
        add(x.A.data(), x.A.size());
        add(x.B.data(), x.B.size());
        add(x.a.data(), x.a.size());
        add(x.b.data(), x.b.size());
      }
      timed(led_dp, dp, "all_reduce(avg) grads, fused", elems, sizeof(S), [&] { f.run(); });
      for (int l = 0; l < bps; ++l) sgd(bl[l], g[l], sh.lr);
      led_dp.stop(dp);
      led_tp.stop(tp);
      if (pp) led_pp.stop(*pp);
      // What each group's transport sent, against the ring's volume and the messages' sizes.
      const std::string who = "hybrid: rank " + std::to_string(r);
      for (const char* k : {"all_reduce Y (g)", "all_reduce dX (f)"})
        ledger::expect(double(led_tp.sent_by(k)), 2.0 * (T - 1) / T * double(led_tp.rows[k].bytes), 2.0 * T * sizeof(S), who + " " + k);
      ledger::expect(double(led_dp.sent_by("all_reduce(avg) grads, fused")), 2.0 * (D - 1) / D * double(elems_of(led_dp)) * sizeof(S),
                     2.0 * D * sizeof(S), who + " dp");
      for (const char* k : {"send activation", "send gradient"})
        ledger::expect(double(led_pp.sent_by(k)), double(led_pp.rows[k].bytes), 0, who + " " + k);
      wait_dp += led_dp.seconds();
      wait_tp += led_tp.seconds();
      wait_pp += led_pp.seconds();
    }
    if (r == 0) {
      std::printf("one step's collectives, rank 0's groups:\n");
      led_tp.print();
      if (pp) led_pp.print();
      led_dp.print();
    }
    // Against one process: all D replicas' tokens of a step are its batch (D x s tokens from
    // step * D * s on: the replicas' tokens one after another).
    const auto ref = one_process(sh, D * s, c.steps);
    match m;
    for (int l = 0; l < bps; ++l) compare_block(m, bl[l], ref[std::size_t(stage * bps + l)], c0, fc);
    m.tol = 8.0 * c.steps * sh.layers * double(D * s + sh.f) * std::ldexp(1.0, -53);
    report(world, m, "every rank's shard against one process", "8 S L (D s + f) u, fp64");

    // The waits: per rank and group, gathered on rank 0.
    const double w[3] = {wait_dp, wait_tp, wait_pp};
    std::vector<double> all(3 * std::size_t(world.size()));
    collx::all_gather(world, std::span<const double>(w, 3), std::span<double>(all));
    const int N = world.size();
    auto coord = [&](int q, std::size_t k) {  // rank q's coordinate k, row-major
      for (std::size_t j = dims.size(); j-- > k + 1;) q /= dims[j];
      return q % dims[k];
    };
    const std::size_t which[3] = {0, dims.size() - 1, 1};  // dp, tp, pp: their dims
    std::vector<double> rank_total(std::size_t(N), 0);
    for (int q = 0; q < N; ++q) rank_total[std::size_t(q)] = all[3 * q] + all[3 * q + 1] + all[3 * q + 2];
    if (r == 0) {
      std::printf("time each rank waited in its groups over %d steps (ms)%s:\n", c.steps,
                  slow >= 0 ? (" (rank " + std::to_string(slow) + " sleeps " + std::to_string(int(slow_ms)) + " ms per step)").c_str() : "");
      for (int gi = 0; gi < (has_pp ? 3 : 2); ++gi) {
        const std::size_t k = which[gi];
        // The instances of this group: the ranks that agree on every other coordinate.
        std::vector<bool> seen(std::size_t(N), false);
        for (int q = 0; q < N; ++q) {
          if (seen[std::size_t(q)]) continue;
          std::printf("  %s {", names[k].c_str());
          std::vector<int> members;
          for (int x = 0; x < N; ++x) {
            bool same = true;
            for (std::size_t j = 0; j < dims.size(); ++j)
              if (j != k && coord(x, j) != coord(q, j)) same = false;
            if (same) {
              members.push_back(x);
              seen[std::size_t(x)] = true;
            }
          }
          for (std::size_t i = 0; i < members.size(); ++i) std::printf("%s%d", i ? " " : "", members[i]);
          std::printf("}:");
          for (int x : members) std::printf("  rank %d %7.1f", x, all[3 * x + gi] * 1e3);
          std::printf("\n");
        }
      }
      std::printf("  total:");
      for (int q = 0; q < N; ++q) std::printf("  rank %d %7.1f", q, rank_total[std::size_t(q)] * 1e3);
      std::printf("\n");
    }
    if (slow >= 0 && N > 1) {
      // The straggler is the rank that waited least, by far: the others waited about X ms a
      // step for it, through their groups.
      const int least = int(std::min_element(rank_total.begin(), rank_total.end()) - rank_total.begin());
      double next = 1e300;
      for (int q = 0; q < N; ++q)
        if (q != least) next = std::min(next, rank_total[std::size_t(q)]);
      if (r == 0)
        std::printf("straggler: rank %d (waited %.1f ms; every other rank at least %.1f ms)\n", least, rank_total[std::size_t(least)] * 1e3,
                    next * 1e3);
      if (least != slow || rank_total[std::size_t(least)] > 0.5 * next)
        throw std::runtime_error("hybrid: the slowed rank " + std::to_string(slow) + " does not stand out in the waits");
      if (r == 0) std::printf("check: the slowed rank is the one its groups waited for: MATCH\n");
    }
  });
}
