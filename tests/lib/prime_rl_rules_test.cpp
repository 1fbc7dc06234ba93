// The shipped tree against prime-rl's own rules: shared RL settings, the
// validators of SFTConfig / TrainerConfig / RLConfig, "None" and the command
// line. Each case is an example of one behaviour (docs/prime-rl-rules.md).
#include "test_helpers.hpp"

#include <primecfg/dump.hpp>
#include <primecfg/report.hpp>
#include <primecfg/rl.hpp>
#include <primecfg/sft.hpp>
#include <primecfg/trainer.hpp>

#include <doctest/doctest.h>

#include <filesystem>
#include <string>
#include <variant>
#include <vector>

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

TEST_CASE("scheduler phases against max_steps, per scheduler type (prime-rl's validate_scheduler)") {
  auto linear_idle = load_text<primecfg::SFTConfig>(
      "max_steps = 10\n[scheduler]\ntype = \"linear\"\nwarmup_steps = 0\ndecay_steps = 0\n");
  CHECK(error_at(linear_idle, "scheduler.warmup_steps").message.find("constant") != std::string::npos);
  auto linear_open = load_text<primecfg::SFTConfig>("[scheduler]\ntype = \"linear\"\n");
  CHECK(error_at(linear_open, "scheduler.decay_steps").message ==
        "a linear schedule that decays needs max_steps");
  CHECK(load_text<primecfg::SFTConfig>("max_steps = 20\n[scheduler]\ntype = \"linear\"\n").ok());
  auto cosine_open = load_text<primecfg::SFTConfig>("[scheduler]\ntype = \"cosine\"\n");
  CHECK(error_at(cosine_open, "scheduler.warmup_steps").message == "a cosine schedule needs max_steps");
  auto cosine_long = load_text<primecfg::SFTConfig>("max_steps = 10\n[scheduler]\ntype = \"cosine\"\n");
  CHECK(error_at(cosine_long, "scheduler.warmup_steps").message.find("shorter than max_steps = 10") !=
        std::string::npos);
  CHECK(load_text<primecfg::SFTConfig>("max_steps = 11\n[scheduler]\ntype = \"cosine\"\n").ok());
}

TEST_CASE("context parallelism: flash attention, the custom implementation, seq_len and micro-batches") {
  auto attn = load_text<primecfg::SFTConfig>("[model]\ncp = 2\nattn = \"sdpa\"\n");
  CHECK(error_at(attn, "model.attn").message.find("cp = 2") != std::string::npos);
  auto impl =
      load_text<primecfg::TrainerConfig>("[model]\ncp = 2\nimpl = \"hf\"\nattn = \"flash_attention_2\"\n");
  CHECK(error_at(impl, "model.impl").message.find("context parallelism") != std::string::npos);
  auto seq = load_text<primecfg::SFTConfig>("[model]\ncp = 3\n[data]\nseq_len = 128\n");
  CHECK(error_at(seq, "data.seq_len").message.find("model.cp = 3") != std::string::npos);
  auto mbs = load_text<primecfg::SFTConfig>("[model]\ncp = 2\n[data]\nmicro_batch_size = 2\n");
  CHECK(error_at(mbs, "data.micro_batch_size").message.find("context parallelism") != std::string::npos);
  CHECK(load_text<primecfg::SFTConfig>("[model]\ncp = 2\n").ok());
}

TEST_CASE("expert parallelism and implementation rules") {
  auto ep = load_text<primecfg::SFTConfig>("[model]\nep = 2\nimpl = \"hf\"\nattn = \"flash_attention_2\"\n");
  CHECK(error_at(ep, "model.ep").message.find("custom") != std::string::npos);
  auto deepep = load_text<primecfg::SFTConfig>("[model]\nep_comm_backend = \"deepep\"\n");
  CHECK(error_at(deepep, "model.ep_comm_backend").message.find("ep > 1") != std::string::npos);
  auto clip = load_text<primecfg::SFTConfig>("[model]\nep = 2\nep_comm_backend = \"deepep\"\n");
  REQUIRE(clip.ok());
  CHECK_FALSE(std::get<primecfg::AdamWConfig>(clip.value.optim).max_norm);
  auto fa4 = load_text<primecfg::SFTConfig>("[model]\nimpl = \"hf\"\n");  // attn defaults to auto
  CHECK(error_at(fa4, "model.attn").message.find("flash attention 4") != std::string::npos);
  auto remote = load_text<primecfg::SFTConfig>("[model]\nimpl = \"custom\"\ntrust_remote_code = true\n");
  CHECK(error_at(remote, "model.trust_remote_code").kind == error_kind::value_error);
  auto replay = load_text<primecfg::TrainerConfig>(
      "enable_router_replay = true\n[model]\nimpl = \"hf\"\nattn = \"flash_attention_2\"\n");
  CHECK(error_at(replay, "enable_router_replay").kind == error_kind::value_error);
}

