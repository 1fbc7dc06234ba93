// Every field of primecfg-train's configs has a decision in support.cpp's table: used,
// refused, no effect or launcher only. The fields come from the library's JSON Schema,
// not from a list here, so a field added to SFTConfig or TrainerConfig fails this test
// until its decision is written.
#include "support.hpp"

#include <primecfg/schema.hpp>
#include <primecfg/sft.hpp>
#include <primecfg/trainer.hpp>

#include <doctest/doctest.h>

#include <map>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

using namespace primecfg;
namespace train = primecfg::train;

namespace {

// Every path of a schema, with the alternatives (`type`s) of the tagged union it is in;
// "" stands for "outside any union".
using Paths = std::map<std::string, std::set<std::string>>;

class schema_paths {
 public:
  explicit schema_paths(const toml::table& root) : root_(root) { walk(root_, "", ""); }

  const Paths& all() const { return paths_; }

  // The paths with nothing under them: what a decision must cover. A path in a union is
  // decided per alternative; the "" beside named alternatives comes from a constraint
  // (an if/then) that names the field without declaring it.
  Paths leaves() const {
    Paths out;
    for (const auto& [path, alternatives] : paths_) {
      auto next = paths_.lower_bound(path + ".");
      if (next != paths_.end() && next->first.starts_with(path + ".")) continue;
      auto named = alternatives;
      if (named.size() > 1) named.erase("");
      out.emplace(path, std::move(named));
    }
    return out;
  }

 private:
  // A node's fields: its properties, and those of every schema it refers to or combines
  // ($ref, anyOf, oneOf, allOf and their then/else branches; an `if` only tests).
  void walk(const toml::table& node, const std::string& path, const std::string& alternative) {
    if (const auto* ref = node["$ref"].as_string()) walk(resolve(ref->get()), path, alternative);
    if (const auto* props = node["properties"].as_table()) {
      // The table of one alternative of a tagged union says its tag as type's const.
      std::string inner = alternative;
      if (const auto* tag = props->at_path("type.const").as_string()) inner = tag->get();
      for (const auto& [key, value] : *props) {
        const std::string child = path.empty() ? std::string(key.str()) : path + "." + std::string(key.str());
        paths_[child].insert(inner);
        if (const auto* t = value.as_table()) walk(*t, child, inner);
      }
    }
    if (const auto* items = node["items"].as_table()) walk(*items, path, alternative);
    for (const char* combination : {"anyOf", "oneOf", "allOf"})
      if (const auto* list = node[combination].as_array())
        for (const auto& element : *list)
          if (const auto* t = element.as_table()) {
            walk(*t, path, alternative);
            for (const char* branch : {"then", "else"})
              if (const auto* b = (*t)[branch].as_table()) walk(*b, path, alternative);
          }
  }

  // A "#/..." JSON pointer into the root schema.
  const toml::table& resolve(const std::string& ref) {
    REQUIRE_MESSAGE(ref.starts_with("#/"), "a $ref outside the schema: " << ref);
    const toml::table* t = &root_;
    std::string_view rest = std::string_view(ref).substr(2);
    while (!rest.empty()) {
      const auto slash = rest.find('/');
      std::string key(rest.substr(0, slash));
      for (auto [from, to] : {std::pair{"~1", "/"}, std::pair{"~0", "~"}})
        for (auto at = key.find(from); at != std::string::npos; at = key.find(from, at + 1))
          key.replace(at, 2, to);
      t = (*t)[key].as_table();
      REQUIRE_MESSAGE(t != nullptr, "a $ref to nothing: " << ref);
      rest = slash == std::string_view::npos ? std::string_view() : rest.substr(slash + 1);
    }
    return *t;
  }

