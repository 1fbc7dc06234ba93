// SwiGLU, the MLP's gate: out = silu(gate) * up elementwise over n bf16 values, and its
// backward in one pass (dgate and dup together), in FP32 with one rounding to bf16 per
// output (ATen's silu-then-multiply rounds silu(gate) to bf16 in between and keeps it
// for backward: one bf16 tensor of the MLP's width more per block).
#pragma once

#include "launch.hpp"

namespace primecfg::train::kernels {

void swiglu_forward(const bf16* gate, const bf16* up, bf16* out, std::int64_t n, cudaStream_t stream);

// dgate = dout * up * silu'(gate), dup = dout * silu(gate), with
// silu'(g) = sigmoid(g) * (1 + g * (1 - sigmoid(g))).
void swiglu_backward(const bf16* dout, const bf16* gate, const bf16* up, bf16* dgate, bf16* dup,
                     std::int64_t n, cudaStream_t stream);

}  // namespace primecfg::train::kernels
