// An architecture is one folder: the GELU test architecture (models/gelu/, registered by
// models/registry.cpp's one line) is read from config.json, trained in every offload mode,
// saved and loaded, counted for MFU and planned, each from its own folder. Every number
// below is computed by hand from its shape, and differs from what the Llama block of the
// same shape would give, so a fall-back to the dense block fails.
#include "base/remove_tree.hpp"
#include "bit_identical.hpp"
#include "model/architecture.hpp"
#include "model/config.hpp"
#include "models/gelu/gelu.hpp"
#include "nn/block.hpp"
#include "nn/transformer.hpp"
#include "planner/planner.hpp"
#include "trainer.hpp"
#include "unfused_assumptions.hpp"

#include <primecfg/cli.hpp>
#include <primecfg/report.hpp>

#include <doctest/doctest.h>

#include <unistd.h>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace fs = std::filesystem;
using namespace primecfg;
namespace train = primecfg::train;
namespace plan = primecfg::train::plan;

namespace {

// The preset: vocabulary 260, hidden 64, 2 blocks, 4 heads (2 for k and v) of 16,
// intermediate 256, tied.
constexpr std::int64_t V = 260, D = 64, L = 2, H = 4, K = 2, dh = 16, I = 256;
constexpr std::int64_t q = H * dh, kv = K * dh;
// A block's matrices: q, k, v, o, fc_in, fc_out (SwiGLU would add I x D more).
constexpr std::int64_t kBlockMatrices = q * D + 2 * kv * D + D * q + 2 * I * D;

train::ModelArgs gelu_args() {
  auto a = train::preset(train::test::kGeluPreset);
  REQUIRE(a);
  return *a;
}

fs::path temp_dir(const std::string& name) {
  auto d = fs::temp_directory_path() / ("primecfg-architecture-test-" + std::to_string(::getpid())) / name;
  train::remove_tree(d);
  fs::create_directories(d);
  return d;
}

SFTConfig config(const std::vector<std::string>& more) {
  std::vector<std::string> args = {"--model.name=" + std::string(train::test::kGeluPreset),
                                   "--data.seq-len=48",
                                   "--data.batch-size=4",
                                   "--data.micro-batch-size=2",
                                   "--data.seed=3",
                                   "--model.compile=None",
                                   "--optim.lr=2e-3",
                                   "--optim.max-norm=None",
                                   "--max-steps=10"};
  args.insert(args.end(), more.begin(), more.end());
  auto cfg = load_command_line<SFTConfig>(args);
  REQUIRE_MESSAGE(cfg.ok(), format_text(cfg.diagnostics, "SFTConfig"));
  return cfg.value;
}

train::RunOptions quiet() {
  train::RunOptions o;
  o.print = false;
  o.collect_weights = true;
  o.device = "cpu";
  return o;
}

}  // namespace

TEST_CASE("architectures: every one has a block, and a test's is found by its model_type and name") {
  for (const train::Architecture* a : train::architectures()) {
    CAPTURE(a->name());
    CHECK(train::has_block(a->name()));
    for (std::string_view t : a->model_types()) CHECK(train::find_architecture(t) == a);
  }
  CHECK(train::find_architecture(train::test::kGeluModelType) == &train::test::gelu_architecture());
  CHECK(train::find_architecture_named(train::test::kGeluName) == &train::test::gelu_architecture());
  CHECK_THROWS_AS(train::add_architecture(train::test::gelu_architecture()), std::logic_error);
}

TEST_CASE("architectures: the test architecture's parameters and FLOPs are its own") {
  const auto a = gelu_args();
  CHECK(&a.architecture() == &train::test::gelu_architecture());
  std::vector<std::string> names;
  for (const auto& p : a.params()) names.push_back(p.name);
  CHECK(std::count(names.begin(), names.end(), "model.layers.1.mlp.fc_in.weight") == 1);
  CHECK(std::none_of(names.begin(), names.end(),
                     [](const std::string& n) { return n.find("gate_proj") != std::string::npos; }));
  CHECK(a.total_params() == V * D + L * (kBlockMatrices + 2 * D) + D);
  // MFU's FLOPs: 6 x (the LM head + the blocks' matrices) + 12 x L x H x dh x T.
  CHECK(a.active_matmul_params() == V * D + L * kBlockMatrices);
  CHECK(a.flops_per_token(48) == 6.0 * (V * D + L * kBlockMatrices) + 12.0 * L * H * dh * 48);
}

