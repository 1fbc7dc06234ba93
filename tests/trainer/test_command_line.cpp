// primecfg-train's command line: its own options and the training config, told apart
// by the flag's first name and then each read through primecfg.
#include "command_line.hpp"
#include "options.hpp"

#include <primecfg/cli.hpp>
#include <primecfg/report.hpp>
#include <primecfg/sft.hpp>
#include <primecfg/trainer.hpp>

#include <doctest/doctest.h>

#include <string>
#include <vector>

using namespace primecfg;
namespace train = primecfg::train;

namespace {

std::vector<std::string> v(std::initializer_list<const char*> a) { return {a.begin(), a.end()}; }

loaded<train::TrainerOptions> options_of(const std::vector<std::string>& args) {
  return load_command_line<train::TrainerOptions>(train::split_command_line(args).options);
}

}  // namespace

TEST_CASE("command line: options and config are told apart, values stay with their flags") {
  auto line = train::split_command_line(
      v({"@", "a.toml", "--device", "cuda:1", "--model.offload=full", "--plan", "--offload.cpu-threads", "8",
         "--no-memory-check", "--data.seq-len", "64", "--options=o.toml", "--profile.cpu-ops", "false"}));
  CHECK(line.config == v({"@", "a.toml", "--model.offload=full", "--data.seq-len", "64"}));
  CHECK(line.options == v({"--device", "cuda:1", "--plan", "--offload.cpu-threads", "8", "--no-memory-check",
                           "@", "o.toml", "--profile.cpu-ops", "false"}));
  auto o = load_command_line<train::TrainerOptions>(line.options);
  // o.toml does not exist: an error that names it, as for a config file.
  CHECK_FALSE(o.ok());
  CHECK(format_text(o.diagnostics, "options").find("o.toml") != std::string::npos);
}

