// The shipped config tree: defaults, the offload refactor, cross-field rules,
// the prime-rl corpus, dump round trips and the JSON Schema.
#include "test_helpers.hpp"

#include <primecfg/dump.hpp>
#include <primecfg/load.hpp>
#include <primecfg/model.hpp>
#include <primecfg/report.hpp>
#include <primecfg/rl.hpp>
#include <primecfg/schema.hpp>
#include <primecfg/sft.hpp>
#include <primecfg/trainer.hpp>

#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

using primecfg::error_kind;
using primecfg::Offload;
using testing::at;
using testing::error_at;
using testing::load_text;

namespace {

const std::filesystem::path corpus =
    std::filesystem::path(PRIMECFG_SOURCE_DIR) / "tests/corpus/prime-rl-configs";

template <class T>
primecfg::loaded<T> load_file(const std::filesystem::path& path) {
  primecfg::sources src;
  src.add_file(path);
  return primecfg::load<T>(src);
}

// Loading the dump of a config gives the same config.
template <class T>
void check_round_trip(const primecfg::loaded<T>& original) {
  std::string dumped = primecfg::dump_toml(original.value, original.provenance);
  primecfg::sources src;
  src.add_text("dumped.toml", dumped);
  auto reread = primecfg::load<T>(src);
  INFO(dumped);
  INFO(primecfg::format_text(reread.diagnostics, "reread"));
  CHECK(reread.ok());
  CHECK(primecfg::to_toml_table(reread.value) == primecfg::to_toml_table(original.value));
}

}  // namespace

TEST_CASE("ModelConfig.offload defaults to optimizer and accepts exactly none, optimizer, full") {
  CHECK(primecfg::ModelConfig{}.offload == Offload::optimizer);
  for (auto [text, mode] :
       {std::pair{"none", Offload::none}, {"optimizer", Offload::optimizer}, {"full", Offload::full}}) {
    auto r = load_text<primecfg::SFTConfig>(std::string("[model]\noffload = \"") + text +
                                            "\"\n[optim]\nmax_norm = \"None\"\n");
    CHECK(r.ok());
    CHECK(r.value.model.offload == mode);
  }
  auto fsdp = load_text<primecfg::SFTConfig>("[model]\noffload = \"fsdp\"\n");
  CHECK(error_at(fsdp, "model.offload").message == "expected one of 'none', 'optimizer', 'full'");
}

TEST_CASE("the four mistakes of one file are reported in one run, each at its line and column") {
  auto r = load_text<primecfg::SFTConfig>(R"([model]
name = "Qwen/Qwen3-0.6B"
offload = "full"
atn = "sdpa"

[optim]
type = "muon"
lr = -1e-5

[data]
type = "fake"
length = "fixd"
)");
  INFO(primecfg::format_text(r.diagnostics, "SFTConfig"));
  CHECK(r.error_count() == 4);
  CHECK(at(error_at(r, "model.atn")) == "test.toml:4:1");
  CHECK(error_at(r, "model.atn").message.find("did you mean 'attn'?") != std::string::npos);
  CHECK(at(error_at(r, "data.length")) == "test.toml:12:10");
  CHECK(at(error_at(r, "optim.lr")) == "test.toml:8:6");
  auto rule = error_at(r, "model.offload");
  CHECK(rule.kind == error_kind::value_error);
  CHECK(at(rule) == "test.toml:3:11");
  CHECK(rule.message.find("optim.type = \"muon\" (set at test.toml:7:8)") != std::string::npos);
}

TEST_CASE("full offload: AdamW and SignSGD only") {
  for (const char* type : {"adamw", "sign_sgd"}) {
    auto ok = load_text<primecfg::SFTConfig>(std::string("[model]\noffload = \"full\"\n[optim]\ntype = \"") +
                                             type + "\"\n");
    CHECK(ok.ok());
  }
  for (const char* type : {"sgd", "muon"}) {
    auto bad = load_text<primecfg::SFTConfig>(std::string("[model]\noffload = \"full\"\n[optim]\ntype = \"") +
                                              type + "\"\n");
    CHECK(error_at(bad, "model.offload").kind == error_kind::value_error);
  }
}

