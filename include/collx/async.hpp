#pragma once
// Moved (issue 34: one folder per floor). This notice stays one release, then goes.
#error "collx: <collx/async.hpp> is now <collx/features/async.hpp> (or include <collx/collx.hpp>, which has everything)"
