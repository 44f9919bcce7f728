#pragma once
// Moved (issue 34: one folder per floor). This notice stays one release, then goes.
#error "collx: <collx/environment.hpp> is now <collx/core/job_env.hpp> (or include <collx/collx.hpp>, which has everything)"