  const toml::table& root_;
  Paths paths_;
};

// A decision covers its path and everything under it, for its alternative or for all.
bool covers(const train::FieldDecision& d, std::string_view path, std::string_view alternative) {
  const bool on_path = path == d.path || (path.starts_with(d.path) && path[d.path.size()] == '.');
  return on_path && (d.alternative.empty() || d.alternative == alternative);
}

bool decided(std::span<const train::FieldDecision> table, std::string_view path,
             std::string_view alternative) {
  for (const auto& d : table)
    if (covers(d, path, alternative)) return true;
  return false;
}

std::string named(std::string_view path, std::string_view alternative) {
  std::string s(path);
  if (!alternative.empty()) s += " (type = \"" + std::string(alternative) + "\")";
  return s;
}

std::string lines(const std::vector<std::string>& items) {
  std::string s;
  for (const auto& i : items) s += "\n  " + i;
  return s;
}

// The entries of a table that name no path of the schema (or of that alternative).
std::vector<std::string> stale(std::span<const train::FieldDecision> table, const Paths& paths) {
  std::vector<std::string> out;
  for (const auto& d : table) {
    auto it = paths.find(std::string(d.path));
    if (it == paths.end() || (!d.alternative.empty() && !it->second.contains(std::string(d.alternative))))
      out.push_back(named(d.path, d.alternative));
  }
  return out;
}

}  // namespace

TEST_CASE("field decisions: every field of SFTConfig has one, and every decision names a field") {
  const schema_paths sft(json_schema_table<SFTConfig>());
  const Paths leaves = sft.leaves();
  const auto table = train::field_decisions();
  REQUIRE(leaves.size() > 100);  // the walk reached into the sections and unions

  std::vector<std::string> undecided;
  for (const auto& [path, alternatives] : leaves)
    for (const auto& alternative : alternatives)
      if (!decided(table, path, alternative)) undecided.push_back(named(path, alternative));
  CHECK_MESSAGE(undecided.empty(),
                "SFTConfig fields without a decision in reference_trainer/support.cpp (used, refused, "
                "no_effect or launcher_only):"
                    << lines(undecided));

  const auto no_field = stale(table, sft.all());
  CHECK_MESSAGE(no_field.empty(),
                "decisions in reference_trainer/support.cpp for no field of SFTConfig:" << lines(no_field));

  // A used section would cover a field added under it that nothing reads.
  std::vector<std::string> used_sections, twice;
  std::set<std::pair<std::string_view, std::string_view>> seen;
  for (const auto& d : table) {
    if (d.decision == train::Decision::used && !leaves.contains(std::string(d.path)))
      used_sections.push_back(std::string(d.path));
    if (!seen.emplace(d.path, d.alternative).second) twice.push_back(named(d.path, d.alternative));
  }
  CHECK_MESSAGE(used_sections.empty(),
                "used decisions must name fields, not sections:" << lines(used_sections));
  CHECK_MESSAGE(twice.empty(), "decided twice:" << lines(twice));
}

TEST_CASE("field decisions: every field of TrainerConfig is the RL trainer's own or decided as SFTConfig's") {
  const schema_paths rl(json_schema_table<TrainerConfig>());
  const schema_paths sft(json_schema_table<SFTConfig>());
  const auto rl_only = train::rl_only_decisions();

  // from_trainer_config turns [data.fake] into SFTConfig's data of type "fake".
  std::vector<std::string> undecided;
  for (const auto& [path, alternatives] : rl.leaves()) {
    if (decided(rl_only, path, "")) continue;
    std::string as_sft = path;
    std::set<std::string> as_alternatives = alternatives;
    if (path.starts_with("data.fake.")) {
      as_sft = "data." + path.substr(std::string_view("data.fake.").size());
      as_alternatives = {"fake"};
    }
    const auto it = sft.all().find(as_sft);
    for (const auto& alternative : as_alternatives)
      if (it == sft.all().end() || !it->second.contains(alternative) ||
          !decided(train::field_decisions(), as_sft, alternative))
        undecided.push_back(named(path, alternative) + (as_sft != path ? " (as " + as_sft + ")" : ""));
  }
  CHECK_MESSAGE(undecided.empty(),
                "TrainerConfig fields neither in rl_only_decisions() nor decided as an SFTConfig field in "
                "reference_trainer/support.cpp:"
                    << lines(undecided));
  const auto no_field = stale(rl_only, rl.all());
  CHECK_MESSAGE(no_field.empty(), "RL-only decisions for no field of TrainerConfig:" << lines(no_field));
}

