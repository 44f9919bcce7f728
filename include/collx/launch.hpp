#pragma once
// Moved (issue 34: one folder per floor). This notice stays one release, then goes.
#error "collx: <collx/launch.hpp> is now <collx/launch/threads.hpp> (or include <collx/collx.hpp>, which has everything)"
