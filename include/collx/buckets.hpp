#pragma once
// Moved (issue 34: one folder per floor). This notice stays one release, then goes.
#error "collx: <collx/buckets.hpp> is now <collx/features/buckets.hpp> (or include <collx/collx.hpp>, which has everything)"
