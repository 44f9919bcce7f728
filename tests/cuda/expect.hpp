#pragma once
// The GPU test programs' checks (they run without Catch2: tests/gpu/run.sh builds them alone):
// each expect() counts, and a failed one prints its line; main() returns failures == 0.
#include <cstdio>
#include <string>

namespace collx_gpu_test {

inline int failures = 0;
inline int checks = 0;

inline void expect(bool ok, const std::string& what) {
  ++checks;
  if (!ok) {
    ++failures;
    std::printf("FAIL: %s\n", what.c_str());
  }
}

}  // namespace collx_gpu_test
