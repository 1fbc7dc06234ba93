#include "nn/linear.hpp"

#include "nn/fp8.hpp"

namespace primecfg::train {

using torch::Tensor;

Tensor Linear::operator()(const Tensor& x) const {
  if (fp8) {
    // The FP8 matmuls take the tokens as rows of one matrix.
    const auto in = x.size(-1);
    auto sizes = x.sizes().vec();
    sizes.back() = weight.size(0);
    return fp8::linear(x.reshape({-1, in}), weight).view(sizes);
  }
  // A plain matmul where the layer has no bias, as before biases existed.
  return bias.defined() ? at::linear(x, weight, bias) : torch::matmul(x, weight.t());
}

}  // namespace primecfg::train
