// Golden tests over the committed copy of the prime-rl corpus: every file
// with legacy keys must come out exactly as tests/migrate/golden/ says (each
// golden file was checked by hand), every other file byte-identical.
#include "helpers.hpp"

#include <map>
#include <set>

using namespace mt;

namespace {

fs::path corpus_dir() { return fs::path(env("PRIMECFG_MIGRATE_CORPUS")); }
fs::path golden_dir() { return fs::path(env("PRIMECFG_MIGRATE_TESTS")) / "golden"; }

// The files SOURCES.md lists as setting offload keys in a model table, with
// the config type it gives for each.
const std::map<std::string, root_type>& legacy_files() {
  static const std::map<std::string, root_type> files = {
      {"3ab5e04c4/configs/ci/integration/reverse-text-multi-run/trainer.toml", root_type::trainer},
      {"559b44772/configs/ci/integration/reverse-text-sft/full-offload-resume.toml", root_type::sft},
      {"559b44772/configs/debug/concurrency.toml", root_type::rl},
      {"559b44772/examples/advanced/glm-4.5-air/swe.toml", root_type::rl},
      {"9975d8868/examples/advanced/glm-4.5-air/search.toml", root_type::rl},
      {"9975d8868/examples/advanced/glm-4.5-air/swe.toml", root_type::rl},
      {"9975d8868/examples/advanced/glm-4.5-air/terminal.toml", root_type::rl},
      {"9975d8868/examples/advanced/glm-5.2/swe-llmd.toml", root_type::rl},
      {"9975d8868/examples/advanced/glm-5.2/swe.toml", root_type::rl},
      {"9975d8868/examples/advanced/nemotron-3-super/swe.toml", root_type::rl},
      {"9676f2dd9/benchmarks/offload/full-native.toml", root_type::sft},
      {"9676f2dd9/benchmarks/offload/full-torch.toml", root_type::sft},
      {"9676f2dd9/benchmarks/offload/glm5-proxy.toml", root_type::sft},
      {"9676f2dd9/benchmarks/offload/state-offload.toml", root_type::sft},
  };
  return files;
}

std::vector<std::string> corpus_files() {
  std::vector<std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(corpus_dir()))
    if (e.is_regular_file() && e.path().extension() == ".toml")
      out.push_back(fs::relative(e.path(), corpus_dir()).generic_string());
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

TEST_CASE("corpus: the golden files are exactly the files with legacy keys") {
  std::set<std::string> golden;
  for (const auto& e : fs::recursive_directory_iterator(golden_dir()))
    if (e.is_regular_file()) golden.insert(fs::relative(e.path(), golden_dir()).generic_string());
  std::set<std::string> expected;
  for (const auto& [f, type] : legacy_files()) expected.insert(f);
  CHECK(golden == expected);
  CHECK(corpus_files().size() >= 45);
}

TEST_CASE("corpus: every file migrates to its golden text, or stays byte-identical") {
  for (const auto& rel : corpus_files()) {
    CAPTURE(rel);
    std::string in = read(corpus_dir() / rel);
    file_result r = run(in);
    INFO(all_findings(r));
    CHECK_FALSE(r.failed());
    if (legacy_files().count(rel)) {
      CHECK(r.changed());
      CHECK(r.migrated == read(golden_dir() / rel));
      // Idempotent: the golden text needs nothing more.
      file_result again = run(r.migrated);
      CHECK_FALSE(again.changed());
      CHECK(again.findings.empty());
    } else {
      CHECK_FALSE(r.changed());
      CHECK(r.migrated == in);
    }
  }
}

TEST_CASE("corpus: the messages name file lines that hold the legacy keys") {
  auto r = run(read(corpus_dir() / "559b44772/configs/debug/concurrency.toml"));
  CHECK(has(r, level::note, "[trainer.model] optim_cpu_offload, full_offload -> offload = \"full\"", 68));
  auto torch = run(read(corpus_dir() / "9676f2dd9/benchmarks/offload/full-torch.toml"));
  CHECK(has(torch, level::warning, "cpu_optimizer_backend = \"torch\"", 4));
  auto native = run(read(corpus_dir() / "9676f2dd9/benchmarks/offload/glm5-proxy.toml"));
  CHECK(has(native, level::note, "transfer_buffer_count", 42));
  auto old = run(read(corpus_dir() / "c332f806d/configs/10B/H100_devel.toml"));
  CHECK(has(old, level::warning, "train.fsdp_cpu_offload is not in a model table", 17));
}

TEST_CASE("corpus: migrated files validate as their config type, or fail only on keys unrelated to offload") {
  for (const auto& [rel, type] : legacy_files()) {
    CAPTURE(rel);
    std::string text = read(golden_dir() / rel);
    CHECK(infer_root_type(toml::parse(text)) == type);
    check_result v = validate(rel, text, type);
    INFO(v.report);
    if (v.ok) continue;
    // Known, offload-unrelated failures: a removed field, and the branch-only
    // overlays' [env_vars] (see SOURCES.md).
    std::istringstream lines(v.report);
    std::string line;
    while (std::getline(lines, line)) {
      auto at = line.find(": error:");
      if (at == std::string::npos) continue;
      std::string message = line.substr(at);  // the file name itself may say "offload"
      CHECK(message.find("offload") == std::string::npos);
      CHECK((message.find("max_concurrent_runs") != std::string::npos ||
             message.find("env_vars") != std::string::npos));
    }
  }
}