TEST_CASE("field decisions: check_support and check_rl_only do what the tables say") {
  // Every refusal of the table, made by one of these configs.
  SFTConfig a;
  auto& m = a.model;
  m.cp = 2;
  m.ep = 2;
  m.lora = LoraConfig{};
  m.quantization = QuantizationConfig{};
  m.vlm = VlmConfig{};
  m.ac_offloading = ActivationOffloadConfig{};
  m.ac = ActivationCheckpointConfig{};
  m.ac->mode = AcMode::selective;
  m.trust_remote_code = true;
  m.optimization_dtype = Dtype::bfloat16;
  m.impl = ModelImpl::hf;
  m.attn = Attention::eager;
  m.ep_comm_backend = EpCommBackend::deepep;
  m.moe_fused_kernel = true;
  m.index_cache = IndexCacheConfig{};
  m.conversion_dir = "converted";
  m.seq_len = 999;
  auto& d = std::get<SFTDataConfig>(a.data);
  d.name = "elsewhere/dataset";
  d.loss_mask.user = true;
  d.subsets = std::vector<std::string>{"a"};
  d.splits = std::vector<std::string>{"train"};
  d.probabilities = std::vector<double>{1.0};
  a.val = SFTValConfig{};
  a.run.dir = "run";
  a.log.json_logging = true;
  a.log.log_data = true;
  a.monitors.file->path = "elsewhere.jsonl";
  a.monitors.wandb = WandbConfig{};
  a.monitors.prime = PrimeMonitorConfig{};
  a.renderer.name = "qwen3";
  a.resume = ResumeConfig{};
  a.resume->dir = "step_1";
  a.ckpt = CheckpointConfig{};
  a.ckpt->keep_interval = 2;
  a.ckpt->skip_progress = true;
  a.ckpt->skip_dataloader = true;
  a.tokenizer.name = "another/tokenizer";
  a.tokenizer.trust_remote_code = true;
  a.tokenizer.chat_template = "{{ x }}";
  a.heartbeat = HeartbeatConfig{"https://example.invalid"};
  a.trace_path = "trace.json";
  a.memory_profiler_path = "memory.pickle";
  a.matmul_precision = MatmulPrecision::highest;
  a.dry_run = true;
  a.env_vars["A"] = "1";
  // Refusals that exclude each other.
  SFTConfig b;
  b.model.freeze_moe_router = true;
  b.run.name = "exp";
  b.monitors.file = std::nullopt;
  SFTConfig c;
  SFTConfig f;
  FakeDataConfig fake;
  fake.seed = 3;
  fake.generate_samples = true;
  f.data = fake;

  provenance_map compile_set{{"model.compile", provenance::in_file("a.toml", 1, 1)}};
  std::set<std::pair<std::string, std::string_view>> refusals;  // path, data type
  for (const SFTConfig* cfg : {&a, &b, &c, &f}) {
    const std::string_view type = std::visit([](const auto& x) { return x.type; }, cfg->data);
    for (const auto& diag : train::check_support(*cfg, compile_set))
      if (diag.level == severity::error) refusals.emplace(diag.path, type);
  }
  std::vector<std::string> not_refused;
  for (const auto& e : train::field_decisions()) {
    if (e.decision != train::Decision::refused) continue;
    bool made = false;
    for (const auto& [path, type] : refusals) made = made || (path == e.path && covers(e, path, type));
    if (!made) not_refused.push_back(named(e.path, e.alternative));
  }
  CHECK_MESSAGE(not_refused.empty(),
                "refused in the table, but check_support did not refuse:" << lines(not_refused));

  // Every note of the table, where the field is set (one process, then several).
  SFTConfig plain;
  plain.eval = plain.inference = plain.deployment = plain.slurm = opaque_table{};
  provenance_map everything;
  for (const auto& e : train::field_decisions())
    everything[std::string(e.path)] = provenance::in_file("a.toml", 2, 1);
  for (int world : {1, 2}) {
    std::set<std::string> noted;
    for (const auto& diag : train::check_support(plain, everything, world))
      if (diag.level == severity::note) noted.insert(diag.path);
    for (const auto& e : train::field_decisions()) {
      const bool note = e.decision == train::Decision::no_effect ||
                        e.decision == train::Decision::launcher_only ||
                        (world == 1 && !e.one_process.empty());
      // A per-alternative note is given for the data type in use (plain's is "sft").
      if (!e.alternative.empty() && e.alternative != "sft") continue;
      CHECK_MESSAGE(noted.contains(std::string(e.path)) == note, e.path << " with " << world << " rank(s)");
    }
  }

  // A TrainerConfig's fake data is spelled [data.fake] in refusals and notes.
  TrainerConfig t;
  t.data.fake = fake;
  t.max_steps = 1;
  provenance_map trainer_set;
  for (const char* path : {"data.fake.seq_len", "data.fake.seed", "data.fake.num_workers"})
    trainer_set[path] = provenance::in_file("t.toml", 3, 1);
  std::set<std::pair<std::string, severity>> said;
  for (const auto& diag : train::check_support(train::from_trainer_config(t), trainer_set))
    said.emplace(diag.path, diag.level);
  CHECK(said.contains({"data.fake.seed", severity::error}));
  CHECK(said.contains({"data.fake.num_workers", severity::note}));

  // The RL trainer's own fields: each refused or noted where set, nothing else.
  provenance_map rl_set;
  for (const auto& e : train::rl_only_decisions())
    rl_set[std::string(e.path)] = provenance::in_file("t.toml", 4, 1);
  rl_set["model.cp"] = provenance::in_file("t.toml", 5, 1);
  const auto rl = train::check_rl_only(rl_set);
  CHECK(rl.size() == train::rl_only_decisions().size());
  for (const auto& e : train::rl_only_decisions()) {
    const severity want = e.decision == train::Decision::refused ? severity::error : severity::note;
    bool found = false;
    for (const auto& diag : rl) found = found || (diag.path == e.path && diag.level == want);
    CHECK_MESSAGE(found, e.path);
  }
}

