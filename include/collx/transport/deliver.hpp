#pragma once
// Moved (issue 34: one folder per floor). This notice stays one release, then goes.
#error "collx: <collx/transport/deliver.hpp> is now <collx/core/deliver.hpp> (or include <collx/collx.hpp>, which has everything)"
