#pragma once
// Moved (issue 34: one folder per floor). This notice stays one release, then goes.
#error "collx: <collx/communicator.hpp> is now <collx/comm/communicator.hpp> (or include <collx/collx.hpp>, which has everything)"
