// The reducing collectives over std::int8_t tensors (reduce.hpp).
#include "reduce_impl.hpp"

template struct collx_torch::reducer<std::int8_t>;
