// The reducing collectives over collx::half tensors (reduce.hpp).
#include "reduce_impl.hpp"

template struct collx_torch::reducer<collx::half>;