TEST_CASE("model.fused_lm_head_token_chunk_size and model.ep take prime-rl's keywords besides a number") {
  using primecfg::ExpertParallel;
  using primecfg::LmHeadChunking;
  auto disabled = load_text<primecfg::SFTConfig>(
      "[model]\nfused_lm_head_token_chunk_size = \"disabled\"\nep = \"auto\"\nimpl = \"hf\"\n"
      "attn = \"flash_attention_2\"\n");
  INFO(primecfg::format_text(disabled.diagnostics, "SFTConfig"));
  REQUIRE(disabled.ok());  // "auto" passes prime-rl's ep_only_with_custom_impl
  REQUIRE(disabled.value.model.fused_lm_head_token_chunk_size);
  CHECK(disabled.value.model.fused_lm_head_token_chunk_size->is(LmHeadChunking::disabled));
  CHECK(disabled.value.model.ep.is(ExpertParallel::auto_));
  std::string dumped = primecfg::dump_toml(disabled.value, disabled.provenance);
  CHECK(dumped.find("fused_lm_head_token_chunk_size = \"disabled\"") != std::string::npos);
  CHECK(dumped.find("ep = \"auto\"") != std::string::npos);
  auto again = load_text<primecfg::SFTConfig>(dumped);
  REQUIRE(again.ok());
  CHECK(again.value.model.ep.is(ExpertParallel::auto_));

  auto number = load_text<primecfg::SFTConfig>("[model]\nfused_lm_head_token_chunk_size = 1024\nep = 8\n");
  REQUIRE(number.ok());
  CHECK(number.value.model.fused_lm_head_token_chunk_size->number() == 1024);
  CHECK(number.value.model.ep.number() == 8);
  CHECK(error_at(load_text<primecfg::SFTConfig>("[model]\nfused_lm_head_token_chunk_size = 0\n"),
                 "model.fused_lm_head_token_chunk_size")
            .kind == error_kind::greater_than_equal);
  auto typo = load_text<primecfg::SFTConfig>("[model]\nfused_lm_head_token_chunk_size = \"disable\"\n");
  CHECK(error_at(typo, "model.fused_lm_head_token_chunk_size").kind == error_kind::literal_error);
  CHECK(error_at(typo, "model.fused_lm_head_token_chunk_size").message ==
        "expected an integer or one of 'disabled'; did you mean 'disabled'?");
  CHECK(error_at(load_text<primecfg::SFTConfig>("[model]\nep = 1.5\n"), "model.ep").kind ==
        error_kind::int_type);
  CHECK(error_at(load_text<primecfg::SFTConfig>("[model]\nep = \"None\"\n"), "model.ep").kind ==
        error_kind::int_type);
  auto none = load_text<primecfg::SFTConfig>("[model]\nfused_lm_head_token_chunk_size = \"None\"\n");
  REQUIRE(none.ok());
  CHECK_FALSE(none.value.model.fused_lm_head_token_chunk_size);
  // "auto" does not trip validate_ep_comm_backend (prime-rl checks only an integer ep).
  CHECK(load_text<primecfg::SFTConfig>("[model]\nep = \"auto\"\nep_comm_backend = \"deepep\"\n"
                                       "[optim]\nmax_norm = \"None\"\n")
            .ok());

  auto cli = load_text<primecfg::SFTConfig>(
      "", {"--model.ep", "auto", "--model.fused-lm-head-token-chunk-size", "disabled"});
  REQUIRE(cli.ok());
  CHECK(cli.value.model.ep.is(ExpertParallel::auto_));
  CHECK(cli.value.model.fused_lm_head_token_chunk_size->is(LmHeadChunking::disabled));
  auto cli_number = load_text<primecfg::SFTConfig>("", {"--model.ep=4", "--model.impl=custom"});
  REQUIRE(cli_number.ok());
  CHECK(cli_number.value.model.ep.number() == 4);
}

TEST_CASE("Muon's momentum is mu, as in prime-rl; the old name momentum is still read, with a warning") {
  auto mu = load_text<primecfg::SFTConfig>("[optim]\ntype = \"muon\"\nmu = 0.9\n");
  REQUIRE(mu.ok());
  CHECK(std::get<primecfg::MuonConfig>(mu.value.optim).mu == 0.9);
  CHECK(mu.diagnostics.empty());
  auto old = load_text<primecfg::SFTConfig>("[optim]\ntype = \"muon\"\nmomentum = 0.8\n");
  REQUIRE(old.ok());
  CHECK(std::get<primecfg::MuonConfig>(old.value.optim).mu == 0.8);
  CHECK(old.source_of("optim.mu").to_string() == "test.toml:3:12");
  REQUIRE(old.diagnostics.size() == 1);
  CHECK(old.diagnostics[0].level == primecfg::severity::warning);
  CHECK(old.diagnostics[0].path == "optim.momentum");
  CHECK(old.diagnostics[0].message.find("write mu = 0.8") != std::string::npos);
  auto both = load_text<primecfg::SFTConfig>("[optim]\ntype = \"muon\"\nmu = 0.9\nmomentum = 0.8\n");
  CHECK(error_at(both, "optim.mu").message.find("conflicts with optim.momentum = 0.8") == 0);
  auto cli = load_text<primecfg::SFTConfig>("", {"--optim.type", "muon", "--optim.mu", "0.7"});
  REQUIRE(cli.ok());
  CHECK(std::get<primecfg::MuonConfig>(cli.value.optim).mu == 0.7);
  // SGD's momentum keeps its name.
  auto sgd = load_text<primecfg::SFTConfig>("[optim]\ntype = \"sgd\"\nmomentum = 0.5\n");
  REQUIRE(sgd.ok());
  CHECK(sgd.diagnostics.empty());
}

