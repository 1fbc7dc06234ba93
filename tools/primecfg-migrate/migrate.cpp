#include "migrate.hpp"

#include "steps.hpp"

#include <primecfg/detail/key_depth.hpp>
#include <primecfg/detail/parse_error.hpp>

#include <algorithm>
#include <optional>

namespace primecfg::migrate {

bool file_result::failed() const {
  return std::any_of(findings.begin(), findings.end(),
                     [](const finding& d) { return d.lvl == level::error; });
}

std::string format(std::string_view file, const finding& d) {
  std::string out(file);
  if (d.line > 0) out += ":" + std::to_string(d.line);
  if (d.line > 0 && d.column > 0) out += ":" + std::to_string(d.column);
  out += ": ";
  out += to_string(d.lvl);
  out += ": ";
  out += d.message;
  return out;
}

namespace {

std::optional<toml::table> parse(const std::string& text, std::vector<finding>& diags, bool ours) {
  // Keys nested deeper than this overflow the stack inside toml++.
  if (auto deep = primecfg::detail::find_deep_key(text)) {
    diags.push_back({level::error, ours ? 0 : deep->line,
                     std::string(ours ? "internal error: the migrated text has " : "") + "keys nested " +
                         std::to_string(deep->depth) + " tables deep; more than " +
                         std::to_string(primecfg::detail::max_key_depth) + " is refused"});
    return std::nullopt;
  }
  try {
    return toml::parse(text);
  } catch (const toml::parse_error& e) {
    // toml++ 3.3's own text can be garbled (detail/parse_error.hpp).
    primecfg::detail::toml_error_report r = primecfg::detail::describe_parse_error(text, e);
    std::string msg = ours ? "internal error: the migrated text is not valid TOML (" : "not valid TOML: ";
    msg += r.message;
    if (ours) msg += "); nothing was changed";
    diags.push_back({level::error, ours ? 0 : static_cast<std::size_t>(r.line), msg, ours ? 0 : r.column});
    return std::nullopt;
  }
}

bool has_error(const std::vector<finding>& ds) {
  return std::any_of(ds.begin(), ds.end(), [](const finding& d) { return d.lvl == level::error; });
}

}  // namespace

file_result migrate_text(std::string text, const options& opts) {
  return migrate_text(std::move(text), opts, all_steps());
}

file_result migrate_text(std::string text, const options& opts, const std::vector<step>& steps) {
  file_result r;
  r.original = text;
  r.migrated = text;
  std::optional<toml::table> root = parse(text, r.findings, false);
  if (!root) return r;

  std::string current = std::move(text);
  for (const step& s : steps) {
    std::vector<finding> ds;
    std::string next;
    try {
      document doc(current);
      plan edits(doc);
      context ctx{doc, *root, opts, edits, ds};
      s.run(ctx);
      if (!has_error(ds)) next = edits.empty() ? current : edits.apply();
    } catch (const std::exception& e) {
      ds.push_back({level::error, 0,
                    std::string("internal error in migration ") + std::string(s.name) + ": " + e.what() +
                        "; nothing was changed"});
    }
    std::stable_sort(ds.begin(), ds.end(),
                     [](const finding& a, const finding& b) { return a.line < b.line; });
    r.findings.insert(r.findings.end(), ds.begin(), ds.end());
    if (has_error(ds)) {
      r.migrated = r.original;
      return r;
    }
    if (next == current) continue;

    std::optional<toml::table> next_root = parse(next, r.findings, true);
    if (!next_root) {
      r.migrated = r.original;
      return r;
    }
    // A step must be done after one pass: running it again changes nothing.
    bool settled = false;
    try {
      std::vector<finding> again;
      document doc2(next);
      plan edits2(doc2);
      context ctx2{doc2, *next_root, opts, edits2, again};
      s.run(ctx2);
      settled = edits2.empty() && !has_error(again);
    } catch (const std::exception&) {
      settled = false;
    }
    if (!settled) {
      r.findings.push_back({level::error, 0,
                            "internal error: migration " + std::string(s.name) +
                                " would change its own output again; nothing was changed"});
      r.migrated = r.original;
      return r;
    }
    r.applied.push_back(s.name);
    current = std::move(next);
    root = std::move(next_root);
  }
  // A rewrite the library would refuse to load is no migration.
  if (current.size() > loader_max_bytes()) {
    r.findings.push_back({level::error, 0,
                          "the migrated config would be " + std::to_string(current.size()) +
                              " bytes, more than the " + std::to_string(loader_max_bytes() >> 20) +
                              " MiB the primecfg loader reads; nothing was changed"});
    r.migrated = r.original;
    return r;
  }
  r.migrated = std::move(current);
  return r;
}

std::string_view to_string(root_type r) {
  switch (r) {
    case root_type::sft:
      return "sft";
    case root_type::trainer:
      return "trainer";
    case root_type::rl:
      return "rl";
  }
  return "sft";
}

std::optional<root_type> parse_root_type(std::string_view s) {
  if (s == "sft") return root_type::sft;
  if (s == "trainer") return root_type::trainer;
  if (s == "rl") return root_type::rl;
  return std::nullopt;
}

root_type infer_root_type(const toml::table& root) {
  if (root.get("trainer") != nullptr || root.get("orchestrator") != nullptr) return root_type::rl;
  if (const toml::table* data = root["data"].as_table()) {
    if (auto type = (*data)["type"].value<std::string>(); type && (*type == "fake" || *type == "sft"))
      return root_type::sft;
    if (data->get("seq_len") != nullptr) return root_type::sft;
    if (data->get("fake") != nullptr) return root_type::trainer;
  }
  if (const toml::table* model = root["model"].as_table(); model && model->get("seq_len") != nullptr)
    return root_type::trainer;
  return root_type::sft;
}

}  // namespace primecfg::migrate
