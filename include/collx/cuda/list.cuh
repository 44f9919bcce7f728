#pragma once
// THE list of element types and reduction ops the CUDA build instantiates: the one place to add
// a dtype. cmake/cuda_instances.cmake reads the two X(...) lists below (one X per line, as here)
// and generates one translation unit per type for the test and bench builds, each
// instantiating every op that applies to it; COLLX_CUDA_TYPES / COLLX_CUDA_OPS (CMake lists)
// keep a development build to a subset. A user's own TU needs none of this: the kernels are
// templates and instantiate where they are used.
//
// X(name, device element type, integer)   integer: 1 when the bitwise ops apply
#define COLLX_CUDA_TYPES(X)          \
  X(i8, std::int8_t, 1)              \
  X(u8, std::uint8_t, 1)             \
  X(i16, std::int16_t, 1)            \
  X(u16, std::uint16_t, 1)           \
  X(i32, std::int32_t, 1)            \
  X(u32, std::uint32_t, 1)           \
  X(i64, std::int64_t, 1)            \
  X(u64, std::uint64_t, 1)           \
  X(f16, __half, 0)                  \
  X(bf16, __nv_bfloat16, 0)          \
  X(f32, float, 0)                   \
  X(f64, double, 0)                  \
  X(e4m3, __nv_fp8_e4m3, 0)          \
  X(e5m2, __nv_fp8_e5m2, 0)

// X(name, collx op type, integer only)
#define COLLX_CUDA_OPS(X)            \
  X(sum, ::collx::ops::sum, 0)       \
  X(prod, ::collx::ops::prod, 0)     \
  X(min, ::collx::ops::min, 0)       \
  X(max, ::collx::ops::max, 0)       \
  X(avg, ::collx::ops::avg, 0)       \
  X(band, ::collx::ops::band, 1)     \
  X(bor, ::collx::ops::bor, 1)       \
  X(bxor, ::collx::ops::bxor, 1)
