// collx-train-bench: what a training step's calls cost, over shared memory (ranks as processes).
//
//   collx-train-bench overhead  [-np 2]   async + immediate wait of an 8 B all_reduce against the
//                                          blocking call, interleaved batches, medians
//   collx-train-bench fusion    [-np 2]   64 all_reduces of 1 KiB: fused, unfused, against one
//                                          all_reduce of 64 KiB
//   collx-train-bench overlap   [-np 2]   a fixed compute kernel while an all_reduce of S bytes is
//                                          outstanding, S = 64 KiB .. 64 MiB: t(compute || ar)
//                                          against t(compute) + t(ar)
//   collx-train-bench buckets   [-np 2] [--plot FILE.png]
//                                          a simulated backward pass over ~100 MiB of gradients in
//                                          uneven layers, per-layer compute proportional to size:
//                                          step time by bucket cap, with and without overlap
//
// Every figure is a median over repetitions, each timed on rank 0 after a barrier; the two sides
// of each ratio run in the same job, interleaved.
#include <collx/collx.hpp>

#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

namespace {

using clk = std::chrono::steady_clock;
using comm_t = collx::communicator<collx::transport::shm>;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

/// Results rank 0 writes for the parent (the ranks are forked processes).
struct shared_out {
  double v[4096];
};
shared_out& out() {
  static shared_out* p = [] {
    void* m = mmap(nullptr, sizeof(shared_out), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) std::abort();
    return static_cast<shared_out*>(m);
  }();
  return *p;
}

/// Microseconds per call of f, over `iters` calls after a barrier (rank 0's clock).
template <class F>
double time_us(comm_t& comm, int iters, F&& f) {
  collx::barrier(comm);
  const auto t0 = clk::now();
  for (int i = 0; i < iters; ++i) f();
  collx::barrier(comm);
  return std::chrono::duration<double, std::micro>(clk::now() - t0).count() / iters;
}

/// A fixed amount of arithmetic on an L1-resident array: `units` x ~1 us on these machines.
[[gnu::noinline]] float compute(int units) {
  static float a[2048];
  float s = 0;
  for (int u = 0; u < units; ++u) {
    for (int i = 0; i < 2048; ++i) a[i] = a[i] * 0.999f + 0.5f;
    s += a[u % 2048];
  }
  return s;
}
volatile float g_sink;

void launch(int n, const std::function<void(comm_t&)>& body) { collx::launch_processes(n, body); }

int overhead(int n) {
  launch(n, [](comm_t& comm) {
    std::vector<float> v(2, 1.0f);  // 8 B
    std::vector<double> blocking, async;
    for (int rep = 0; rep < 15; ++rep) {
      blocking.push_back(time_us(comm, 2000, [&] { collx::all_reduce(comm, std::span{v}, collx::ops::sum{}); }));
      async.push_back(time_us(comm, 2000, [&] { collx::async::all_reduce(comm, std::span{v}, collx::ops::sum{}).wait(); }));
    }
    if (comm.rank() == 0) {
      out().v[0] = median(blocking);
      out().v[1] = median(async);
    }
  });
  std::printf("# collx-train-bench overhead -np %d: an 8 B all_reduce over shm, median of 15 batches of 2000\n", n);
  std::printf("%-28s %10s\n", "call", "us");
  std::printf("%-28s %10.2f\n", "blocking", out().v[0]);
  std::printf("%-28s %10.2f\n", "async + wait()", out().v[1]);
  std::printf("ratio async/blocking: %.2f\n", out().v[1] / out().v[0]);
  return 0;
}

int fusion(int n) {
  launch(n, [](comm_t& comm) {
    constexpr int kCalls = 64;
    constexpr std::size_t kElems = 1024 / sizeof(float);
    std::vector<std::vector<float>> small(kCalls, std::vector<float>(kElems, 1.0f));
    std::vector<float> big(kCalls * kElems, 1.0f);
    std::vector<double> one, fused, unfused;
    for (int rep = 0; rep < 11; ++rep) {
      one.push_back(time_us(comm, 200, [&] { collx::all_reduce(comm, std::span{big}, collx::ops::sum{}); }));
      fused.push_back(time_us(comm, 200, [&] {
        collx::fused f(comm);
        for (auto& s : small) f.all_reduce(std::span{s}, collx::ops::sum{});
        f.run();
      }));
      unfused.push_back(time_us(comm, 50, [&] {
        for (auto& s : small) collx::all_reduce(comm, std::span{s}, collx::ops::sum{});
      }));
    }
    if (comm.rank() == 0) {
      out().v[0] = median(one);
      out().v[1] = median(fused);
      out().v[2] = median(unfused);
    }
  });
  std::printf("# collx-train-bench fusion -np %d: all_reduce over shm, float sum, median of 11 batches\n", n);
  std::printf("%-32s %10s %8s\n", "calls", "us", "ratio");
  std::printf("%-32s %10.2f %8.2f\n", "one of 64 KiB", out().v[0], 1.0);
  std::printf("%-32s %10.2f %8.2f\n", "64 of 1 KiB, fused", out().v[1], out().v[1] / out().v[0]);
  std::printf("%-32s %10.2f %8.2f\n", "64 of 1 KiB, one after another", out().v[2], out().v[2] / out().v[0]);
  return 0;
}

int overlap(int n, int units) {
  std::vector<std::size_t> sizes;
  for (std::size_t s = 64 << 10; s <= (std::size_t(64) << 20); s *= 4) sizes.push_back(s);
  launch(n, [&](comm_t& comm) {
    for (std::size_t k = 0; k < sizes.size(); ++k) {
      std::vector<float> v(sizes[k] / sizeof(float), 1.0f);
      const int iters = sizes[k] >= (std::size_t(16) << 20) ? 3 : 10;
      std::vector<double> c, a, both;
      for (int rep = 0; rep < 7; ++rep) {
        c.push_back(time_us(comm, iters, [&] { g_sink = compute(units); }));
        a.push_back(time_us(comm, iters, [&] { collx::all_reduce(comm, std::span{v}, collx::ops::sum{}); }));
        both.push_back(time_us(comm, iters, [&] {
          auto w = collx::async::all_reduce(comm, std::span{v}, collx::ops::sum{});
          g_sink = compute(units);
          w.wait();
        }));
      }
      if (comm.rank() == 0) {
        out().v[3 * k] = median(c);
        out().v[3 * k + 1] = median(a);
        out().v[3 * k + 2] = median(both);
      }
    }
  });
  std::printf("# collx-train-bench overlap -np %d: a compute kernel of %d units while an all_reduce (float sum) over shm is\n"
              "# outstanding; median of 7; ratio = t(compute || all_reduce) / (t(compute) + t(all_reduce))\n", n, units);
  std::printf("%12s %12s %12s %14s %12s %8s\n", "bytes", "compute_us", "allred_us", "sum_us", "overlap_us", "ratio");
  for (std::size_t k = 0; k < sizes.size(); ++k) {
    const double c = out().v[3 * k], a = out().v[3 * k + 1], b = out().v[3 * k + 2];
    std::printf("%12zu %12.1f %12.1f %14.1f %12.1f %8.2f\n", sizes[k], c, a, c + a, b, b / (c + a));
  }
  return 0;
}

/// A model of ~100 MiB of float gradients in uneven layers (in forward order): blocks of an
/// embedding, attention and MLP weights with their biases and norms, as a transformer has them.
std::vector<std::size_t> model_layers() {
  std::vector<std::size_t> l;
  l.push_back(std::size_t(4) << 20);  // embedding: 16 MiB
  for (int b = 0; b < 6; ++b) {
    l.push_back(1024);                   // norm
    l.push_back(3 * 512 * 1024);         // qkv: 6 MiB
    l.push_back(3 * 1024);               // its bias
    l.push_back(512 * 1024);             // attention out: 2 MiB
    l.push_back(1024);                   // norm
    l.push_back(1024 * 1024 + 512 * 1024);  // mlp up: 6 MiB
    l.push_back(4096);                   // bias
    l.push_back(512 * 1024 + 256 * 1024);   // mlp down: 3 MiB
  }
  l.push_back(1024);
  return l;
}

int buckets(int n, double ns_per_elem, const std::string& plot) {
  const auto layers = model_layers();
  std::size_t total = 0;
  for (auto x : layers) total += x;
  std::vector<std::size_t> caps;
  for (std::size_t c = 64 << 10; c <= (std::size_t(256) << 20); c *= 2) caps.push_back(c);
  // Compute per layer, in kernel units: proportional to the layer's size.
  const double unit_ns = [] {
    const auto t0 = clk::now();
    g_sink = compute(2000);
    return std::chrono::duration<double, std::nano>(clk::now() - t0).count() / 2000;
  }();
  launch(n, [&](comm_t& comm) {
    std::vector<std::vector<float>> grads(layers.size());
    std::vector<std::span<float>> views;
    for (std::size_t k = 0; k < layers.size(); ++k) {
      grads[k].assign(layers[k], 1.0f);
      views.emplace_back(grads[k]);
    }
    auto layer_compute = [&](std::size_t k) { g_sink = compute(int(double(layers[k]) * ns_per_elem / unit_ns)); };
    for (std::size_t ci = 0; ci < caps.size(); ++ci) {
      collx::bucket_options o;
      o.cap_bytes = caps[ci];
      o.first_cap_bytes = std::min<std::size_t>(caps[ci], std::size_t(1) << 20);
      collx::bucket_reducer<collx::transport::shm, float> red(comm, views, o);
      std::vector<double> with, without;
      for (int rep = 0; rep < 5; ++rep) {
        with.push_back(time_us(comm, 1, [&] {  // overlap: each bucket starts as soon as it is complete
          for (std::size_t k = layers.size(); k-- > 0;) {
            layer_compute(k);
            red.ready(k);
          }
          red.finish();
        }));
        without.push_back(time_us(comm, 1, [&] {  // the same buckets, reduced after backward
          for (std::size_t k = layers.size(); k-- > 0;) layer_compute(k);
          for (std::size_t k = layers.size(); k-- > 0;) red.ready(k);
          red.finish();
        }));
      }
      if (comm.rank() == 0) {
        out().v[3 * ci] = median(with) / 1000;
        out().v[3 * ci + 1] = median(without) / 1000;
        out().v[3 * ci + 2] = double(red.buckets());
      }
    }
    // Backward alone, and one all_reduce of every gradient at once, for reference.
    std::vector<double> bw, ar;
    std::vector<float> flat(total, 1.0f);
    for (int rep = 0; rep < 5; ++rep) {
      bw.push_back(time_us(comm, 1, [&] {
        for (std::size_t k = layers.size(); k-- > 0;) layer_compute(k);
      }));
      ar.push_back(time_us(comm, 1, [&] { collx::all_reduce(comm, std::span{flat}, collx::ops::avg{}); }));
    }
    if (comm.rank() == 0) {
      out().v[4000] = median(bw) / 1000;
      out().v[4001] = median(ar) / 1000;
    }
  });
  std::size_t best = 0;
  for (std::size_t ci = 1; ci < caps.size(); ++ci)
    if (out().v[3 * ci] < out().v[3 * best]) best = ci;
  std::printf("# collx-train-bench buckets -np %d: a backward pass over %.1f MiB of float gradients in %zu layers (compute\n"
              "# %.2f ns per element), the buckets' all_reduce (avg) over shm; median of 5 steps, ms\n"
              "# backward alone: %.1f ms; one all_reduce of every gradient: %.1f ms\n",
              n, double(total) * 4 / (1 << 20), layers.size(), ns_per_elem, out().v[4000], out().v[4001]);
  std::printf("%12s %8s %14s %16s\n", "cap_bytes", "buckets", "overlap_ms", "after_backward_ms");
  for (std::size_t ci = 0; ci < caps.size(); ++ci)
    std::printf("%12zu %8.0f %14.1f %16.1f%s\n", caps[ci], out().v[3 * ci + 2], out().v[3 * ci], out().v[3 * ci + 1],
                ci == best ? "   <- best" : "");
  if (!plot.empty()) {
    const std::string dat = plot + ".dat";
    if (std::FILE* f = std::fopen(dat.c_str(), "w")) {
      for (std::size_t ci = 0; ci < caps.size(); ++ci)
        std::fprintf(f, "%zu %f %f\n", caps[ci], out().v[3 * ci], out().v[3 * ci + 1]);
      std::fclose(f);
    }
    const std::string gp = "set terminal pngcairo size 900,540\nset output '" + plot +
                           "'\nset logscale x 2\nset xlabel 'bucket cap (bytes)'\nset ylabel 'step time (ms)'\n"
                           "set title 'DDP buckets: " + std::to_string(n) + " ranks over shm, " +
                           std::to_string(int(double(total) * 4 / (1 << 20))) + " MiB of gradients'\nset key top left\n"
                           "set label 'best: " + std::to_string(caps[best] >> 10) + " KiB' at " + std::to_string(caps[best]) + "," +
                           std::to_string(out().v[3 * best]) + " point pt 7 ps 2 offset 1,-1\n"
                           "plot '" + dat + "' using 1:2 with linespoints title 'overlapped with backward', '" + dat +
                           "' using 1:3 with linespoints title 'after backward'\n";
    if (std::FILE* g = popen("gnuplot", "w")) {
      std::fputs(gp.c_str(), g);
      if (pclose(g) != 0) std::fprintf(stderr, "collx-train-bench: gnuplot failed\n");
    } else {
      std::fprintf(stderr, "collx-train-bench: no gnuplot (Debian: gnuplot-nox)\n");
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: collx-train-bench overhead|fusion|overlap|buckets [-np N] [--units U] [--ns-per-elem X] [--plot F.png]\n");
    return 2;
  }
  const std::string mode = argv[1];
  int n = 2, units = 5000;
  double ns = 0.5;
  std::string plot;
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "-np") n = std::atoi(argv[i + 1]);
    else if (a == "--units") units = std::atoi(argv[i + 1]);
    else if (a == "--ns-per-elem") ns = std::atof(argv[i + 1]);
    else if (a == "--plot") plot = argv[i + 1];
    else {
      std::fprintf(stderr, "collx-train-bench: unknown flag %s\n", a.c_str());
      return 2;
    }
  }
  if (mode == "overhead") return overhead(n);
  if (mode == "fusion") return fusion(n);
  if (mode == "overlap") return overlap(n, units);
  if (mode == "buckets") return buckets(n, ns, plot);
  std::fprintf(stderr, "collx-train-bench: unknown mode %s\n", mode.c_str());
  return 2;
}