TEST_CASE("architectures: the test architecture's config.json is read and written by its folder") {
  const auto a = gelu_args();
  const std::string text = train::hf_config_json(a, "float32");
  CHECK(text.find("\"model_type\": \"primecfg_gelu_test\"") != std::string::npos);
  CHECK(text.find("\"hidden_act\": \"gelu_pytorch_tanh\"") != std::string::npos);
  const auto back = train::parse_hf_config(text, "config.json");
  CHECK(train::computation_differences(a, "written", back, "read").empty());
  CHECK(back.params().size() == a.params().size());
  // Its own keys, compared by its folder.
  auto wider = back;
  wider.intermediate = 512;
  const auto diff = train::computation_differences(a, "a", wider, "b");
  REQUIRE(diff.size() == 1);
  CHECK(diff[0] == "intermediate_size: 256 in a, 512 in b");
  // A key it does not read is refused by name; so is another MLP.
  std::string extra = text;
  extra.insert(extra.find('{') + 1, "\"mlp_bias\": false,");
  CHECK_THROWS_WITH(train::parse_hf_config(extra, "x/config.json"), doctest::Contains("\"mlp_bias\""));
  std::string silu = text;
  silu.replace(silu.find("gelu_pytorch_tanh"), std::strlen("gelu_pytorch_tanh"), "silu");
  CHECK_THROWS_WITH(train::parse_hf_config(silu, "x/config.json"), doctest::Contains("\"hidden_act\""));
}

TEST_CASE("architectures: the test architecture trains in every offload mode, saves and loads back exactly") {
  auto none =
      train::run_sft(config({"--model.offload=none", "--output-dir=" + temp_dir("none").string()}), quiet());
  auto optim = train::run_sft(
      config({"--model.offload=optimizer", "--output-dir=" + temp_dir("optim").string()}), quiet());
  auto full =
      train::run_sft(config({"--model.offload=full", "--output-dir=" + temp_dir("full").string()}), quiet());
  REQUIRE(none.losses.size() == 10);
  CHECK(none.losses.back() < none.losses.front() - 0.3);  // it learns
  // The same update code on the CPU: bit for bit; full's fused CPU update and vocabulary
  // walk: within rounding (test_training.cpp's equivalence case says why 1e-5).
  CHECK(none.losses == optim.losses);
  CHECK(bit_identical(none.weights, optim.weights));
  for (std::size_t i = 0; i < none.losses.size(); ++i)
    CHECK(std::fabs(full.losses[i] - none.losses[i]) <= 1e-5 * none.losses[i]);
  // Every parameter of its folder is trained: the GELU MLP's among them.
  auto has = [&](const char* name) {
    return std::any_of(none.model_weights.begin(), none.model_weights.end(),
                       [&](const auto& w) { return w.first == name; });
  };
  CHECK(has("model.layers.0.mlp.fc_out.weight"));

  // Its checkpoint is an HF directory of its architecture, which loads back exactly.
  const fs::path out = temp_dir("ckpt");
  auto saved = train::run_sft(config({"--output-dir=" + out.string(), "--max-steps=2", "--ckpt"}), quiet());
  const fs::path hf = out / "checkpoints" / "step_2";
  std::stringstream cfg_text;
  cfg_text << std::ifstream(hf / "config.json").rdbuf();
  CHECK(cfg_text.str().find("primecfg_gelu_test") != std::string::npos);
  auto loaded =
      train::run_sft(config({"--model.name=" + hf.string(), "--output-dir=" + temp_dir("load").string(),
                             "--max-steps=1", "--optim.lr=0"}),
                     quiet());
  CHECK(bit_identical(saved.model_weights, loaded.model_weights));
}

