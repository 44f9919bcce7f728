#pragma once
// Moved (issue 34: one folder per floor). This notice stays one release, then goes.
#error "collx: <collx/schedule.hpp> is now <collx/core/schedule.hpp> (or include <collx/collx.hpp>, which has everything)"