TEST_CASE("full offload: the default clipping is switched off with a note; explicit clipping is an error") {
  auto by_default = load_text<primecfg::SFTConfig>("[model]\noffload = \"full\"\n");
  CHECK(by_default.ok());
  CHECK_FALSE(std::get<primecfg::AdamWConfig>(by_default.value.optim).max_norm.has_value());
  REQUIRE(by_default.diagnostics.size() == 1);
  CHECK(by_default.diagnostics[0].level == primecfg::severity::note);
  CHECK(by_default.diagnostics[0].path == "optim.max_norm");

  auto explicit_norm =
      load_text<primecfg::SFTConfig>("[model]\noffload = \"full\"\n[optim]\nmax_norm = 1.0\n");
  auto e = error_at(explicit_norm, "optim.max_norm");
  CHECK(e.kind == error_kind::value_error);
  CHECK(at(e) == "test.toml:4:12");

  auto explicit_none =
      load_text<primecfg::SFTConfig>("[model]\noffload = \"full\"\n[optim]\nmax_norm = \"None\"\n");
  CHECK(explicit_none.ok());
  CHECK(explicit_none.diagnostics.empty());

  // Other modes keep clipping on.
  auto optimizer = load_text<primecfg::SFTConfig>("");
  CHECK(std::get<primecfg::AdamWConfig>(optimizer.value.optim).max_norm == 1.0);
}

TEST_CASE("the same rules hold for the RL trainer inside an RLConfig, with full paths") {
  auto r = load_text<primecfg::RLConfig>(
      "[trainer.model]\noffload = \"full\"\n[trainer.optim]\ntype = \"muon\"\n");
  auto e = error_at(r, "trainer.model.offload");
  CHECK(e.message.find("trainer.optim.type = \"muon\"") != std::string::npos);
}

TEST_CASE("scheduler warm-up and decay must fit in max_steps") {
  auto r = load_text<primecfg::SFTConfig>(
      "max_steps = 10\n[scheduler]\ntype = \"cosine\"\nwarmup_steps = 8\ndecay_steps = 5\n");
  CHECK(error_at(r, "scheduler.warmup_steps").message ==
        "warm-up plus decay takes 13 steps, more than max_steps = 10");
  CHECK(load_text<primecfg::SFTConfig>(
            "max_steps = 13\n[scheduler]\ntype = \"cosine\"\nwarmup_steps = 8\ndecay_steps = 5\n")
            .ok());
  CHECK(
      load_text<primecfg::SFTConfig>("[scheduler]\ntype = \"linear\"\nwarmup_steps = 800\ndecay_steps = 0\n")
          .ok());  // no max_steps, no decay
}

TEST_CASE("batch size must be a multiple of the micro batch size") {
  auto sft = load_text<primecfg::SFTConfig>("[data]\nbatch_size = 10\nmicro_batch_size = 4\n");
  CHECK(error_at(sft, "data.batch_size").message == "must be a multiple of micro_batch_size = 4");
  auto fake = load_text<primecfg::TrainerConfig>("[data.fake]\nbatch_size = 3\nmicro_batch_size = 2\n");
  CHECK(error_at(fake, "data.fake.batch_size").kind == error_kind::value_error);
}

TEST_CASE("RL shared settings flow into [trainer]; a conflicting trainer value is an error") {
  auto shared = load_text<primecfg::RLConfig>("max_steps = 20\nseq_len = 2048\n[model]\nname = \"m\"\n");
  REQUIRE(shared.ok());
  CHECK(shared.value.trainer.max_steps == 20);
  CHECK(shared.value.trainer.model.seq_len == 2048);
  CHECK(shared.value.trainer.model.name == "m");
  CHECK(shared.source_of("trainer.max_steps").to_string() == "test.toml:1:13");

  auto conflict = load_text<primecfg::RLConfig>("max_steps = 20\n[trainer]\nmax_steps = 10\n");
  CHECK(error_at(conflict, "trainer.max_steps").message.find("conflicts with max_steps = 20") == 0);
}