TEST_CASE("architectures: --plan takes the test architecture's memory and time terms from its folder") {
  const auto gelu = gelu_args();
  // A Llama block of the very same dimensions, the only block the profile measured.
  auto llama = gelu;
  llama.model_type = "llama";
  std::string profile = R"(
[provenance]
device = "test GPU"
machine = "test host"
measured_at = "2026-12-05"
commit = "test"
torch = "test"
command = "by hand"

[gpu]
peak_tflops = 1.0
memory_gbs = 1000.0
adamw_params_per_s = 1e6

[[gpu.blocks]]
architecture = "ARCH"
hidden = 64
intermediate = 256
heads = 4
kv_heads = 2
head_dim = 16
qk_norm = false
tokens = 48
forward_s = 0.010
backward_s = 0.020

[[gpu.heads]]
hidden = 64
vocab = 260
tied = true
tokens = 48
forward_s = 0.003
backward_s = 0.006

[[gpu.attention]]
seq_len = 48
head_dim = 16
forward_tflops = 1e6
backward_tflops = 1e6

[link]
h2d_gbs = 10
d2h_gbs = 10
h2d_both_gbs = 10
d2h_both_gbs = 10

[host]
cores = 4
threads = 3
memory_gbs = 10.0
adamw_params_per_s = 1e6
adamw_busy_params_per_s = 1e6
sign_sgd_params_per_s = 2e6
sign_sgd_busy_params_per_s = 2e6

[collectives]
intra_node_gbs = 100.0
inter_node_gbs = 10.0
source = "test"
)";
  auto with_block_of = [&](std::string_view arch) {
    std::string t = profile;
    t.replace(t.find("ARCH"), 4, arch);
    return plan::read_profile_text("test", t);
  };
  const auto llama_profile = with_block_of("llama");
  const auto gelu_profile = with_block_of(train::test::kGeluName);
  const auto cfg = config({"--data.micro-batch-size=4", "--model.ac=None", "--model.ac-offloading=None"});
  auto planned = [&](const train::ModelArgs& shape, const plan::MachineProfile& prof) {
    plan::Assumptions a = unfused_assumptions();
    a.fused_rms_norm = true;
    a.profile = &prof;
    a.profile_source = "test";
    a.gpu_capacity = std::int64_t{80} << 30;
    a.host_capacity = std::int64_t{64} << 30;
    return plan::make_plan(cfg, shape, a);
  };

  // Memory: what its block saves per token, by hand for bf16 (dt 2) with the fused RMSNorm
  // (which keeps its input) and ATen's GELU: two norms' inputs, rstds and outputs, q, k, v
  // and the attention output, H logsumexps, fc_in's and the GELU's outputs.
  const std::int64_t dt = 2, N = 4 * 48;
  const std::int64_t saved = 2 * (D * dt + 4 + D * dt) + (2 * q + 2 * kv) * dt + H * 4 + 2 * I * dt;
  const auto p = planned(gelu, llama_profile);
  CHECK(p.activations.per_block_full == N * saved);
  CHECK(planned(llama, llama_profile).activations.per_block_full != N * saved);

  // Time: the profile's Llama block does not time it, whatever its dimensions; it runs at
  // that block's matmul throughput for its own FLOPs, and says so.
  CHECK(plan::block_coverage(llama_profile, gelu) != plan::Coverage::measured);
  CHECK(plan::block_coverage(gelu_profile, gelu) == plan::Coverage::measured);
  const auto& t = *p.mode(Offload::none).time;
  CHECK(std::any_of(t.unsure.begin(), t.unsure.end(), [](const std::string& u) {
    return u.find("no block of architecture \"gelu_test\"") != std::string::npos;
  }));
  // With attention free (the profile's SDPA runs at 10^18 FLOP/s), a block's forward is its
  // matmul work: 10 ms for 48 tokens when measured; by FLOPs, 10 ms x its FLOPs / the
  // Llama block's (which has a third MLP matrix).
  const auto measured = planned(gelu, gelu_profile);
  const auto& m = *measured.mode(Offload::none).time;
  CHECK(std::none_of(m.unsure.begin(), m.unsure.end(),
                     [](const std::string& u) { return u.find("architecture") != std::string::npos; }));
  const double gelu_flops = 2.0 * kBlockMatrices, llama_flops = 2.0 * (kBlockMatrices + I * D);
  CHECK(m.forward - t.forward == doctest::Approx(L * 0.010 * (N / 48.0) * (1 - gelu_flops / llama_flops)));
}

TEST_CASE(
    "architectures: a Qwen3-MoE block's profile key holds its experts; a dense block of its dims is not it") {
  const auto a3b = train::preset("Qwen/Qwen3-30B-A3B");
  REQUIRE(a3b);
  const plan::BlockTiming key = plan::block_key(*a3b);
  CHECK(key.architecture == "qwen3_moe");
  CHECK(key.experts == 128);
  CHECK(key.top_k == 8);
  CHECK(key.moe_intermediate == 768);
  plan::BlockTiming dense = key;
  dense.experts = dense.top_k = dense.moe_intermediate = 0;
  CHECK_FALSE(dense.same_shape(key));
  auto fewer = key;
  fewer.top_k = 4;
  CHECK_FALSE(fewer.same_shape(key));
}