TEST_CASE("defaults: SFT data.batch_size and the W&B project are prime-rl's") {
  auto sft = load_text<primecfg::SFTConfig>("[monitors.wandb]\n");
  REQUIRE(sft.ok());
  CHECK(std::get<primecfg::SFTDataConfig>(sft.value.data).batch_size == 128);
  CHECK(sft.value.monitors.wandb->project == "prime-rl");
  auto rl = load_text<primecfg::RLConfig>("[monitors.wandb]\n[trainer.data.fake]\n");
  REQUIRE(rl.ok());
  CHECK(rl.value.monitors.wandb->project == "prime-rl");
  CHECK(rl.value.trainer.monitors.wandb->project == "prime-rl");
  CHECK(rl.value.trainer.data.fake->batch_size == 2);  // prime-rl's FakeDataLoaderConfig
}

TEST_CASE("[tokenizer], [loss], [heartbeat] and [metrics_server] are declared with prime-rl's defaults") {
  auto trainer = load_text<primecfg::TrainerConfig>(
      "[tokenizer]\nname = \"t\"\nchat_template = \"c.jinja\"\n[loss]\ntype = \"ipo\"\n"
      "[heartbeat]\nurl = \"https://h\"\n[metrics_server]\n");
  INFO(primecfg::format_text(trainer.diagnostics, "TrainerConfig"));
  REQUIRE(trainer.ok());
  CHECK(trainer.value.tokenizer.name == "t");
  CHECK_FALSE(trainer.value.tokenizer.trust_remote_code);
  CHECK(std::get<primecfg::IPOLossConfig>(trainer.value.loss).ipo_threshold == 0.1);
  CHECK(trainer.value.heartbeat->url == "https://h");
  CHECK(trainer.value.metrics_server->port == 8000);
  CHECK(trainer.value.metrics_server->host == "0.0.0.0");
  auto defaults = load_text<primecfg::TrainerConfig>("");
  REQUIRE(defaults.ok());
  const auto& loss = std::get<primecfg::DefaultLossConfig>(defaults.value.loss);
  CHECK(loss.dppo_mask_low == 0.2);
  CHECK(loss.kl_tau == 1e-3);
  CHECK_FALSE(defaults.value.heartbeat);
  CHECK_FALSE(defaults.value.metrics_server);
  CHECK(error_at(load_text<primecfg::TrainerConfig>("[heartbeat]\n"), "heartbeat.url").kind ==
        error_kind::missing);
  CHECK(
      error_at(load_text<primecfg::TrainerConfig>("[loss]\ntype = \"custom\"\n"), "loss.import_path").kind ==
      error_kind::missing);
  auto custom = load_text<primecfg::TrainerConfig>(
      "[loss]\ntype = \"custom\"\nimport_path = \"m.f\"\n[loss.kwargs]\nbeta = 0.1\n");
  REQUIRE(custom.ok());
  auto sft =
      load_text<primecfg::SFTConfig>("[tokenizer]\ntrust_remote_code = true\n[heartbeat]\nurl = \"u\"\n");
  REQUIRE(sft.ok());
  CHECK(sft.value.tokenizer.trust_remote_code == true);
  // RL shares [tokenizer] leaves into [trainer.tokenizer] (prime-rl's propagate_shared_fields).
  auto rl = load_text<primecfg::RLConfig>("[tokenizer]\nchat_template = \"c\"\n");
  REQUIRE(rl.ok());
  CHECK(rl.value.trainer.tokenizer.chat_template == "c");
  auto conflict =
      load_text<primecfg::RLConfig>("[tokenizer]\nname = \"a\"\n[trainer.tokenizer]\nname = \"b\"\n");
  CHECK(error_at(conflict, "trainer.tokenizer.name").message.find("conflicts with tokenizer.name") == 0);
}

TEST_CASE("selective activation checkpointing needs targets and the custom implementation") {
  auto none = load_text<primecfg::SFTConfig>("[model.ac]\nmode = \"selective\"\ntargets = []\n");
  CHECK(error_at(none, "model.ac.targets").message.find("at least one target") != std::string::npos);
  auto hf = load_text<primecfg::SFTConfig>(
      "[model]\nimpl = \"hf\"\nattn = \"flash_attention_2\"\n[model.ac]\nmode = \"selective\"\n");
  CHECK(error_at(hf, "model.impl").message.find("selective") != std::string::npos);
  auto dup = load_text<primecfg::SFTConfig>(
      "[model.ac]\nmode = \"selective\"\ntargets = [\"mlp\", \"norm\", \"mlp\"]\n");
  REQUIRE(dup.ok());
  CHECK(dup.value.model.ac->targets == std::vector<std::string>{"mlp", "norm"});
  auto offload = load_text<primecfg::SFTConfig>("[model.ac_offloading]\n");
  REQUIRE(offload.ok());
  CHECK(offload.value.model.ac);  // turned on with a note
  auto off = load_text<primecfg::SFTConfig>("[model]\nac = \"None\"\n[model.ac_offloading]\n");
  CHECK(error_at(off, "model.ac").kind == error_kind::value_error);
}

