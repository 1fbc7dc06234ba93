// Activation offloading (model.ac_offloading) on the CPU: the block inputs come back
// as they left, in any window, and a run with it is the run without it, bit for bit,
// in every offload mode.
#include "base/remove_tree.hpp"
#include "nn/activation_offload.hpp"
#include "support.hpp"
#include "trainer.hpp"

#include <doctest/doctest.h>
#include <torch/torch.h>

#include <unistd.h>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

namespace fs = std::filesystem;
using namespace primecfg;
using train::ActivationOffload;

TEST_CASE("activation offloading: each block's input comes back as it left, whatever the window") {
  const std::int64_t blocks = 6;
  for (std::int64_t window : {1, 2, 5, 6, 9}) {
    CAPTURE(window);
    ActivationOffload off(torch::kCPU, blocks, {.pin_memory = true, .max_inflight = window});
    for (int pass = 0; pass < 2; ++pass) {  // the slots are used again by the next micro-batch
      std::vector<torch::Tensor> in;
      std::vector<std::int64_t> handles;
      for (std::int64_t b = 0; b < blocks; ++b) {
        in.push_back(torch::randn({2, 3, 4}));
        handles.push_back(off.stash(in.back(), b));
      }
      for (std::int64_t b = blocks - 1; b >= 0; --b) {
        torch::Tensor back = off.take(handles[static_cast<std::size_t>(b)]);
        CHECK(torch::equal(back, in[static_cast<std::size_t>(b)]));
      }
      CHECK_THROWS_WITH(off.take(handles[0]), doctest::Contains("taken already"));
    }
    // Only the inputs older than the window leave the device: twice, once a pass.
    const std::int64_t bytes = 2 * 3 * 4 * 4;
    const std::int64_t moved = train::block_inputs_offloaded(blocks, window);
    CHECK(off.stats().bytes_to_host == 2 * moved * bytes);
    CHECK(off.stats().bytes_to_device == 2 * moved * bytes);
    CHECK(off.stats().host_bytes == moved * bytes);
  }
}

namespace {

fs::path temp_dir(const std::string& name) {
  auto d = fs::temp_directory_path() / ("primecfg-ac-offload-" + std::to_string(::getpid())) / name;
  primecfg::train::remove_tree(d);
  fs::create_directories(d);
  return d;
}

// Six blocks (the tiny preset has two, too few for a window of blocks to move), random
// weights, reverse text in two micro-batches a step.
SFTConfig six_blocks(Offload mode, const fs::path& model_dir, const fs::path& out) {
  std::ofstream(model_dir / "config.json") << R"({"model_type": "qwen3", "vocab_size": 260, "hidden_size": 64,
    "num_hidden_layers": 6, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
    "intermediate_size": 96, "tie_word_embeddings": true})";
  SFTConfig c;
  c.model.name = model_dir.string();
  c.model.debug = ModelDebugConfig{.random_init = true};
  c.model.offload = mode;
  c.model.compile = std::nullopt;
  c.model.ac = ActivationCheckpointConfig{};
  c.model.ac_offloading = std::nullopt;
  SFTDataConfig d;
  d.seq_len = 48;
  d.batch_size = 4;
  d.micro_batch_size = 2;
  d.seed = 5;
  c.data = d;
  AdamWConfig a;
  a.lr = 2e-3;
  a.max_norm = std::nullopt;  // full offload cannot clip
  c.optim = a;
  c.max_steps = 6;
  c.output_dir = out;
  return c;
}

// The last metrics line's figure "name":value, or -1.
double last_figure(const fs::path& out_dir, const std::string& name) {
  std::ifstream in(out_dir / "metrics.jsonl");
  std::string line, last;
  while (std::getline(in, line)) last = line;
  const auto at = last.find("\"" + name + "\":");
  return at == std::string::npos ? -1 : std::stod(last.substr(at + name.size() + 3));
}

bool same_weights(const train::RunResult& a, const train::RunResult& b) {
  if (a.weights.size() != b.weights.size()) return false;
  for (std::size_t i = 0; i < a.weights.size(); ++i)
    if (a.weights[i].first != b.weights[i].first ||
        a.weights[i].second.size() != b.weights[i].second.size() ||
        std::memcmp(a.weights[i].second.data(), b.weights[i].second.data(), a.weights[i].second.size() * 4))
      return false;
  return true;
}

}  // namespace

// Offloading moves the block inputs and brings them back unchanged: the arithmetic is
// that of checkpointing alone, so losses and weights are equal bit for bit.
TEST_CASE(
    "activation offloading: the same losses and weights as checkpointing alone, in every offload mode") {
  const fs::path model_dir = temp_dir("model");
  train::RunOptions o;
  o.print = false;
  o.collect_weights = true;
  o.device = "cpu";
  for (Offload mode : offload_modes) {
    CAPTURE(mode);
    const auto alone = train::run_sft(six_blocks(mode, model_dir, temp_dir("alone")), o);
    REQUIRE(alone.losses.size() == 6);
    CHECK(alone.losses.back() < alone.losses.front());
    for (std::int64_t window : {1, 2}) {
      CAPTURE(window);
      const fs::path out = temp_dir("offloaded");
      SFTConfig c = six_blocks(mode, model_dir, out);
      c.model.ac_offloading = ActivationOffloadConfig{.max_inflight_activations = window};
      const auto offloaded = train::run_sft(c, o);
      // It moved: the inputs of 6 - window blocks of 2 x 48 tokens x 64 FP32, twice a step.
      const double per_block_gib = 2.0 * 48 * 64 * 4 / (1 << 30);
      CHECK(last_figure(out, "ac_offload_to_host_gib") ==
            doctest::Approx(2 * (6 - window) * per_block_gib).epsilon(1e-3));
      CHECK(offloaded.losses == alone.losses);
      CHECK(same_weights(offloaded, alone));
    }
  }
  primecfg::train::remove_tree(model_dir.parent_path());
}

TEST_CASE("activation offloading: what it cannot do as prime-rl does is refused by name") {
  SFTConfig c;
  c.model.ac = ActivationCheckpointConfig{.freq = 2};
  c.model.ac_offloading = ActivationOffloadConfig{};
  const auto diags = train::check_support(c, {});
  bool named = false;
  for (const auto& d : diags) named = named || (d.level == severity::error && d.path == "model.ac.freq");
  CHECK(named);
  c.model.ac->freq = 1;
  for (const auto& d : train::check_support(c, {})) CHECK(d.path != "model.ac.freq");
}