// model.quantization (Transformer::use_fp8): a linear that prime-rl would run in FP8 and
// this architecture's block multiplies by hand (the test block takes raw tensors, not
// nn/linear.hpp's Linear) is an error naming it, never a bf16 layer in silence.
TEST_CASE("architectures: FP8 of a linear the block does not run as one is an error naming it") {
  auto a = gelu_args();
  a.hidden = 128, a.heads = 2, a.kv_heads = 2, a.head_dim = 64;  // every block matrix 128-aligned
  train::Transformer t(a, torch::kCPU, torch::kFloat32, 0);
  CHECK_THROWS_WITH(t.use_fp8({"lm_head"}), doctest::Contains("model.layers.0.self_attn.q_proj.weight"));
  // Kept in bf16 by a pattern, it is not asked for.
  const auto chosen = t.use_fp8({"lm_head", "model\\.layers"});
  CHECK(chosen.size() == static_cast<std::size_t>(L * 6 + 1));
  for (const auto& c : chosen) CHECK_MESSAGE(c.bf16_because, c.module);
}

// The Llama family's block runs its linears as Linears: prime-rl's rule decides which are FP8,
// and a biased one (Qwen2's q, k and v), which prime-rl's FP8 layer would drop the bias of,
// is an error naming it.
TEST_CASE("architectures: the Llama family's FP8 linears are prime-rl's, and a biased one is named") {
  train::ModelArgs a;  // Qwen3-shaped: hidden 128, 4 heads of 32 (k and v 64 wide), intermediate 384
  train::Transformer t(a, torch::kCPU, torch::kFloat32, 0);
  std::vector<std::string> fp8;
  for (const auto& c : t.use_fp8({"lm_head"}))
    if (!c.bf16_because) fp8.push_back(c.module);
  CHECK(fp8 == std::vector<std::string>{"model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.o_proj",
                                        "model.layers.0.mlp.gate_proj", "model.layers.0.mlp.up_proj",
                                        "model.layers.0.mlp.down_proj", "model.layers.1.self_attn.q_proj",
                                        "model.layers.1.self_attn.o_proj", "model.layers.1.mlp.gate_proj",
                                        "model.layers.1.mlp.up_proj", "model.layers.1.mlp.down_proj"});
  a.model_type = "qwen2", a.qkv_bias = true, a.qk_norm = false;
  train::Transformer biased(a, torch::kCPU, torch::kFloat32, 0);
  CHECK_THROWS_WITH(biased.use_fp8({"lm_head"}),
                    doctest::Contains("model.layers.0.self_attn.q_proj would run in FP8 and has a bias"));
  CHECK_NOTHROW(biased.use_fp8({"lm_head", "q_proj"}));
}

// Qwen3-MoE's router is mlp.gate in transformers and mlp.router.gate in prime-rl's class,
// which the default pattern "router" keeps in bf16; without it, a router prime-rl would
// quantise is one the block multiplies in model.moe_router_dtype: an error naming it.
TEST_CASE("architectures: Qwen3-MoE's router goes by prime-rl's name, and is not quantised in silence") {
  auto a = train::preset("primecfg/tiny-moe");
  REQUIRE(a);
  const train::Architecture& arch = a->architecture();
  CHECK(arch.linear_module("model.layers.3.mlp.gate.weight") == "model.layers.3.mlp.router.gate");
  CHECK(arch.linear_module("model.layers.3.mlp.gate_proj.weight") == "model.layers.3.mlp.gate_proj");
  a->hidden = 128, a->heads = 2, a->kv_heads = 1, a->head_dim = 64, a->moe->experts = 128, a->moe->top_k = 2;
  a->moe->intermediate = 128, a->intermediate = 128;
  train::Transformer t(*a, torch::kCPU, torch::kFloat32, 0);
  CHECK_NOTHROW(t.use_fp8({"lm_head", "router"}));
  CHECK_THROWS_WITH(t.use_fp8({"lm_head"}), doctest::Contains("(prime-rl's model.layers.0.mlp.router.gate)"));
}