TEST_CASE(
    "vision-language models: custom implementation, bfloat16, micro-batch 1, frozen encoder with LoRA") {
  auto r = load_text<primecfg::SFTConfig>("[model.vlm]\n[data]\nmicro_batch_size = 2\nbatch_size = 4\n");
  CHECK(error_at(r, "model.impl").message.find("custom") != std::string::npos);
  CHECK(error_at(r, "model.optimization_dtype").message.find("bfloat16") != std::string::npos);
  CHECK(error_at(r, "model.reduce_dtype").message.find("bfloat16") != std::string::npos);
  CHECK(error_at(r, "data.micro_batch_size").message.find("vision-language") != std::string::npos);
  auto lora = load_text<primecfg::TrainerConfig>(
      "[model]\nimpl = \"custom\"\noptimization_dtype = \"bfloat16\"\nreduce_dtype = \"bfloat16\"\n"
      "[model.vlm]\nfreeze_vision_encoder = false\n[model.lora]\n");
  CHECK(error_at(lora, "model.vlm.freeze_vision_encoder").message.find("LoRA") != std::string::npos);
  auto cp = load_text<primecfg::TrainerConfig>(
      "[model]\nimpl = \"custom\"\ncp = 2\noptimization_dtype = \"bfloat16\"\nreduce_dtype = \"bfloat16\"\n"
      "[model.vlm]\n");
  CHECK(error_at(cp, "model.cp_style").message.find("ulysses") != std::string::npos);
}

TEST_CASE("LoRA and in-memory weight broadcast; RL's NCCL default with [inference]") {
  auto trainer = load_text<primecfg::TrainerConfig>("[model.lora]\n[weight_broadcast]\ntype = \"nccl\"\n");
  CHECK(error_at(trainer, "weight_broadcast.type").message.find("LoRA") != std::string::npos);
  auto shared = load_text<primecfg::RLConfig>("[weight_broadcast]\ntype = \"nccl\"\n[trainer.model.lora]\n");
  CHECK(error_at(shared, "trainer.weight_broadcast.type").message.find("LoRA") != std::string::npos);
  auto nccl = load_text<primecfg::RLConfig>("[inference]\n");
  REQUIRE(nccl.ok());
  CHECK(nccl.value.trainer.weight_broadcast.type == primecfg::WeightBroadcastType::nccl);
  auto lora = load_text<primecfg::RLConfig>("[inference]\n[trainer.model.lora]\n");
  REQUIRE(lora.ok());
  CHECK(lora.value.trainer.weight_broadcast.type == primecfg::WeightBroadcastType::filesystem);
  auto quantized = load_text<primecfg::RLConfig>(
      "[weight_broadcast]\ntype = \"nccl\"\nquantize_in_weight_transfer = true\n[trainer.model]\nimpl = "
      "\"custom\"\n");
  CHECK(error_at(quantized, "weight_broadcast.quantize_in_weight_transfer").message.find("[inference]") !=
        std::string::npos);
}

TEST_CASE("traces need a short run; resume takes a step or a step folder; RL shares resume and model.vlm") {
  auto trace = load_text<primecfg::SFTConfig>("trace_path = \"t.json\"\nmax_steps = 50\n");
  CHECK(error_at(trace, "trace_path").message.find("max_steps < 10") != std::string::npos);
  auto both = load_text<primecfg::SFTConfig>("[resume]\nstep = 3\ndir = \"runs/a/checkpoints/step_3\"\n");
  CHECK(error_at(both, "resume.dir").message.find("exclude each other") != std::string::npos);
  auto folder = load_text<primecfg::SFTConfig>("[resume]\ndir = \"runs/a/checkpoints\"\n");
  CHECK(error_at(folder, "resume.dir").message.find("step_<N>") != std::string::npos);
  auto rl = load_text<primecfg::RLConfig>(
      "[resume]\nstep = 4\n[model.vlm]\nfreeze_vision_encoder = false\n"
      "[trainer.model]\nimpl = \"custom\"\noptimization_dtype = \"bfloat16\"\n"
      "reduce_dtype = \"bfloat16\"\n");
  INFO(primecfg::format_text(rl.diagnostics, "RLConfig"));
  REQUIRE(rl.ok());
  CHECK(rl.value.trainer.resume->step == 4);
  CHECK_FALSE(rl.value.trainer.model.vlm->freeze_vision_encoder);
  auto offline = load_text<primecfg::RLConfig>("[monitors.wandb]\noffline = true\n");
  CHECK(error_at(offline, "monitors.wandb.offline").kind == error_kind::value_error);
}

