// nn/fp8.hpp on inputs a test wrote (fp8_test.py).
//
//   fp8_probe cast IN OUT      IN.safetensors holds F32 x and w; OUT gets the e4m3 values
//                              (as F32, which holds every e4m3 value exactly) and the scales
//                              of quantize_rows(x), quantize_blocks(w) and of w transposed,
//                              and both dequantised
//   fp8_probe linear IN OUT    IN holds F32 x [tokens, in], w [out, in], dy [tokens, out];
//                              runs fp8::linear on them in bf16 and its backward with dy;
//                              OUT gets y, dx and dw (as F32)
//   fp8_probe model HF_DIR PATTERNS IN OUT
//                              the HF model in FP32 on the CPU, its linears in FP8 as
//                              Transformer::use_fp8(PATTERNS) decides (a line each: the HF
//                              weight, prime-rl's module name, "fp8" or why not; or the
//                              error on stderr, exit 2); IN holds F32 ids and targets
//                              [1, T], the loss's scale [1] and, for routed experts,
//                              fp8_experts [1] (0 or 1); OUT gets the loss (the sum of the
//                              tokens' cross-entropies x scale) and every gradient
//   fp8_probe decide PATTERNS NAMES
//                              PATTERNS: one regex a line; NAMES: "name out in" a line;
//                              prints "fp8" or why the layer stays bf16, a line each
#include "base/safetensors.hpp"
#include "model/config.hpp"
#include "nn/fp8.hpp"
#include "nn/transformer.hpp"

#include <fstream>
#include <iostream>
#include <string>
#include <utility>
#include <vector>

using namespace primecfg::train;

namespace {

torch::Tensor read_f32(const safetensors::file& in, const std::string& name) {
  const auto* t = in.find(name);
  if (!t || t->type != safetensors::dtype::F32) throw std::runtime_error("no F32 tensor " + name);
  return torch::from_blob(const_cast<std::byte*>(t->data), t->shape, torch::kFloat32).clone();
}

// Each tensor as F32 into one safetensors file.
void write_f32(const char* path, const std::vector<std::pair<std::string, torch::Tensor>>& tensors) {
  std::vector<torch::Tensor> keep;
  std::vector<safetensors::entry> out;
  for (const auto& [name, t0] : tensors) {
    const torch::Tensor t = t0.detach().to(torch::kFloat32).contiguous();
    keep.push_back(t);
    out.push_back(
        {name, safetensors::dtype::F32, t.sizes().vec(), t.data_ptr(), static_cast<std::size_t>(t.nbytes())});
  }
  safetensors::write(path, out);
}

int cast(const char* in_path, const char* out_path) {
  const auto in = safetensors::file::open(in_path);
  const torch::Tensor x = read_f32(in, "x"), w = read_f32(in, "w");
  const fp8::Quantized qx = fp8::quantize_rows(x), qw = fp8::quantize_blocks(w),
                       qwt = fp8::quantize_blocks(w.t().contiguous());
  write_f32(out_path, {{"x_values", qx.values},
                       {"x_scales", qx.scales},
                       {"x_dequantized", fp8::dequantize_rows(qx)},
                       {"w_values", qw.values},
                       {"w_scales", qw.scales},
                       {"w_dequantized", fp8::dequantize_blocks(qw)},
                       {"wt_values", qwt.values},
                       {"wt_scales", qwt.scales}});
  return 0;
}

int linear(const char* in_path, const char* out_path) {
  const auto in = safetensors::file::open(in_path);
  const torch::Tensor x = read_f32(in, "x").to(torch::kBFloat16).requires_grad_(),
                      w = read_f32(in, "w").to(torch::kBFloat16).requires_grad_();
  const torch::Tensor y = fp8::linear(x, w);
  y.backward(read_f32(in, "dy").to(torch::kBFloat16));
  write_f32(out_path, {{"y", y}, {"dx", x.grad()}, {"dw", w.grad()}});
  return 0;
}

std::vector<std::string> read_lines(const char* path) {
  std::vector<std::string> lines;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

int model(const char* dir, const char* patterns_path, const char* in_path, const char* out_path) {
  at::set_num_threads(1);  // one order of each sum, run after run (fp8_test.py runs one thread too)
  const ResolvedModel m = resolve_model(dir);
  Transformer t(m.args, torch::kCPU, torch::kFloat32, 0);
  t.load_hf_weights(dir);
  const auto in = safetensors::file::open(in_path);
  if (m.args.moe) {
    MoeSettings s;  // the per-expert loop: FP8 or not, one expert's rows at a time
    s.grouped = false;
    s.fp8 = read_f32(in, "fp8_experts").item<float>() != 0;
    t.set_moe_settings(s);
  }
  std::vector<Transformer::LinearPrecision> chosen;
  try {
    chosen = t.use_fp8(read_lines(patterns_path));
  } catch (const std::invalid_argument& e) {
    std::cerr << e.what() << "\n";
    return 2;
  }
  for (const auto& c : chosen)
    std::cout << c.weight << " " << c.module << " " << c.bf16_because.value_or("fp8") << "\n";
  const torch::Tensor ids = read_f32(in, "ids").to(torch::kInt64),
                      targets = read_f32(in, "targets").to(torch::kInt64);
  const auto T = ids.size(1);
  const torch::Tensor positions = torch::arange(T, torch::kInt64).unsqueeze(0);
  const torch::Tensor loss = t.loss(t.hidden({ids, positions, std::nullopt}, Recompute::nothing), targets,
                                    read_f32(in, "scale").item<double>(), T);
  loss.backward();
  std::vector<std::pair<std::string, torch::Tensor>> out{{"loss", loss.reshape({1})}};
  for (const NamedParam& p : t.params()) out.emplace_back(p.name, p.tensor.grad());
  write_f32(out_path, out);
  return 0;
}

int decide(const char* patterns_path, const char* names_path) {
  const std::vector<std::string> patterns = read_lines(patterns_path);
  std::ifstream nf(names_path);
  std::string name;
  std::int64_t out_features = 0, in_features = 0;
  while (nf >> name >> out_features >> in_features) {
    const auto why = fp8::stays_bf16(name, out_features, in_features, patterns);
    std::cout << (why ? *why : "fp8") << "\n";
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) try {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (argc == 4 && mode == "cast") return cast(argv[2], argv[3]);
  if (argc == 4 && mode == "linear") return linear(argv[2], argv[3]);
  if (argc == 4 && mode == "decide") return decide(argv[2], argv[3]);
  if (argc == 6 && mode == "model") return model(argv[2], argv[3], argv[4], argv[5]);
  std::cerr << "usage: fp8_probe cast IN OUT | linear IN OUT | decide PATTERNS NAMES | model HF_DIR PATTERNS "
               "IN OUT\n";
  return 2;
} catch (const std::exception& e) {
  std::cerr << "fp8_probe: " << e.what() << "\n";
  return 1;
}
