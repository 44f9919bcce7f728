# Reads the PTX of tests/cuda/ptx_probe.cu (-DPTX=file) and fails unless it holds what the device
# path depends on: system-scope acquire loads and release stores / atomics on the peers'
# counters (plan_kernel.cuh), a system-scope fence before a chunk is acknowledged, and 16-byte
# vector loads and stores in the reduction and copy loops (reduce.cuh).
file(READ "${PTX}" ptx)
set(missing "")
foreach(pattern
    "ld\\.acquire\\.sys\\.b64"
    "st\\.release\\.sys\\.b64"
    "atom\\.add\\.release\\.sys\\.u64"
    "(membar\\.sys|fence\\.sc\\.sys)"
    "ld\\.global\\.v4\\."
    "st\\.global\\.v4\\."
    "add(\\.rn)?\\.f16x2")
  if(NOT ptx MATCHES "${pattern}")
    list(APPEND missing "${pattern}")
  endif()
endforeach()
if(missing)
  message(FATAL_ERROR "the PTX of ${PTX} lacks: ${missing}")
endif()
message(STATUS "the PTX holds every instruction looked for")
