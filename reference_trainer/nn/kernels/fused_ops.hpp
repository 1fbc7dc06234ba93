// The model's RMSNorm and SwiGLU, on the fused CUDA kernels (rms_norm.hpp, swiglu.hpp)
// where they apply: bf16 tensors on a CUDA device, in a build that has the kernels
// (PRIMECFG_FUSED_KERNELS). Everywhere else, and always on the CPU, they are the ATen
// operators the model used before, called the same way, so those results do not change
// by a bit (the CPU tests compare against transformers and across offload modes).
#pragma once

#include <torch/torch.h>

namespace primecfg::train::fused {

// at::rms_norm(x, {x.size(-1)}, w, eps).
torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& w, double eps);

// silu(gate) * up (same shapes).
torch::Tensor swiglu(const torch::Tensor& gate, const torch::Tensor& up);

// Whether this build has the kernels (compiled by nvcc and linked in).
bool kernels_built();

// Process-wide switch, on by default: off, both functions take the ATen path (tests
// compare the two in one process).
void set_enabled(bool on);
bool enabled();

}  // namespace primecfg::train::fused
