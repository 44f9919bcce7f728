// The reducing collectives over std::int16_t tensors (reduce.hpp).
#include "reduce_impl.hpp"

template struct collx_torch::reducer<std::int16_t>;