TEST_CASE("field decisions: the routed experts' fields depend on the model, and so does ep") {
  auto said = [](const SFTConfig& c, int world, const provenance_map& where = {}) {
    std::set<std::pair<std::string, severity>> out;
    for (const auto& diag : train::check_support(c, where, world)) out.emplace(diag.path, diag.level);
    return out;
  };
  // A dense model: the router's settings would do nothing (errors), the kernel choice a note.
  SFTConfig dense;
  dense.model.moe_router_dtype = Dtype::bfloat16;
  dense.model.debug = ModelDebugConfig{};
  dense.model.debug->force_balanced_routing = true;
  dense.model.moe_use_grouped_mm = false;
  const auto d = said(dense, 1);
  CHECK(d.contains({"model.moe_router_dtype", severity::error}));
  CHECK(d.contains({"model.debug.force_balanced_routing", severity::error}));
  CHECK(d.contains({"model.moe_use_grouped_mm", severity::note}));
  // The same on a model with routed experts: used.
  SFTConfig moe = dense;
  moe.model.name = "primecfg/tiny-moe";
  CHECK(said(moe, 1).empty());
  // Several ranks: ep unset is prime-rl's "auto" (expert parallelism there), an error until
  // the config says which; "auto" written out is expert parallelism, as is 2; 1 is FSDP alone.
  SFTConfig two;
  two.model.name = "primecfg/tiny-moe";
  CHECK(said(two, 2).contains({"model.ep", severity::error}));
  const provenance_map written{{"model.ep", provenance::in_file("a.toml", 2, 1)}};
  two.model.ep = ExpertParallel::auto_;
  CHECK(said(two, 2, written).empty());
  for (const int ep : {1, 2}) {
    two.model.ep = ep;
    CHECK(said(two, 2, written).empty());
  }
  // Expert parallelism's own rules, each naming model.ep: a degree that does not divide the
  // experts (tiny-moe has 8), and one on a model without routed experts.
  two.model.ep = 3;
  CHECK(said(two, 3, written).contains({"model.ep", severity::error}));
  two.model.ep = 16;
  CHECK(said(two, 16, written).contains({"model.ep", severity::error}));
  two.model.ep = 8;
  CHECK(said(two, 8, written).empty());
  SFTConfig dense_ep = two;
  dense_ep.model.name = "primecfg/tiny";
  dense_ep.model.ep = 2;
  CHECK(said(dense_ep, 2, written).contains({"model.ep", severity::error}));
}
