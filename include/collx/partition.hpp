#pragma once
// Moved (issue 34: one folder per floor). This notice stays one release, then goes.
#error "collx: <collx/partition.hpp> is now <collx/core/partition.hpp> (or include <collx/collx.hpp>, which has everything)"
