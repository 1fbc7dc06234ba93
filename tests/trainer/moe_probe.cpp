// The routed experts of nn/moe.hpp on inputs a test wrote (moe_test.py): reads
// IN.safetensors (x, router, w1, w3, w2, dy; the settings in its metadata), runs
// moe_forward and its backward with gradient dy, writes OUT.safetensors (y, dx and each
// weight's gradient, and the routing figures).
//
// usage: moe_probe IN OUT
#include "base/safetensors.hpp"
#include "nn/moe.hpp"

#include <iostream>
#include <map>
#include <string>
#include <vector>

using namespace primecfg::train;

int main(int argc, char** argv) try {
  if (argc != 3) {
    std::cerr << "usage: moe_probe IN OUT\n";
    return 2;
  }
  const auto in = safetensors::file::open(argv[1]);
  auto get = [&](const std::string& name) {
    const auto* t = in.find(name);
    if (!t || t->type != safetensors::dtype::F32) throw std::runtime_error("no F32 tensor " + name);
    return torch::from_blob(const_cast<std::byte*>(t->data), t->shape, torch::kFloat32).clone();
  };
  auto setting = [&](const std::string& key) { return std::stoll(in.metadata().at(key)); };
  MoeWeights w{get("router").requires_grad_(),
               {get("w1").requires_grad_()},
               {get("w3").requires_grad_()},
               {get("w2").requires_grad_()}};
  MoeSettings s;
  s.top_k = setting("top_k");
  s.norm_topk_prob = setting("norm_topk_prob") != 0;
  s.grouped = setting("grouped") != 0;
  s.force_balanced = setting("force_balanced") != 0;
  s.recompute_experts = setting("recompute") != 0;
  torch::Tensor x = get("x").requires_grad_();
  MoeStats stats;
  torch::Tensor y = moe_forward(w, s, x, &stats);
  (y * get("dy")).sum().backward();

  std::vector<torch::Tensor> keep;
  std::vector<safetensors::entry> out;
  auto add = [&](const std::string& name, torch::Tensor t) {
    t = t.detach().to(torch::kFloat32).contiguous();
    keep.push_back(t);
    out.push_back(
        {name, safetensors::dtype::F32, t.sizes().vec(), t.data_ptr(), static_cast<std::size_t>(t.nbytes())});
  };
  add("y", y);
  add("dx", x.grad());
  add("drouter", w.router.grad());
  add("dw1", w.w1[0].grad());
  add("dw3", w.w3[0].grad());
  add("dw2", w.w2[0].grad());
  add("tokens_per_expert", stats.tokens_per_expert);
  add("confidence_sum", stats.confidence_sum.reshape({1}));
  safetensors::write(argv[2], out);
  return 0;
} catch (const std::exception& e) {
  std::cerr << "moe_probe: " << e.what() << "\n";
  return 1;
}
