// Issue 16, "nothing lost, nothing silent": a value the user wrote is used,
// or a diagnostic names it. One case per guarantee, on the shipped SFTConfig,
// written as examples (docs/reliability.md#guarantees lists them).
#include "test_helpers.hpp"

#include <primecfg/cli.hpp>
#include <primecfg/dump.hpp>
#include <primecfg/load.hpp>
#include <primecfg/report.hpp>
#include <primecfg/rl.hpp>
#include <primecfg/sft.hpp>

#include <doctest/doctest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

using primecfg::error_kind;
using primecfg::loaded;
using primecfg::severity;
using primecfg::SFTConfig;
using testing::at;
using testing::error_at;

namespace {

// Two files, then the flags.
loaded<SFTConfig> load_two(const std::string& a, const std::string& b, std::vector<std::string> args = {}) {
  primecfg::sources src;
  src.add_text("a.toml", a).add_text("b.toml", b);
  return primecfg::load_command_line<SFTConfig>(args, src);
}

loaded<SFTConfig> load_flags(std::vector<std::string> args) {
  return primecfg::load_command_line<SFTConfig>(args);
}

std::string report(const loaded<SFTConfig>& r) { return primecfg::format_text(r.diagnostics, "SFTConfig"); }

std::vector<primecfg::diagnostic> of_level(const loaded<SFTConfig>& r, severity level) {
  std::vector<primecfg::diagnostic> out;
  for (const auto& d : r.diagnostics)
    if (d.level == level) out.push_back(d);
  return out;
}

}  // namespace

TEST_CASE("a later file that switches [optim] type keeps the fields the new optimizer also has") {
  auto r = load_two("[optim]\nlr = 3e-4\nweight_decay = 0.1\n", "[optim]\ntype = \"muon\"\n");
  INFO(report(r));
  REQUIRE(r.ok());
  const auto& muon = std::get<primecfg::MuonConfig>(r.value.optim);
  CHECK(muon.lr == 3e-4);
  CHECK(muon.weight_decay == 0.1);
  CHECK(muon.mu == 0.95);  // not written anywhere: muon's default
  CHECK(r.source_of("optim.lr").to_string() == "a.toml:2:6");
  CHECK(r.source_of("optim.type").to_string() == "b.toml:2:8");
}

TEST_CASE("an earlier field the new alternative lacks is an error naming both places") {
  auto r = load_two("[optim]\ntype = \"sgd\"\nmomentum = 0.5\n", "[optim]\ntype = \"adamw\"\n");
  INFO(report(r));
  auto e = error_at(r, "optim.momentum");
  CHECK(e.kind == error_kind::extra_forbidden);
  CHECK(at(e) == "a.toml:3:1");
  CHECK(e.message ==
        "optim.momentum was set for optim.type = \"sgd\", but b.toml:2:8 sets optim.type = \"adamw\", which "
        "has no field 'momentum'; remove one of the two");
  CHECK(r.error_count() == 1);
}

TEST_CASE("the same holds for [scheduler] and [data], and for a flag that switches type after a file") {
  auto r = load_two("[scheduler]\ntype = \"linear\"\nwarmup_steps = 5\nmin_lr = 0.0\n", "max_steps = 100\n",
                    {"--scheduler.type=cosine", "--data.type=fake"});
  INFO(report(r));
  CHECK(std::get<primecfg::CosineSchedulerConfig>(r.value.scheduler).warmup_steps == 5);

  auto data = load_two("[data]\nseq_len = 64\nbatch_size = 4\nname = \"x/y\"\n", "", {"--data.type=fake"});
  auto e = error_at(data, "data.name");
  CHECK(at(e) == "a.toml:4:1");
  CHECK(e.message.find("command line --data.type sets data.type = \"fake\"") != std::string::npos);
  CHECK(std::get<primecfg::FakeDataConfig>(data.value.data).seq_len == 64);
  CHECK(std::get<primecfg::FakeDataConfig>(data.value.data).batch_size == 4);
}

TEST_CASE("the order of command-line flags does not matter") {
  auto dump = [](std::vector<std::string> args) {
    auto r = load_flags(args);
    INFO(report(r));
    CHECK(r.ok());
    return primecfg::dump_toml(r.value, {});
  };
  CHECK(dump({"--optim.lr=1", "--optim.type=muon"}) == dump({"--optim.type=muon", "--optim.lr=1"}));
  CHECK(dump({"--optim.momentum=0.5", "--optim.type=sgd"}) ==
        dump({"--optim.type=sgd", "--optim.momentum=0.5"}));
  auto r = load_flags({"--optim.lr=1", "--optim.type=muon"});
  CHECK(std::get<primecfg::MuonConfig>(r.value.optim).lr == 1.0);
  CHECK(r.source_of("optim.lr").to_string() == "command line --optim.lr");
}

TEST_CASE("a value given twice on the command line: the last one wins, and a note says so") {
  auto r = load_flags({"--optim.lr=1e-4", "--max-steps=10", "--optim.lr=2e-4"});
  INFO(report(r));
  REQUIRE(r.ok());
  CHECK(std::get<primecfg::AdamWConfig>(r.value.optim).lr == 2e-4);
  auto notes = of_level(r, severity::note);
  REQUIRE(notes.size() == 1);
  CHECK(notes[0].path == "optim.lr");
  CHECK(notes[0].message ==
        "optim.lr is given twice on the command line: optim.lr = 1e-4 (--optim.lr) and then optim.lr = 2e-4 "
        "(--optim.lr); the last one, 2e-4, is used");
  // The same value twice loses nothing: no note.
  CHECK(of_level(load_flags({"--max-steps=10", "--max_steps=10"}), severity::note).empty());
}

