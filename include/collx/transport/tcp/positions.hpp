#pragma once
// Moved (issue 34: one folder per floor). This notice stays one release, then goes.
#error "collx: <collx/transport/tcp/positions.hpp> is now <collx/transport/tcp/desync.hpp> (or include <collx/collx.hpp>, which has everything)"
