#pragma once
// Moved (issue 34: one folder per floor). This notice stays one release, then goes.
#error "collx: <collx/executor.hpp> is now <collx/collectives/executor.hpp> (or include <collx/collx.hpp>, which has everything)"