TEST_CASE("--no-section together with a field of that section is an error, in either order") {
  for (auto args : {std::vector<std::string>{"--no-ckpt", "--ckpt.interval=5"},
                    std::vector<std::string>{"--ckpt.interval=5", "--no-ckpt"},
                    std::vector<std::string>{"--ckpt=None", "--ckpt.interval", "5"}}) {
    auto r = load_flags(args);
    INFO(report(r));
    auto e = error_at(r, "ckpt.interval");
    CHECK(at(e) == "command line --ckpt.interval");
    CHECK(e.message.find("sets a field of ckpt, but") != std::string::npos);
    CHECK(e.message.find("turns ckpt off; give one of the two") != std::string::npos);
  }
}

TEST_CASE("values for an opaque table keep their TOML type on the command line") {
  auto r = load_flags({"--eval.flag=false", "--eval.n=6", "--eval.rate=1.5", "--eval.name=x",
                       "--eval.quoted=\"7\"", "--eval.list=[1, 2]", "--eval.sub.deep=true"});
  INFO(report(r));
  REQUIRE(r.ok());
  REQUIRE(r.value.eval);
  const toml::table& eval = r.value.eval->value;
  CHECK(eval["flag"].value<bool>() == false);
  CHECK(eval["flag"].is_boolean());
  CHECK(eval["n"].is_integer());
  CHECK(eval["n"].value<std::int64_t>() == 6);
  CHECK(eval["rate"].is_floating_point());
  CHECK(eval["name"].value<std::string>() == "x");
  CHECK(eval["quoted"].value<std::string>() == "7");
  CHECK(eval["list"].is_array());
  CHECK(eval["sub"]["deep"].is_boolean());
  std::string dumped = primecfg::dump_toml(r.value, r.provenance);
  CHECK(dumped.find("flag = false") != std::string::npos);
  CHECK(dumped.find("n = 6") != std::string::npos);
  bool quoted_is_a_string =
      dumped.find("quoted = '7'") != std::string::npos || dumped.find("quoted = \"7\"") != std::string::npos;
  CHECK(quoted_is_a_string);
}

TEST_CASE("a scheduler min_lr above the optimizer's lr is an error naming both fields") {
  auto r = testing::load_text<SFTConfig>(
      "max_steps = 100\n[optim]\nlr = 1e-5\n[scheduler]\ntype = \"cosine\"\nmin_lr = 1e-4\n");
  INFO(report(r));
  auto e = error_at(r, "scheduler.min_lr");
  CHECK(at(e) == "test.toml:6:10");
  CHECK(e.message.find("above the peak learning rate optim.lr = 1e-05 (set at test.toml:3:6)") !=
        std::string::npos);
  CHECK(testing::load_text<SFTConfig>("max_steps = 100\n[optim]\nlr = 1e-4\n[scheduler]\ntype = \"cosine\"\n"
                                      "min_lr = 1e-4\n")
            .ok());
}

TEST_CASE("data.path replaces data.name: when both are written, a warning names the one not used") {
  auto r = load_two("[data]\nname = \"org/set\"\n", "[data]\npath = \"train.jsonl\"\n");
  INFO(report(r));
  CHECK(r.ok());
  auto warnings = of_level(r, severity::warning);
  REQUIRE(warnings.size() == 1);
  CHECK(warnings[0].path == "data.name");
  CHECK(at(warnings[0]) == "a.toml:2:8");
  CHECK(warnings[0].message == "not used: data.path = \"train.jsonl\" (set at b.toml:2:8) replaces it");
}

TEST_CASE("a FIFO, a device or a directory as a config file is an error naming it, never a hang") {
  auto dir = std::filesystem::temp_directory_path() / ("primecfg-guarantees-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::string fifo = (dir / "config.fifo").string();
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  for (const std::string& path : {fifo, std::string("/dev/zero"), std::string("/dev/null"), dir.string()}) {
    primecfg::sources src;
    src.add_file(path);
    auto r = primecfg::load<SFTConfig>(src);
    INFO(report(r));
    REQUIRE(r.error_count() == 1);
    CHECK(r.diagnostics[0].kind == error_kind::file_error);
    CHECK(at(r.diagnostics[0]) == path);
  }
  primecfg::sources src;
  src.add_file(fifo);
  CHECK(primecfg::load<SFTConfig>(src).diagnostics[0].message ==
        "is a FIFO (named pipe), not a regular file; config files must be regular files");
  std::filesystem::remove_all(dir);
}

TEST_CASE("resuming at or past max_steps is an error naming both fields") {
  auto r = testing::load_text<SFTConfig>("max_steps = 10\n[resume]\nstep = 10\n");
  INFO(report(r));
  auto e = error_at(r, "resume.step");
  CHECK(at(e) == "test.toml:3:8");
  CHECK(e.message ==
        "resuming at step 10 leaves nothing to train: max_steps = 10 (set at test.toml:1:13); raise "
        "max_steps or resume from an earlier step");
  CHECK(testing::load_text<SFTConfig>("max_steps = 10\n[resume]\nstep = 9\n").ok());
  auto rl = testing::load_text<primecfg::RLConfig>("max_steps = 5\n[resume]\nstep = 7\n");
  bool found = false;  // the RL root shares both with [trainer]
  for (const auto& d : rl.diagnostics)
    found =
        found || (d.path == "trainer.resume.step" && d.message.find("nothing to train") != std::string::npos);
  CHECK(found);
}
