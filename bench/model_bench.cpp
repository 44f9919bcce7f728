// collx-model-bench: what one decision of algo::automatic costs at scale. For N = 64, 256, 1024
// ranks (or -n N ...), every collective the model chooses for and sizes from 8 B to 256 MiB, it
// times model::best() on a new shape (median of --reps runs; every run is a new decision: the
// model keeps nothing between calls) and the most heap it holds meanwhile (this program counts
// every allocation), and prints both beside the pick. The target (issue 11): at N = 1024, at most
// 10 ms and 16 MiB per decision.
//
//   build/bench/collx-model-bench                     # N = 64, 256, 1024
//   build/bench/collx-model-bench -n 1024 --reps 9
#include <collx/algo/calibration.hpp>
#include <collx/algo/model.hpp>

#include "../tools/heap_meter.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  namespace model = collx::model;
  std::vector<int> ns;
  int reps = 5;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "-n" && i + 1 < argc) ns.push_back(std::atoi(argv[++i]));
    else if (a == "--reps" && i + 1 < argc) reps = std::max(1, std::atoi(argv[++i]));
    else {
      std::fprintf(stderr, "usage: collx-model-bench [-n N]... [--reps R]\n");
      return 2;
    }
  }
  if (ns.empty()) ns = {64, 256, 1024};
  const model::params p = model::shipped_defaults("shm");
  std::printf("# one decision of algo::automatic: model::best() on a new shape, median of %d runs, and the most\n"
              "# heap held meanwhile; parameters: %s\n", reps, p.source.c_str());
  std::printf("#%6s %-15s %12s %12s %12s  %s\n", "N", "collective", "bytes", "time(ms)", "heap(KiB)", "pick");
  double worst_ms = 0;
  std::size_t worst_heap = 0;
  for (int n : ns)
    for (model::collective c : model::all_collectives) {
      if (c == model::collective::all_to_all) continue;  // one policy: automatic does not ask the model
      for (std::size_t bytes : {std::size_t(8), std::size_t(64) << 10, std::size_t(4) << 20, std::size_t(256) << 20}) {
        const model::problem pr = model::problem::of_bytes(c, n, std::max(bytes, std::size_t(n) * 4), 4, n / 3, true);
        std::vector<double> ms;
        std::size_t heap = 0;
        model::choice pick{};
        for (int r = 0; r < reps; ++r) {
          const std::size_t base = heap_meter::start();
          const auto t0 = std::chrono::steady_clock::now();
          pick = model::best(pr, p);
          ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
          heap = std::max(heap, heap_meter::held_since(base));
        }
        std::sort(ms.begin(), ms.end());
        const double med = ms[ms.size() / 2];
        worst_ms = std::max(worst_ms, med);
        worst_heap = std::max(worst_heap, heap);
        std::printf("%7d %-15s %12zu %12.3f %12.1f  %s\n", n, model::name(c), pr.bytes(), med, double(heap) / 1024,
                    model::name(pick));
      }
    }
  std::printf("# worst: %.3f ms, %.1f KiB\n", worst_ms, double(worst_heap) / 1024);
  return 0;
}