TEST_CASE("RL: the trainer writes to output_dir / run.dir; [log] and [monitors.wandb] reach the trainer") {
  auto named = load_text<primecfg::RLConfig>("output_dir = \"/runs\"\n[run]\nname = \"exp\"\n");
  REQUIRE(named.ok());
  CHECK(named.value.trainer.output_dir == std::filesystem::path("/runs/exp"));
  CHECK(named.source_of("trainer.output_dir").to_string() == "test.toml:3:8");
  auto folder = load_text<primecfg::RLConfig>("[run]\nname = \"exp\"\ndir = \"exp-2\"\n");
  REQUIRE(folder.ok());
  CHECK(folder.value.trainer.output_dir == std::filesystem::path("outputs/exp-2"));
  auto same =
      load_text<primecfg::RLConfig>("[run]\nname = \"exp\"\n[trainer]\noutput_dir = \"outputs/exp\"\n");
  CHECK(same.ok());
  auto conflict =
      load_text<primecfg::RLConfig>("[run]\nname = \"exp\"\n[trainer]\noutput_dir = \"elsewhere\"\n");
  CHECK(error_at(conflict, "trainer.output_dir").message.find("output_dir / run.dir") != std::string::npos);
  // Without run.name the launcher generates the folder: an explicit trainer folder cannot match it.
  auto unnamed = load_text<primecfg::RLConfig>("[trainer]\noutput_dir = \"elsewhere\"\n");
  CHECK(error_at(unnamed, "trainer.output_dir").message.find("run.name") != std::string::npos);
  CHECK(load_text<primecfg::RLConfig>("").value.trainer.output_dir == std::filesystem::path("outputs"));

  auto log = load_text<primecfg::RLConfig>("[log]\nlevel = \"debug\"\n");
  REQUIRE(log.ok());
  CHECK(log.value.trainer.log.level == primecfg::LogLevel::debug);
  auto log_conflict =
      load_text<primecfg::RLConfig>("[log]\nlevel = \"debug\"\n[trainer.log]\nlevel = \"info\"\n");
  CHECK(error_at(log_conflict, "trainer.log.level").message.find("conflicts with log.level") == 0);

  auto wandb = load_text<primecfg::RLConfig>("[run]\nname = \"exp\"\n[monitors.wandb]\nproject = \"p\"\n");
  REQUIRE(wandb.ok());
  REQUIRE(wandb.value.trainer.monitors.wandb);
  CHECK(wandb.value.trainer.monitors.wandb->project == "p");
  CHECK(wandb.value.trainer.monitors.wandb->name == "exp");  // prime-rl's auto_setup_run_identity
  auto named_run =
      load_text<primecfg::RLConfig>("[run]\nname = \"exp\"\n[monitors.wandb]\nname = \"shown\"\n");
  REQUIRE(named_run.ok());
  CHECK(named_run.value.trainer.monitors.wandb->name == "shown");
  auto bare = load_text<primecfg::RLConfig>("[monitors.wandb]\n");
  REQUIRE(bare.ok());
  CHECK(bare.value.trainer.monitors.wandb);
  auto off = load_text<primecfg::RLConfig>("[monitors]\nwandb = \"None\"\n[trainer.monitors.wandb]\n");
  CHECK(error_at(off, "trainer.monitors.wandb").message.find("\"None\"") != std::string::npos);
  auto wandb_conflict = load_text<primecfg::RLConfig>(
      "[monitors.wandb]\nproject = \"p\"\n[trainer.monitors.wandb]\nproject = \"q\"\n");
  CHECK(error_at(wandb_conflict, "trainer.monitors.wandb.project").message.find("conflicts") == 0);
}

// Every TOML of prime-rl's configs/ and examples/ at 559b44772 (the ones for
// the trainer's entry points; SOURCES.md) validates as its target type; the
// three with legacy offload keys do so after primecfg-migrate (its golden output).
TEST_CASE("every prime-rl config and example at 559b44772 validates as its target type") {
  namespace fs = std::filesystem;
  const fs::path root = fs::path(PRIMECFG_SOURCE_DIR) / "tests/corpus/prime-rl-configs/559b44772";
  const fs::path golden = fs::path(PRIMECFG_SOURCE_DIR) / "tests/migrate/golden/559b44772";
  std::size_t count = 0;
  for (const char* top : {"configs", "examples"}) {
    for (const auto& e : fs::recursive_directory_iterator(root / top)) {
      if (!e.is_regular_file() || e.path().extension() != ".toml") continue;
      std::string rel = fs::relative(e.path(), root).generic_string();
      fs::path file = fs::exists(golden / rel) ? golden / rel : e.path();
      char type = 'r';
      if (rel == "configs/debug/fake/rl.toml") type = 't';
      if (e.path().filename() == "sft.toml" || rel.find("reverse-text-sft") != std::string::npos ||
          rel.find("slim_sft") != std::string::npos)
        type = 's';
      auto check = [&]<class T>(T) {
        primecfg::sources src;
        src.add_file(file);
        auto r = primecfg::load<T>(src);
        INFO(rel, " as ", type);
        INFO(primecfg::format_text(r.diagnostics, "config"));
        CHECK(r.ok());
      };
      if (type == 'r') check(primecfg::RLConfig{});
      if (type == 's') check(primecfg::SFTConfig{});
      if (type == 't') check(primecfg::TrainerConfig{});
      ++count;
    }
  }
  CHECK(count == 61);  // 64 at that commit, less two inference-server files and one evals file
}

