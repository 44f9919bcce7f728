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
#include <thread>
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

/// Compute that leaves the core free, as a kernel on an accelerator does: the host waits for a
/// device clock that runs each piece of work after the last. Waits shorter than a sleep's
/// granularity (~60 us here) are carried to the next, so the device time is exact in total.
struct device {
  clk::time_point busy_until = clk::now();
  void run(std::chrono::nanoseconds d) {
    const auto now = clk::now();
    busy_until = std::max(busy_until, now) + d;
  }
  void sync() {  // wait for the work so far
    if (busy_until - clk::now() > std::chrono::microseconds(80)) std::this_thread::sleep_until(busy_until);
    while (clk::now() < busy_until) {
    }
  }
  void sync_loosely() {  // the same, unless what is left is too short to sleep for
    if (busy_until - clk::now() > std::chrono::microseconds(80)) std::this_thread::sleep_until(busy_until);
  }
};

void launch(int n, const std::function<void(comm_t&)>& body) { collx::launch_processes(n, body); }

bool g_cpu_compute = false;  // buckets: backward's compute on the rank's core

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
  // Two kinds of compute of the same length: arithmetic on the rank's core, and a device kernel
  // (the core free meanwhile).
  const double unit_us = [&] {
    const auto t0 = clk::now();
    g_sink = compute(units);
    return std::chrono::duration<double, std::micro>(clk::now() - t0).count();
  }();
  const auto kernel = std::chrono::nanoseconds(std::int64_t(unit_us * 1000));
  launch(n, [&](comm_t& comm) {
    for (std::size_t k = 0; k < sizes.size(); ++k) {
      std::vector<float> v(sizes[k] / sizeof(float), 1.0f);
      const int iters = sizes[k] >= (std::size_t(16) << 20) ? 3 : 10;
      std::vector<double> c, a, both, dc, dboth;
      for (int rep = 0; rep < 7; ++rep) {
        c.push_back(time_us(comm, iters, [&] { g_sink = compute(units); }));
        a.push_back(time_us(comm, iters, [&] { collx::all_reduce(comm, std::span{v}, collx::ops::sum{}); }));
        both.push_back(time_us(comm, iters, [&] {
          auto w = collx::async::all_reduce(comm, std::span{v}, collx::ops::sum{});
          g_sink = compute(units);
          w.wait();
        }));
        dc.push_back(time_us(comm, iters, [&] {
          device d;
          d.run(kernel);
          d.sync();
        }));
        dboth.push_back(time_us(comm, iters, [&] {
          auto w = collx::async::all_reduce(comm, std::span{v}, collx::ops::sum{});
          device d;
          d.run(kernel);
          d.sync();
          w.wait();
        }));
      }
      if (comm.rank() == 0) {
        double* o = out().v + 5 * k;
        o[0] = median(c);
        o[1] = median(a);
        o[2] = median(both);
        o[3] = median(dc);
        o[4] = median(dboth);
      }
    }
  });
  std::printf("# collx-train-bench overlap -np %d: a fixed compute kernel (%.0f us) while an all_reduce (float sum) over shm is\n"
              "# outstanding; median of 7 batches; ratio = t(compute || all_reduce) / (t(compute) + t(all_reduce)).\n"
              "# cpu: arithmetic on the rank's core; device: the same time on a simulated accelerator (the core free)\n",
              n, unit_us);
  std::printf("%10s %10s %10s %12s %9s %10s %12s %9s\n", "bytes", "allred_us", "cpu_us", "cpu||ar_us", "cpu_ratio", "device_us",
              "device||ar", "dev_ratio");
  for (std::size_t k = 0; k < sizes.size(); ++k) {
    const double* o = out().v + 5 * k;
    std::printf("%10zu %10.1f %10.1f %12.1f %9.2f %10.1f %12.1f %9.2f\n", sizes[k], o[1], o[0], o[2], o[2] / (o[0] + o[1]), o[3], o[4],
                o[4] / (o[3] + o[1]));
  }
  return 0;
}

/// A model of ~100 MiB of float gradients in uneven layers (in forward order), as a transformer
/// has them: an embedding, then blocks of two norms (weight and bias each), the attention's qkv
/// and output projections and the MLP's two, each with its bias: 12 tensors a block, 8 of them
/// small.
std::vector<std::size_t> model_layers() {
  constexpr std::size_t h = 512;
  std::vector<std::size_t> l{std::size_t(2) << 20};  // embedding: 8 MiB
  for (int b = 0; b < 7; ++b)
    for (std::size_t x : {h, h, 3 * h * h, 3 * h, h * h, h, h, h, 4 * h * h, 4 * h, 4 * h * h, h}) l.push_back(x);
  l.push_back(h);
  l.push_back(h);  // the final norm
  return l;
}

