// The reducing collectives over double tensors (reduce.hpp).
#include "reduce_impl.hpp"

template struct collx_torch::reducer<double>;