TEST_CASE("legacy offload keys are unknown and point at primecfg-migrate") {
  auto r = load_text<primecfg::SFTConfig>(
      "[model]\noptim_cpu_offload = false\nfull_offload = true\nfsdp_cpu_offload = false\n");
  CHECK(r.error_count() == 3);
  CHECK(error_at(r, "model.optim_cpu_offload").message ==
        "'model.optim_cpu_offload' was replaced by 'model.offload'; run `primecfg-migrate test.toml`");
  auto rl = load_text<primecfg::RLConfig>("[trainer.model]\nfull_offload = { numa_bind = false }\n");
  CHECK(error_at(rl, "trainer.model.full_offload").message.find("'trainer.model.offload'") !=
        std::string::npos);
}

TEST_CASE("command-line overrides of the shipped tree") {
  auto r = load_text<primecfg::SFTConfig>(
      "", {"--model.offload", "none", "--data.seq-len=4096", "--optim.type=sign_sgd", "--optim.lr", "3e-4",
           "--model.ac", "--no-model.reshard-after-forward"});
  INFO(primecfg::format_text(r.diagnostics, "SFTConfig"));
  REQUIRE(r.ok());
  CHECK(r.value.model.offload == Offload::none);
  CHECK(std::get<primecfg::SFTDataConfig>(r.value.data).seq_len == 4096);
  CHECK(std::get<primecfg::SignSGDConfig>(r.value.optim).lr == 3e-4);
  CHECK(r.value.model.ac.has_value());
  CHECK_FALSE(r.value.model.reshard_after_forward);
}

// --- The corpus ---------------------------------------------------------------

struct corpus_file {
  const char* path;
  char root;  // s = SFTConfig, t = TrainerConfig, r = RLConfig (SOURCES.md)
};

// Every file of commit 559b44772 that has no legacy offload key.
constexpr corpus_file clean_files[] = {
    {"559b44772/configs/basic/reverse-text/rl.toml", 'r'},
    {"559b44772/configs/basic/reverse-text/sft.toml", 's'},
    {"559b44772/configs/basic/wordle/sft.toml", 's'},
    {"559b44772/configs/ci/integration/reverse-text-sft/start.toml", 's'},
    {"559b44772/configs/ci/integration/reverse-text-sft/resume.toml", 's'},
    {"559b44772/configs/ci/integration/reverse-text/start.toml", 'r'},
    {"559b44772/configs/ci/integration/reverse-text-moe/start.toml", 'r'},
    {"559b44772/configs/ci/integration/reverse-text-lora/start.toml", 'r'},
    {"559b44772/configs/ci/slim_sft.toml", 's'},
    {"559b44772/configs/debug/fake/rl.toml", 't'},
    {"559b44772/configs/debug/fake/sft.toml", 's'},
    {"559b44772/examples/basic/reverse-text/rl.toml", 'r'},
    {"559b44772/examples/basic/reverse-text/sft.toml", 's'},
    {"559b44772/examples/basic/wordle/sft.toml", 's'},
    {"559b44772/examples/advanced/glm-4.5-air/search.toml", 'r'},
    {"559b44772/examples/advanced/glm-5.2/swe.toml", 'r'},
    {"559b44772/examples/advanced/nemotron-3-super/swe.toml", 'r'},
    {"559b44772/examples/advanced/qwen3-30b-a3b/math.toml", 'r'},
    {"559b44772/examples/advanced/intellect-3.1/rl.toml", 'r'},
    {"559b44772/examples/advanced/minimax-m2.5/swe.toml", 'r'},
    {"559b44772/examples/vlm_sft_moe/sft.toml", 's'},
    {"559b44772/k8s/prime-rl/examples/reverse-text/train.toml", 't'},
};