int buckets(int n, double ns_per_elem, const std::string& plot) {
  const auto layers = model_layers();
  std::size_t total = 0;
  for (auto x : layers) total += x;
  std::vector<std::size_t> caps;
  for (std::size_t c = 64 << 10; c <= (std::size_t(256) << 20); c *= 2) caps.push_back(c);
  // Compute per layer proportional to its size, on a simulated accelerator (the core free, as
  // when backward runs on a GPU); --cpu-compute runs it on the rank's core instead.
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
    device dev;
    auto layer_compute = [&](std::size_t k) {
      if (g_cpu_compute) {
        g_sink = compute(int(double(layers[k]) * ns_per_elem / unit_ns));
      } else {
        dev.run(std::chrono::nanoseconds(std::int64_t(double(layers[k]) * ns_per_elem)));
        dev.sync_loosely();  // the gradient is there (to within a sleep's granularity)
      }
    };
    auto backward_done = [&] {
      if (!g_cpu_compute) dev.sync();
    };
    for (std::size_t ci = 0; ci < caps.size(); ++ci) {
      collx::bucket_options o;
      o.cap_bytes = caps[ci];
      o.first_cap_bytes = std::min<std::size_t>(caps[ci], std::size_t(1) << 20);
      collx::bucket_reducer<collx::transport::shm, float> red(comm, views, o);
      collx::bucket_reducer<collx::transport::shm, float> viewed(comm, views, o);
      viewed.rebind_to_views();  // DDP's gradient_as_bucket_view: backward writes into the buckets
      std::vector<double> with, without, as_views;
      for (int rep = 0; rep < 5; ++rep) {
        as_views.push_back(time_us(comm, 1, [&] {
          for (std::size_t k = layers.size(); k-- > 0;) {
            layer_compute(k);
            viewed.ready(k);
          }
          backward_done();
          viewed.finish();
        }));
        with.push_back(time_us(comm, 1, [&] {  // overlap: each bucket starts as soon as it is complete
          for (std::size_t k = layers.size(); k-- > 0;) {
            layer_compute(k);
            red.ready(k);
          }
          backward_done();
          red.finish();
        }));
        without.push_back(time_us(comm, 1, [&] {  // the same buckets, reduced after backward
          for (std::size_t k = layers.size(); k-- > 0;) layer_compute(k);
          backward_done();
          for (std::size_t k = layers.size(); k-- > 0;) red.ready(k);
          red.finish();
        }));
      }
      if (comm.rank() == 0) {
        out().v[4 * ci] = median(with) / 1000;
        out().v[4 * ci + 1] = median(without) / 1000;
        out().v[4 * ci + 2] = double(red.buckets());
        out().v[4 * ci + 3] = median(as_views) / 1000;
      }
    }
    // Backward alone, and one all_reduce of every gradient at once, for reference.
    std::vector<double> bw, ar;
    std::vector<float> flat(total, 1.0f);
    for (int rep = 0; rep < 5; ++rep) {
      bw.push_back(time_us(comm, 1, [&] {
        for (std::size_t k = layers.size(); k-- > 0;) layer_compute(k);
        backward_done();
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
    if (out().v[4 * ci] < out().v[4 * best]) best = ci;
  std::printf("# collx-train-bench buckets -np %d: a backward pass over %.1f MiB of float gradients in %zu layers (compute\n"
              "# %.2f ns per element, %s), the buckets' all_reduce (avg) over shm; median of 5 steps, ms\n"
              "# backward alone: %.1f ms; one all_reduce of every gradient: %.1f ms\n",
              n, double(total) * 4 / (1 << 20), layers.size(), ns_per_elem,
              g_cpu_compute ? "on the rank's core" : "on a simulated accelerator: the core free", out().v[4000], out().v[4001]);
  std::printf("# overlap: each bucket's all_reduce starts when it is complete; after_backward: the same buckets once\n"
              "# backward is done; views: overlap, backward writing into the buckets (no copies)\n");
  std::printf("%12s %8s %12s %18s %10s\n", "cap_bytes", "buckets", "overlap_ms", "after_backward_ms", "views_ms");
  for (std::size_t ci = 0; ci < caps.size(); ++ci)
    std::printf("%12zu %8.0f %12.1f %18.1f %10.1f%s\n", caps[ci], out().v[4 * ci + 2], out().v[4 * ci], out().v[4 * ci + 1],
                out().v[4 * ci + 3], ci == best ? "   <- best (overlap)" : "");
  if (!plot.empty()) {
    const std::string dat = plot + ".dat";
    if (std::FILE* f = std::fopen(dat.c_str(), "w")) {
      for (std::size_t ci = 0; ci < caps.size(); ++ci)
        std::fprintf(f, "%zu %f %f %f\n", caps[ci], out().v[4 * ci], out().v[4 * ci + 1], out().v[4 * ci + 3]);
      std::fclose(f);
    }
    const std::string gp = "set terminal pngcairo size 900,540\nset output '" + plot +
                           "'\nset logscale x 2\nset format x '%.0b %BB'\nset xlabel 'bucket cap'\nset ylabel 'step time (ms)'\n"
                           "set title 'DDP buckets: " + std::to_string(n) + " ranks over shm, " +
                           std::to_string(int(double(total) * 4 / (1 << 20))) + " MiB of gradients'\nset key top left\n"
                           "set label 'best: " + std::to_string(caps[best] >> 10) + " KiB' at " + std::to_string(caps[best]) + "," +
                           std::to_string(out().v[4 * best]) + " point pt 7 ps 2 offset 1,-1\n"
                           "plot '" + dat + "' using 1:2 with linespoints title 'overlapped with backward', '" + dat +
                           "' using 1:3 with linespoints title 'after backward', '" + dat +
                           "' using 1:4 with linespoints title 'overlapped, gradients as bucket views (no copies)'\n";
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
    std::fprintf(stderr, "usage: collx-train-bench overhead|fusion|overlap|buckets [-np N] [--units U] [--ns-per-elem X] [--cpu-compute] [--plot F.png]\n");
    return 2;
  }
  const std::string mode = argv[1];
  out();  // mapped before the ranks are forked, so they share it
  int n = 2, units = 5000;
  double ns = 1.0;
  std::string plot;
  for (int i = 2; i < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--cpu-compute") {
      g_cpu_compute = true;
      --i;
      continue;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "collx-train-bench: %s needs a value\n", a.c_str());
      return 2;
    }
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