TEST_CASE("command line: options are typed, ranged and checked against each other") {
  auto ok = options_of(v({"--device=cuda:1", "--compute-dtype=fp32", "--offload.ring-mib=64",
                          "--offload.cpu-isa=avx2", "--profile.host-trace=h.json", "--peak-tflops=989"}));
  REQUIRE(ok.ok());
  CHECK(*ok.value.device == "cuda:1");
  CHECK(*ok.value.compute_dtype == train::ComputeDtype::fp32);
  CHECK(*ok.value.offload.ring_bytes() == std::int64_t{64} << 20);
  CHECK(*ok.value.offload.cpu_isa == train::CpuIsa::avx2);
  CHECK(ok.value.memory_check);
  // Each mistake is named, all at once.
  auto bad = options_of(v({"--device=cuda:x", "--compute-dtype=fp64", "--offload.cpu-threads=0",
                           "--plan-gpu-memory=80", "--offload.timeout-s=-1"}));
  CHECK_FALSE(bad.ok());
  const std::string text = format_text(bad.diagnostics, "options");
  CHECK(text.find("cuda:x") != std::string::npos);
  CHECK(text.find("fp64") != std::string::npos);
  CHECK(text.find("cpu_threads") != std::string::npos);
  CHECK(text.find("only applies with --plan") != std::string::npos);
  CHECK(text.find("timeout_s") != std::string::npos);
  // A typo gets a suggestion.
  auto typo = options_of(v({"--offload.ring-mb=64"}));
  CHECK_FALSE(typo.ok());
  CHECK(format_text(typo.diagnostics, "options").find("ring-mib") != std::string::npos);
  CHECK_FALSE(options_of(v({"--plan", "--device=cpu"})).ok());  // --plan models CUDA
  // Gloo may carry CUDA tensors (ranks sharing a GPU); NCCL never carries CPU ones.
  auto gloo = options_of(v({"--device=cuda:0", "--dist.backend=gloo"}));
  REQUIRE(gloo.ok());
  CHECK(*gloo.value.dist.backend == train::DistBackend::gloo);
  auto nccl_cpu = options_of(v({"--device=cpu", "--dist.backend=nccl"}));
  CHECK_FALSE(nccl_cpu.ok());
  CHECK(format_text(nccl_cpu.diagnostics, "options").find("dist.backend") != std::string::npos);
  // The fused kernels, QK-norm + RoPE, the cross-entropy and AdamW among them: on by default;
  // turning the kernels off turns those off too, but asking for one without them is a
  // contradiction.
  auto plain = options_of(v({}));
  REQUIRE(plain.ok());
  CHECK(plain.value.kernels.fused);
  CHECK(plain.value.kernels.norm_rope);
  CHECK(plain.value.kernels.cross_entropy);
  CHECK(plain.value.kernels.adamw);
  auto no_adamw = options_of(v({"--no-kernels.adamw"}));
  REQUIRE(no_adamw.ok());
  CHECK_FALSE(no_adamw.value.kernels.adamw);
  auto adamw_alone = options_of(v({"--kernels.adamw=true", "--kernels.fused=false"}));
  CHECK_FALSE(adamw_alone.ok());
  CHECK(format_text(adamw_alone.diagnostics, "options").find("kernels.adamw") != std::string::npos);
  auto no_ce = options_of(v({"--no-kernels.cross-entropy"}));
  REQUIRE(no_ce.ok());
  CHECK_FALSE(no_ce.value.kernels.cross_entropy);
  auto ce_alone = options_of(v({"--kernels.cross-entropy", "--kernels.fused=false"}));
  CHECK_FALSE(ce_alone.ok());
  CHECK(format_text(ce_alone.diagnostics, "options").find("kernels.cross_entropy") != std::string::npos);
  auto no_rope = options_of(v({"--no-kernels.norm-rope"}));
  REQUIRE(no_rope.ok());
  CHECK_FALSE(no_rope.value.kernels.norm_rope);
  auto unfused = options_of(v({"--kernels.fused=false"}));
  CHECK(unfused.ok());
  auto rope_alone = options_of(v({"--kernels.norm-rope", "--kernels.fused=false"}));
  CHECK_FALSE(rope_alone.ok());
  CHECK(format_text(rope_alone.diagnostics, "options").find("needs kernels.fused") != std::string::npos);
}

TEST_CASE("command line: a flag that names no config field gets the closest option, if one is close") {
  auto config = load_command_line<SFTConfig>(
      train::split_command_line(v({"--offlod.cpu-threads=4", "--plan-gpu-memroy=80", "--model.nmae=x",
                                   "--frobnicate", "--kernel.norm-rope"}))
          .config);
  REQUIRE(config.diagnostics.size() == 5);
  train::suggest_options(config.diagnostics);
  const auto& d = config.diagnostics;
  CHECK(d[0].message.find("did you mean the primecfg-train option '--offload.cpu-threads'?") !=
        std::string::npos);
  CHECK(d[1].message.find("did you mean the primecfg-train option '--plan-gpu-memory'?") !=
        std::string::npos);
  // The config's own suggestion stands; a flag close to nothing gets none.
  CHECK(d[2].message == "'--model.nmae' names no config field; did you mean '--model.name'?");
  CHECK(d[3].message == "'--frobnicate' names no config field");
  CHECK(d[4].message.find("did you mean the primecfg-train option '--kernels.norm-rope'?") !=
        std::string::npos);
}

// Were a name both an option and a config field, the config's flag would be taken for
// the option's: the two sets of top-level names must stay disjoint.
TEST_CASE("command line: no option shares its first name with a field of SFTConfig or TrainerConfig") {
  const auto& options = detail::ops_of<train::TrainerOptions>.record->shape->names;
  for (const auto* root : {&detail::ops_of<SFTConfig>, &detail::ops_of<TrainerConfig>})
    for (const auto& field : root->record->shape->names) {
      CAPTURE(field);
      CHECK(std::find(options.begin(), options.end(), field) == options.end());
      CHECK(field != "options");
    }
}
