// Fuzz target: primecfg-migrate's engine (migrate_text, the same code the
// tool runs) on arbitrary documents, with and without --fsdp-as=full.
//
// Properties checked, beyond "no crash, no sanitizer report":
//  - the result always keeps the input as `original`; a failed run hands the
//    input back unchanged;
//  - input that is not TOML is refused;
//  - a document without any legacy offload key comes back byte-identical,
//    without errors;
//  - a migrated text parses as TOML, and migrating it again changes nothing
//    and reports no error (idempotence);
//  - no "internal error" (the engine's own consistency checks) ever fires;
//  - every diagnostic has a message and a line inside the file;
//  - validating the result (what the tool does before writing) does not crash.
#include "fuzz_check.hpp"
#include "migrate.hpp"

#include <primecfg/detail/toml.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace {

using namespace primecfg::migrate;
using primecfg::fuzz::check;

constexpr std::string_view legacy_keys[] = {"fsdp_cpu_offload", "optim_cpu_offload", "full_offload"};

bool has_legacy_key(const toml::node& node) {
  if (const toml::table* t = node.as_table()) {
    for (auto&& [key, value] : *t) {
      if (std::find(std::begin(legacy_keys), std::end(legacy_keys), key.str()) != std::end(legacy_keys))
        return true;
      if (has_legacy_key(value)) return true;
    }
  } else if (const toml::array* a = node.as_array()) {
    for (const toml::node& element : *a)
      if (has_legacy_key(element)) return true;
  }
  return false;
}

std::optional<toml::table> try_parse(const std::string& text) {
  try {
    return toml::parse(text);
  } catch (const toml::parse_error&) {
    return std::nullopt;
  }
}

std::string describe(const file_result& r) {
  std::string out = "--- input:\n" + r.original + "\n--- output:\n" + r.migrated + "\n--- diagnostics:\n";
  for (const auto& d : r.findings) out += format("fuzz.toml", d) + "\n";
  return out;
}

void check_diagnostics(const file_result& r) {
  std::size_t lines = static_cast<std::size_t>(std::count(r.original.begin(), r.original.end(), '\n')) + 1;
  for (const auto& d : r.findings) {
    check(!d.message.empty(), "a diagnostic without a message", describe(r));
    // Every internal error of the engine starts so; the words elsewhere may be the
    // input's own, echoed in a parse error (a key named "...internal error..." was).
    check(d.message.rfind("internal error", 0) != 0, "an internal error", describe(r));
    check(d.line <= lines, "a diagnostic names a line past the end of the file", describe(r));
  }
}

void run(const std::string& input, const options& opts) {
  file_result r = migrate_text(input, opts);
  check(r.original == input, "the result does not keep the input as original", describe(r));
  check_diagnostics(r);
  if (r.failed()) {
    check(r.migrated == input, "a failed migration changed the text", describe(r));
    check(r.applied.empty(), "a failed migration lists applied steps", describe(r));
  }

  std::optional<toml::table> parsed = try_parse(input);
  if (!parsed) {
    check(r.failed(), "input that is not TOML was not refused", describe(r));
    return;
  }
  if (!has_legacy_key(*parsed)) {
    check(!r.failed() && !r.changed(), "a document without legacy keys was changed or refused", describe(r));
    check(r.applied.empty(), "a document without legacy keys lists applied steps", describe(r));
  }
  if (!r.changed()) return;

  check(!r.applied.empty(), "a changed document lists no applied step", describe(r));
  std::optional<toml::table> out = try_parse(r.migrated);
  check(out.has_value(), "the migrated text is not valid TOML", describe(r));

  file_result again = migrate_text(r.migrated, opts);
  check(!again.failed(), "migrating the migrated text reports an error", describe(r) + describe(again));
  check(!again.changed(), "migration is not idempotent", describe(r) + describe(again));

  check_result v = validate("fuzz.toml", r.migrated, infer_root_type(*out));
  check(v.ok || v.errors > 0, "an invalid result without an error count");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::string input(reinterpret_cast<const char*>(data), size);
  options defaults;
  run(input, defaults);
  options fsdp_full;
  fsdp_full.fsdp_as_full = true;
  run(input, fsdp_full);
  return 0;
}
