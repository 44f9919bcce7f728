// The reducing collectives over collx::bfloat16 tensors (reduce.hpp).
#include "reduce_impl.hpp"

template struct collx_torch::reducer<collx::bfloat16>;