TEST_CASE("SFT data: one split and one probability per subset (prime-rl's validate_subsets_and_splits)") {
  auto ok = load_text<primecfg::SFTConfig>(
      "[data]\nsubsets = [\"a\", \"b\"]\nsplits = [\"train\", \"test\"]\nprobabilities = [0.5, 0.5]\n"
      "stopping_strategy = \"first_exhausted\"\nnum_workers = 4\n");
  INFO(primecfg::format_text(ok.diagnostics, "SFTConfig"));
  REQUIRE(ok.ok());
  const auto& d = std::get<primecfg::SFTDataConfig>(ok.value.data);
  CHECK(d.stopping_strategy == primecfg::StoppingStrategy::first_exhausted);
  CHECK(d.num_workers == 4);
  auto splits = load_text<primecfg::SFTConfig>("[data]\nsubsets = [\"a\", \"b\"]\nsplits = [\"train\"]\n");
  CHECK(error_at(splits, "data.splits").message ==
        "has 1 entries but data.subsets has 2; give one split for each");
  auto probabilities =
      load_text<primecfg::SFTConfig>("[data]\nsplits = [\"train\", \"test\"]\nprobabilities = [1.0]\n");
  CHECK(error_at(probabilities, "data.probabilities").message.find("data.splits has 2") != std::string::npos);
  // Without subsets or splits prime-rl checks nothing (probabilities alone are not interleaved).
  CHECK(load_text<primecfg::SFTConfig>("[data]\nprobabilities = [1.0, 2.0]\n").ok());
  auto strategy = load_text<primecfg::SFTConfig>("[data]\nstopping_strategy = \"longest\"\n");
  CHECK(error_at(strategy, "data.stopping_strategy").kind == error_kind::literal_error);
  auto workers = load_text<primecfg::SFTConfig>("[data]\nnum_workers = 0\n");
  CHECK(error_at(workers, "data.num_workers").kind == error_kind::greater_than_equal);
}

TEST_CASE("SFT [val]: validation every 50 steps on its own data, checked like the training data") {
  auto r = load_text<primecfg::SFTConfig>("[val.data]\nname = \"held-out\"\n");
  INFO(primecfg::format_text(r.diagnostics, "SFTConfig"));
  REQUIRE(r.ok());
  REQUIRE(r.value.val);
  CHECK(r.value.val->interval == 50);
  CHECK_FALSE(r.value.val->eval_on_start);
  CHECK(r.value.val->data.name == "held-out");
  CHECK_FALSE(load_text<primecfg::SFTConfig>("").value.val);
  // prime-rl's val.data has no default.
  auto bare = load_text<primecfg::SFTConfig>("[val]\ninterval = 10\n");
  CHECK(error_at(bare, "val.data").kind == error_kind::missing);
  auto interval = load_text<primecfg::SFTConfig>("[val]\ninterval = 0\n[val.data]\n");
  CHECK(error_at(interval, "val.interval").kind == error_kind::greater_than_equal);
  // The rules of the training data hold for the validation data too.
  auto batch = load_text<primecfg::SFTConfig>("[val.data]\nbatch_size = 5\nmicro_batch_size = 2\n");
  CHECK(error_at(batch, "val.data.batch_size").message.find("multiple of micro_batch_size") !=
        std::string::npos);
  auto cp = load_text<primecfg::SFTConfig>(
      "[model]\ncp = 2\n[val.data]\nseq_len = 127\nmicro_batch_size = 2\nbatch_size = 2\n");
  CHECK(error_at(cp, "val.data.seq_len").message.find("model.cp = 2") != std::string::npos);
  CHECK(error_at(cp, "val.data.micro_batch_size").message.find("context parallelism") != std::string::npos);
  auto subsets = load_text<primecfg::SFTConfig>("[val.data]\nsubsets = [\"a\"]\nsplits = []\n");
  CHECK(error_at(subsets, "val.data.splits").kind == error_kind::value_error);
  auto fake = load_text<primecfg::SFTConfig>("[val.data]\ntype = \"fake\"\n");
  CHECK_FALSE(fake.ok());
}

TEST_CASE("[log]: prime-rl's trainer log settings; RL's shared [log] has only level and json_logging") {
  primecfg::LogConfig defaults;
  CHECK(defaults.vf_level == primecfg::LogLevel::info);
  CHECK(defaults.interval == 10.0);
  CHECK(defaults.ranks_filter == std::vector<std::int64_t>{0});
  CHECK_FALSE(defaults.json_logging);
  CHECK_FALSE(defaults.log_data);
  auto r = load_text<primecfg::SFTConfig>(
      "[log]\nvf_level = \"debug\"\njson_logging = true\nlog_data = true\nranks_filter = [0, 1]\ninterval = "
      "2.5\n");
  REQUIRE(r.ok());
  CHECK(r.value.log.ranks_filter == std::vector<std::int64_t>{0, 1});
  CHECK(error_at(load_text<primecfg::SFTConfig>("[log]\ninterval = 0\n"), "log.interval").kind ==
        error_kind::greater_than);

  auto shared = load_text<primecfg::RLConfig>("[log]\njson_logging = true\n");
  REQUIRE(shared.ok());
  CHECK(shared.value.trainer.log.json_logging);
  CHECK(shared.value.trainer.log.level == primecfg::LogLevel::info);  // no shared level: the trainer's own
  CHECK(shared.source_of("trainer.log.json_logging").to_string() == "test.toml:2:16");
  auto conflict =
      load_text<primecfg::RLConfig>("[log]\njson_logging = true\n[trainer.log]\njson_logging = false\n");
  CHECK(error_at(conflict, "trainer.log.json_logging").message.find("conflicts with log.json_logging") == 0);
  auto vf = load_text<primecfg::RLConfig>("[log]\nvf_level = \"debug\"\n");
  CHECK(error_at(vf, "log.vf_level").kind == error_kind::extra_forbidden);
}