// Files of 559b44772 and 9975d8868 that set a legacy key, with how many.
constexpr std::pair<corpus_file, int> legacy_files[] = {
    {{"559b44772/configs/ci/integration/reverse-text-sft/full-offload-resume.toml", 's'}, 2},
    {{"559b44772/configs/debug/concurrency.toml", 'r'}, 2},
    {{"559b44772/examples/advanced/glm-4.5-air/swe.toml", 'r'}, 2},
    {{"9975d8868/examples/advanced/glm-4.5-air/search.toml", 'r'}, 1},
    {{"9975d8868/examples/advanced/glm-5.2/swe-llmd.toml", 'r'}, 1},
    {{"9975d8868/examples/advanced/nemotron-3-super/swe.toml", 'r'}, 1},
};

template <class F>
void with_root(char root, F&& f) {
  if (root == 's') f(primecfg::SFTConfig{});
  if (root == 't') f(primecfg::TrainerConfig{});
  if (root == 'r') f(primecfg::RLConfig{});
}

TEST_CASE("every corpus file without legacy keys validates as its target and survives a dump round trip") {
  for (const corpus_file& file : clean_files) {
    with_root(file.root, [&]<class T>(T) {
      auto r = load_file<T>(corpus / file.path);
      INFO(file.path);
      INFO(primecfg::format_text(r.diagnostics, "config"));
      CHECK(r.ok());
      check_round_trip(r);
    });
  }
}

TEST_CASE("every corpus file with legacy keys fails on exactly those keys, naming the migration") {
  for (const auto& [file, count] : legacy_files) {
    with_root(file.root, [&]<class T>(T) {
      auto r = load_file<T>(corpus / file.path);
      INFO(file.path);
      INFO(primecfg::format_text(r.diagnostics, "config"));
      CHECK(r.error_count() == static_cast<std::size_t>(count));
      for (const auto& d : r.diagnostics) {
        CHECK(d.kind == error_kind::extra_forbidden);
        CHECK(d.message.find("run `primecfg-migrate ") != std::string::npos);
      }
    });
  }
}

TEST_CASE("the dump carries provenance comments and JSON is available") {
  auto r = load_text<primecfg::SFTConfig>("max_steps = 5\n", {"--model.offload=none"});
  std::string dumped = primecfg::dump_toml(r.value, r.provenance);
  CHECK(dumped.find("max_steps = 5  # test.toml:1:13\n") != std::string::npos);
  CHECK(dumped.find("offload = \"none\"  # command line --model.offload\n") != std::string::npos);
  CHECK(dumped.find("\n# lr = 1e-06  # default\n") != std::string::npos);
  check_round_trip(r);
  std::string json = primecfg::dump_json(r.value);
  CHECK(json.find("\"offload\" : \"none\"") != std::string::npos);
}

TEST_CASE("the JSON schema carries types, enums, defaults, bounds, unions and the offload rule") {
  std::string schema = primecfg::json_schema<primecfg::SFTConfig>();
  CHECK(schema.find("\"$schema\" : \"http://json-schema.org/draft-07/schema#\"") != std::string::npos);
  CHECK(schema.find("\"additionalProperties\" : false") != std::string::npos);
  CHECK(schema.find("\"enum\" : [\n") != std::string::npos);
  CHECK(schema.find("\"const\" : \"muon\"") != std::string::npos);
  CHECK(schema.find("\"exclusiveMinimum\" : 0") != std::string::npos);
  CHECK(schema.find("\"default\" : \"optimizer\"") != std::string::npos);
  CHECK(schema.find("\"sign_sgd\"") != std::string::npos);
  CHECK(schema.find("Where FP32 training state lives") != std::string::npos);
}
