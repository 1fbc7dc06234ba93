// The shipped tree against prime-rl's own rules: shared RL settings, the
// validators of SFTConfig / TrainerConfig / RLConfig, "None" and the command
// line. Each case is an example of one behaviour (docs/prime-rl-rules.md).
#include "test_helpers.hpp"

#include <primecfg/report.hpp>
#include <primecfg/rl.hpp>
#include <primecfg/sft.hpp>
#include <primecfg/trainer.hpp>

#include <doctest/doctest.h>

using primecfg::error_kind;
using testing::error_at;
using testing::load_text;

TEST_CASE("RL: a shared max_steps is applied before the trainer's scheduler rule runs") {
  auto r = load_text<primecfg::RLConfig>(
      "max_steps = 5\n[trainer.scheduler]\ntype = \"cosine\"\nwarmup_steps = 8\n");
  CHECK(r.value.trainer.max_steps == 5);
  CHECK(error_at(r, "trainer.scheduler.warmup_steps").message.find("max_steps = 5") != std::string::npos);
}

TEST_CASE("RL: several keys of a shared [ckpt] all reach [trainer.ckpt] without conflicting") {
  auto r = load_text<primecfg::RLConfig>("[ckpt]\ninterval = 5\nkeep_last = 3\n");
  INFO(primecfg::format_text(r.diagnostics, "RLConfig"));
  REQUIRE(r.ok());
  REQUIRE(r.value.trainer.ckpt);
  CHECK(r.value.trainer.ckpt->interval == 5);
  CHECK(r.value.trainer.ckpt->keep_last == 3);
  CHECK(r.source_of("trainer.ckpt.keep_last").to_string() == "test.toml:3:13");
}

TEST_CASE("RL: a shared [ckpt] and a trainer value for another key combine; the same key must agree") {
  auto r = load_text<primecfg::RLConfig>("[ckpt]\ninterval = 5\n[trainer.ckpt]\nkeep_last = 2\n");
  REQUIRE(r.ok());
  CHECK(r.value.trainer.ckpt->interval == 5);
  CHECK(r.value.trainer.ckpt->keep_last == 2);
  auto conflict = load_text<primecfg::RLConfig>("[ckpt]\ninterval = 5\n[trainer.ckpt]\ninterval = 7\n");
  CHECK(error_at(conflict, "trainer.ckpt.interval").message.find("conflicts with ckpt.interval = 5") == 0);
}

TEST_CASE("RL: trainer.ckpt = \"None\" against a shared [ckpt] is an error, not switched back on") {
  auto r = load_text<primecfg::RLConfig>("[ckpt]\ninterval = 5\n[trainer]\nckpt = \"None\"\n");
  CHECK_FALSE(r.value.trainer.ckpt);
  CHECK(error_at(r, "trainer.ckpt").message.find("ckpt (set at test.toml:1:1)") != std::string::npos);
}

TEST_CASE("\"None\" for a field that always has a value is an error, not the text \"None\"") {
  auto name = load_text<primecfg::SFTConfig>("[model]\nname = \"None\"\n");
  CHECK(error_at(name, "model.name").kind == error_kind::string_type);
  CHECK(error_at(name, "model.name").message.find("only optional fields") != std::string::npos);
  auto dir = load_text<primecfg::SFTConfig>("output_dir = \"None\"\n");
  CHECK(error_at(dir, "output_dir").kind == error_kind::string_type);
  auto on_cli = load_text<primecfg::SFTConfig>("", {"--model.name", "None"});
  CHECK(error_at(on_cli, "model.name").kind == error_kind::string_type);
  auto rl = load_text<primecfg::RLConfig>("[model]\nname = \"None\"\n");
  CHECK(error_at(rl, "model.name").kind == error_kind::string_type);
  // An optional field still takes "None".
  auto wandb = load_text<primecfg::SFTConfig>("[monitors.wandb]\nname = \"None\"\n");
  CHECK(wandb.ok());
}

TEST_CASE("command line: '--flag true', '--flag false' and '--flag None' work like '--flag=...'") {
  auto off = load_text<primecfg::SFTConfig>("", {"--model.reshard-after-forward", "false"});
  REQUIRE(off.ok());
  CHECK_FALSE(off.value.model.reshard_after_forward);
  auto on = load_text<primecfg::SFTConfig>("", {"--model.trust_remote_code", "true"});
  REQUIRE(on.ok());
  CHECK(on.value.model.trust_remote_code);
  auto none = load_text<primecfg::SFTConfig>("", {"--model.compile", "None"});
  REQUIRE(none.ok());
  CHECK_FALSE(none.value.model.compile);
  // None for a boolean is the same error as --flag=None, not a file named "None".
  auto bad = load_text<primecfg::SFTConfig>("", {"--model.reshard-after-forward", "None"});
  CHECK(error_at(bad, "model.reshard_after_forward").kind == error_kind::bool_type);
  // The bare forms still work.
  auto bare = load_text<primecfg::SFTConfig>("", {"--model.ac", "--no-model.compile"});
  REQUIRE(bare.ok());
  CHECK(bare.value.model.ac);
  CHECK_FALSE(bare.value.model.compile);
}

TEST_CASE("command line: an old offload flag is an error that points to --model.offload") {
  for (std::vector<std::string> args : {std::vector<std::string>{"--model.optim_cpu_offload"},
                                        {"--model.optim-cpu-offload", "false"},
                                        {"--model.fsdp_cpu_offload=true"},
                                        {"--model.full-offload", "true"},
                                        {"--model.full_offload=false"}}) {
    CAPTURE(args[0]);
    auto r = load_text<primecfg::SFTConfig>("", args);
    REQUIRE(r.error_count() == 1);
    CHECK(r.diagnostics[0].kind == error_kind::extra_forbidden);
    CHECK(r.diagnostics[0].message.find("replaced by '--model.offload'") != std::string::npos);
  }
  auto trainer = load_text<primecfg::RLConfig>("", {"--trainer.model.full-offload", "true"});
  REQUIRE(trainer.error_count() == 1);
  CHECK(trainer.diagnostics[0].message.find("replaced by '--trainer.model.offload'") != std::string::npos);
  auto shared = load_text<primecfg::RLConfig>("", {"--model.optim_cpu_offload"});
  REQUIRE(shared.error_count() == 1);
  CHECK(shared.diagnostics[0].message.find("replaced by '--trainer.model.offload'") != std::string::npos);
}
