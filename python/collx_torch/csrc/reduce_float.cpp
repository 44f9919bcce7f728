// The reducing collectives over float tensors (reduce.hpp).
#include "reduce_impl.hpp"

template struct collx_torch::reducer<float>;