TEST_CASE("[monitors]: the JSONL file is on by default; RL shares it and W&B's entity, group and tags") {
  auto plain = load_text<primecfg::SFTConfig>("");
  REQUIRE(plain.value.monitors.file);
  CHECK(plain.value.monitors.file->path == std::filesystem::path("metrics.jsonl"));
  CHECK_FALSE(load_text<primecfg::SFTConfig>("[monitors]\nfile = \"None\"\n").value.monitors.file);

  auto shared = load_text<primecfg::RLConfig>(
      "[monitors.file]\npath = \"m.jsonl\"\n[monitors.wandb]\nentity = \"team\"\ngroup = \"g\"\ntags = "
      "[\"a\", "
      "\"b\"]\n");
  INFO(primecfg::format_text(shared.diagnostics, "RLConfig"));
  REQUIRE(shared.ok());
  CHECK(shared.value.trainer.monitors.file->path == std::filesystem::path("m.jsonl"));
  const auto& wandb = *shared.value.trainer.monitors.wandb;
  CHECK(wandb.entity == "team");
  CHECK(wandb.group == "g");
  CHECK(wandb.tags == std::vector<std::string>{"a", "b"});
  // RL's shared file sink is off unless written; "None" turns the trainer's off.
  CHECK(load_text<primecfg::RLConfig>("").value.trainer.monitors.file);
  CHECK_FALSE(load_text<primecfg::RLConfig>("[monitors]\nfile = \"None\"\n").value.trainer.monitors.file);
  auto conflict = load_text<primecfg::RLConfig>(
      "[monitors.file]\npath = \"m.jsonl\"\n[trainer.monitors.file]\npath = \"other.jsonl\"\n");
  CHECK(error_at(conflict, "trainer.monitors.file.path").message.find("conflicts") == 0);
  auto off = load_text<primecfg::RLConfig>("[monitors.file]\n[trainer.monitors]\nfile = \"None\"\n");
  CHECK(error_at(off, "trainer.monitors.file").message.find("monitors.file") != std::string::npos);
}

TEST_CASE("weight broadcast over NIXL: its own port and session; each type takes only its fields") {
  auto nixl = load_text<primecfg::TrainerConfig>("[weight_broadcast]\ntype = \"nixl\"\nsession_id = \"s\"\n");
  INFO(primecfg::format_text(nixl.diagnostics, "TrainerConfig"));
  REQUIRE(nixl.ok());
  CHECK(nixl.value.weight_broadcast.port == 8001);  // prime-rl's NIXL default (NCCL's is 29501)
  CHECK(nixl.value.weight_broadcast.session_id == "s");
  auto port = load_text<primecfg::TrainerConfig>("[weight_broadcast]\ntype = \"nixl\"\nport = 9000\n");
  REQUIRE(port.ok());
  CHECK(port.value.weight_broadcast.port == 9000);
  auto session =
      load_text<primecfg::TrainerConfig>("[weight_broadcast]\ntype = \"nccl\"\nsession_id = \"s\"\n");
  CHECK(error_at(session, "weight_broadcast.session_id").message ==
        "belongs to weight_broadcast.type \"nixl\", not \"nccl\"");
  auto quantized = load_text<primecfg::TrainerConfig>(
      "[weight_broadcast]\ntype = \"nixl\"\nquantize_in_weight_transfer = true\n");
  CHECK(error_at(quantized, "weight_broadcast.quantize_in_weight_transfer").message.find("\"nccl\"") !=
        std::string::npos);
  auto filesystem = load_text<primecfg::TrainerConfig>("[weight_broadcast]\nport = 29501\n");
  CHECK(error_at(filesystem, "weight_broadcast.port").message.find("not \"filesystem\"") !=
        std::string::npos);
  auto lora = load_text<primecfg::TrainerConfig>("[model.lora]\n[weight_broadcast]\ntype = \"nixl\"\n");
  CHECK(error_at(lora, "weight_broadcast.type").message.find("LoRA") != std::string::npos);
  // RL: a shared NIXL table reaches the trainer; the inference world size is the launcher's.
  auto rl = load_text<primecfg::RLConfig>("[weight_broadcast]\ntype = \"nixl\"\n");
  REQUIRE(rl.ok());
  CHECK(rl.value.trainer.weight_broadcast.type == primecfg::WeightBroadcastType::nixl);
  CHECK(rl.value.trainer.weight_broadcast.port == 8001);
  auto world =
      load_text<primecfg::RLConfig>("[weight_broadcast]\ntype = \"nccl\"\ninference_world_size = 2\n");
  CHECK(error_at(world, "weight_broadcast.inference_world_size").message.find("[inference]") !=
        std::string::npos);
  // SFT: the transport of online evals; NIXL is refused there.
  auto sft = load_text<primecfg::SFTConfig>("[eval]\n[weight_broadcast]\ntype = \"nixl\"\n");
  CHECK(error_at(sft, "weight_broadcast.type").message.find("online evals") != std::string::npos);
  CHECK(load_text<primecfg::SFTConfig>("[eval]\n[weight_broadcast]\ntype = \"nccl\"\n").ok());
}

