// Small integer transfers between the host and a CUDA device that no copy engine makes:
// a kernel on the current stream reads or writes page-locked host memory mapped into the
// device's address space. The offload pipelines queue thousands of moment copies a step on
// their copy streams, and a copy of a few bytes that the forward needs now (the batch's
// token ids, the experts' token counts) waited behind them for 44 to 84 ms on an H100
// (docs/performance.md, "Where `optimizer`'s MoE step goes"). Through mapped memory it
// waits only for the current stream's own work.
//
// On the CPU both are plain copies. Internal to primecfg-train.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <vector>

namespace primecfg::train::dev {

// `values` as an int64 tensor of `shape` on `device`, written by a kernel on the current
// stream; the host returns at once. Every value must fit in 32 bits (token ids, positions,
// document ids, targets): one that does not is a std::invalid_argument naming it.
torch::Tensor upload_ints(const std::vector<std::int64_t>& values, torch::IntArrayRef shape,
                          torch::Device device);

// An int64 tensor's values on the host, in row-major order. On a CUDA device the current
// stream's work up to here runs first and the calling thread waits for it (not for copies
// on other streams). The values must fit in 32 bits (counts of tokens and rows): they
// cross as int32.
std::vector<std::int64_t> read_back_ints(const torch::Tensor& t);

}  // namespace primecfg::train::dev
