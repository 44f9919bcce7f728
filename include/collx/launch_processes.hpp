#pragma once
// Moved (issue 34: one folder per floor). This notice stays one release, then goes.
#error "collx: <collx/launch_processes.hpp> is now <collx/launch/processes.hpp> (or include <collx/collx.hpp>, which has everything)"