TEST_CASE("rollout transport: ZMQ by default; RL's shared [rollout_transport] reaches the trainer") {
  auto plain = load_text<primecfg::TrainerConfig>("");
  const auto& zmq = std::get<primecfg::ZMQTransportConfig>(plain.value.rollout_transport);
  CHECK(zmq.host == "localhost");
  CHECK(zmq.port == 5555);
  CHECK(zmq.hwm == 10);
  auto fs = load_text<primecfg::TrainerConfig>("[rollout_transport]\ntype = \"filesystem\"\n");
  REQUIRE(fs.ok());
  CHECK(std::holds_alternative<primecfg::FileSystemTransportConfig>(fs.value.rollout_transport));
  auto extra = load_text<primecfg::TrainerConfig>("[rollout_transport]\ntype = \"filesystem\"\nport = 1\n");
  CHECK(error_at(extra, "rollout_transport.port").kind == error_kind::extra_forbidden);
  auto shared = load_text<primecfg::RLConfig>("[rollout_transport]\ntype = \"zmq\"\nport = 6000\n");
  INFO(primecfg::format_text(shared.diagnostics, "RLConfig"));
  REQUIRE(shared.ok());
  CHECK(std::get<primecfg::ZMQTransportConfig>(shared.value.trainer.rollout_transport).port == 6000);
  auto conflict = load_text<primecfg::RLConfig>(
      "[rollout_transport]\ntype = \"filesystem\"\n[trainer.rollout_transport]\ntype = \"zmq\"\n");
  CHECK_FALSE(conflict.ok());
}

TEST_CASE("SFT [run]: run.name names an unnamed W&B run (prime-rl's auto_setup_run_identity)") {
  auto r = load_text<primecfg::SFTConfig>("[run]\nname = \"exp\"\n[monitors.wandb]\n");
  REQUIRE(r.ok());
  CHECK(r.value.monitors.wandb->name == "exp");
  auto named = load_text<primecfg::SFTConfig>("[run]\nname = \"exp\"\n[monitors.wandb]\nname = \"shown\"\n");
  CHECK(named.value.monitors.wandb->name == "shown");
}

TEST_CASE("the default dump carries prime-rl's defaults of the new fields") {
  auto r = load_text<primecfg::SFTConfig>("");
  std::string dump = primecfg::dump_toml(r.value, r.provenance);
  for (const char* line : {"num_workers = 1", "stopping_strategy = \"all_exhausted\"", "ranks_filter = [0]",
                           "vf_level = \"info\"", "interval = 10.0", "path = \"metrics.jsonl\""})
    CHECK_MESSAGE(dump.find(line) != std::string::npos, line);
}

TEST_CASE("FP8 quantization keeps prime-rl's high-precision modules and grouped-GEMM default") {
  auto r = load_text<primecfg::SFTConfig>("[model.quantization]\nignore_patterns = [\"lm_head\"]\n");
  REQUIRE(r.ok());
  CHECK(r.value.model.quantization->enable_grouped_gemm);
  CHECK(r.value.model.quantization->ignore_patterns == std::vector<std::string>{"lm_head"});
  primecfg::QuantizationConfig defaults;
  CHECK(defaults.ignore_patterns.size() == 8);
  CHECK(defaults.ignore_patterns[2] == "mlp\\.gate\\.");
}

TEST_CASE("env_vars refuses the variables the launcher sets (prime-rl's reject_protected_env_vars)") {
  auto sft = load_text<primecfg::SFTConfig>("[env_vars]\nHF_HOME = \"/h\"\nCUDA_VISIBLE_DEVICES = \"0,1\"\n");
  auto e = error_at(sft, "env_vars.CUDA_VISIBLE_DEVICES");
  CHECK(e.message.find("CUDA_VISIBLE_DEVICES is set by the launcher") == 0);
  CHECK(e.where.to_string() == "test.toml:3:24");
  CHECK(sft.error_count() == 1);  // HF_HOME is fine
  for (const char* name : {"PRL_RUN_ID", "PRL_RUN_NAME", "WANDB_RUN_ID", "WANDB_SHARED_MODE",
                           "WANDB_SHARED_LABEL", "WANDB_SHARED_PRIMARY", "WANDB_SHARED_FINISHER"}) {
    CAPTURE(name);
    auto flag = load_text<primecfg::TrainerConfig>("", {std::string("--env-vars.") + name + "=x"});
    CHECK(error_at(flag, std::string("env_vars.") + name).where.to_string() ==
          std::string("command line --env-vars.") + name);
  }
  auto rl = load_text<primecfg::RLConfig>(
      "[env_vars]\nWANDB_RUN_ID = \"a\"\n[trainer.env_vars]\nPRL_RUN_ID = \"b\"\n");
  CHECK(error_at(rl, "env_vars.WANDB_RUN_ID").kind == error_kind::value_error);
  CHECK(error_at(rl, "trainer.env_vars.PRL_RUN_ID").kind == error_kind::value_error);
  CHECK(load_text<primecfg::RLConfig>("[env_vars]\nCUDA_LAUNCH_BLOCKING = \"1\"\n").ok());
}
