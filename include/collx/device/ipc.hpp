#pragma once
// Moved (issue 34: one folder per floor). This notice stays one release, then goes.
#error "collx: <collx/device/ipc.hpp> is now <collx/features/device_ipc.hpp> (or include <collx/collx.hpp>, which has everything)"
