// The reducing collectives over collx::bfloat16, std::int8_t and std::uint8_t tensors (reduce.hpp). The nine element
// types are instantiated in three files: each file parses collx and builds its non-template
// code once (~10 s of g++ -O2), each type adds ~15 s, and the three build in parallel beside
// backend.cpp (~65 s). One file per type took ~225 s of CPU in all, three take ~165.
#include "reduce_impl.hpp"

template struct collx_torch::reducer<collx::bfloat16>;
template struct collx_torch::reducer<std::int8_t>;
template struct collx_torch::reducer<std::uint8_t>;
