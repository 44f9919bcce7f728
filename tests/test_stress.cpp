// Many collectives back to back, on more ranks than cores, every result checked (stress.hpp).
#include <catch2/catch.hpp>

#include "stress.hpp"

using namespace collx_test;

TEST_CASE("hundreds of back-to-back collectives stay correct when ranks race ahead", "[stress]") {
  for (int n : {2, 3, 8, 13}) {
    CAPTURE(n);
    CHECK(stress<threads>(n, kThreadSanitizer ? 60 : 150) == "");  // (TSan: ~40 s less of CI)
  }
}
