// Compiled to PTX only (tests/cuda/CMakeLists.txt), for check_ptx.cmake to read: the plan kernel
// and the reduction kernels whose instructions the device path depends on.
#include <collx/cuda/plan_kernel.cuh>
#include <collx/cuda/reduce.cuh>

template __global__ void collx::cuda::plan_kernel<float, collx::ops::sum>(collx::cuda::plan_args, collx::ops::sum);
template __global__ void collx::cuda::reduce_kernel<float, collx::ops::sum>(collx::ops::sum, float*, const float*, const float*, std::size_t);
template __global__ void collx::cuda::reduce_kernel<__half, collx::ops::sum>(collx::ops::sum, __half*, const __half*, const __half*, std::size_t);
