// The reducing collectives over std::uint8_t tensors (reduce.hpp).
#include "reduce_impl.hpp"

template struct collx_torch::reducer<std::uint8_t>;
