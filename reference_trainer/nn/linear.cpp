#include "nn/linear.hpp"

#include "nn/fp8.hpp"

#include <algorithm>

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

std::vector<Tensor> apply_linears(const Tensor& x, std::initializer_list<const Linear*> layers) {
  std::vector<Tensor> out;
  const bool all_fp8 = std::all_of(layers.begin(), layers.end(), [](const Linear* l) { return l->fp8; });
  if (!all_fp8 || layers.size() < 2) {
    for (const Linear* l : layers) out.push_back((*l)(x));
    return out;
  }
  std::vector<Tensor> weights;
  for (const Linear* l : layers) weights.push_back(l->weight);
  const auto in = x.size(-1);
  for (Tensor& y : fp8::linears(x.reshape({-1, in}), weights)) {
    auto sizes = x.sizes().vec();
    sizes.back() = y.size(-1);
    out.push_back(y.view(sizes));
  }
  return out;
}

}  // namespace primecfg::train
