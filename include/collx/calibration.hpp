#pragma once
// Moved (issue 34: one folder per floor). This notice stays one release, then goes.
#error "collx: <collx/calibration.hpp> is now <collx/algo/calibration.hpp> (or include <collx/collx.hpp>, which has everything)"
