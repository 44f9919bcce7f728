#pragma once
// Moved (issue 34: one folder per floor). This notice stays one release, then goes.
#error "collx: <collx/split_plan.hpp> is now <collx/core/split_plan.hpp> (or include <collx/collx.hpp>, which has everything)"
