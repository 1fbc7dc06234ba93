// What the fused CUDA kernels' launch functions share: the stream type and the bf16
// element type, declared so that callers (LibTorch code, compiled by the host compiler)
// need no CUDA header, and the .cu files need no LibTorch header.
#pragma once

#include <cstdint>

// CUDA's own declaration (driver_types.h), repeated: a typedef may be declared twice.
typedef struct CUstream_st* cudaStream_t;

namespace primecfg::train::kernels {

// A bf16 value as its 16 bits: LibTorch calls the type c10::BFloat16, CUDA __nv_bfloat16;
// both are these bits, so the pointers are reinterpreted at the boundary.
using bf16 = std::uint16_t;

}  // namespace primecfg::train::kernels
