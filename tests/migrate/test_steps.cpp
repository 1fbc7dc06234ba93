// The ordered list of steps, and the declarative rename that future steps use.
#include "helpers.hpp"
#include "steps.hpp"

using namespace mt;

TEST_CASE("steps are ordered by version and named after it") {
  const auto& steps = all_steps();
  REQUIRE_FALSE(steps.empty());
  CHECK(steps.front().name == "0001_offload_to_single_field");
  for (std::size_t i = 0; i < steps.size(); ++i) {
    CHECK(steps[i].version == static_cast<int>(i) + 1);
    char prefix[8];
    std::snprintf(prefix, sizeof prefix, "%04d_", steps[i].version);
    CHECK(steps[i].name.substr(0, 5) == prefix);
    CHECK_FALSE(steps[i].summary.empty());
  }
}

namespace {

std::vector<step> demo_steps() {
  return {rename_step(1, "0001_demo", "attn -> attention", {{model_tables(), "attn", "attention", "demo"}}),
          rename_step(2, "0002_demo", "attention -> attn_impl",
                      {{model_tables(), "attention", "attn_impl", ""}})};
}

}  // namespace

TEST_CASE("a rename step edits every spelling of the key and nothing else") {
  auto r = migrate_text(
      "# attn stays in comments\n"
      "[model]\n"
      "attn = \"sdpa\" # attn\n"
      "[trainer]\n"
      "model.attn = \"sdpa\"\n"
      "other = { model = { attn = 1 } }\n",
      {}, demo_steps());
  for (const auto& d : r.findings) INFO(format("demo.toml", d));
  CHECK_FALSE(r.failed());
  CHECK(r.migrated ==
        "# attn stays in comments\n"
        "[model]\n"
        "attn_impl = \"sdpa\" # attn\n"
        "[trainer]\n"
        "model.attn_impl = \"sdpa\"\n"
        "other = { model = { attn = 1 } }\n");
  CHECK(r.applied.size() == 2);
}

TEST_CASE("a rename step renames table headers") {
  auto r = migrate_text("[model.attn]\nx = 1\n[trainer.model.attn.extra]\ny = 2\n", {}, demo_steps());
  CHECK(r.migrated == "[model.attn_impl]\nx = 1\n[trainer.model.attn_impl.extra]\ny = 2\n");
}

TEST_CASE("a rename step runs after the steps before it, on their output") {
  auto r = migrate_text("model = { attn = \"x\" }\n", {}, demo_steps());
  CHECK(r.migrated == "model = { attn_impl = \"x\" }\n");
}

TEST_CASE("a rename step refuses when both names are set") {
  auto r = migrate_text("[model]\nattn = 1\nattention = 2\n", {}, demo_steps());
  CHECK(r.failed());
  CHECK(has(r, level::error, "are both set", 2));
  CHECK_FALSE(r.changed());
}
