// Migration 0001: the three CPU offload switches of ModelConfig become one
// field.
//
//   fsdp_cpu_offload  (bool, default false)
//   optim_cpu_offload (bool, default true; a table with `full` on one branch)
//   full_offload      (bool, a table, or "None")
//     => offload = "none" | "optimizer" | "full"   (default "optimizer")
//
// See docs/migration.md for the table of outcomes and the reasons behind them.
#pragma once

#include "step.hpp"

#include <algorithm>
#include <functional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace primecfg::migrate::m0001 {

inline constexpr std::string_view fsdp_key = "fsdp_cpu_offload";
inline constexpr std::string_view optim_key = "optim_cpu_offload";
inline constexpr std::string_view full_key = "full_offload";
inline constexpr std::string_view new_key = "offload";

// Knobs of the branch-only [model.optim_cpu_offload] table that have no
// counterpart any more; they are dropped with a note.
inline constexpr std::string_view retired_knobs[] = {"transfer_buffer_count", "max_inflight_backwards",
                                                     "timeout_seconds", "gradients"};

struct setting {
  path_t path;
  const toml::node* node = nullptr;
  std::vector<occurrence> where;
  bool present() const { return node != nullptr; }
  std::size_t line() const { return where.empty() ? 0 : where.front().line; }
};

inline std::string value_text(const toml::node& n) {
  if (auto b = n.as_boolean()) return b->get() ? "true" : "false";
  if (auto s = n.as_string()) return "\"" + s->get() + "\"";
  if (auto i = n.as_integer()) return std::to_string(i->get());
  if (n.is_table()) return "a table";
  return "a value";
}

inline std::size_t line_of_path(const context& ctx, const path_t& p, std::size_t fallback) {
  auto found = find_under(ctx.doc, p);
  return found.empty() ? fallback : found.front().line;
}

// The keys a [full_offload] table (or the branch's [optim_cpu_offload] table)
// may carry. Returns false after reporting an error.
inline bool check_knobs(context& ctx, const setting& s, bool branch_table, bool& full) {
  bool ok = true;
  for (const auto& [k, v] : *s.node->as_table()) {
    std::string key(k.str());
    path_t p = s.path;
    p.push_back(key);
    std::size_t line = line_of_path(ctx, p, s.line());
    std::string name = dotted(p);
    if (key == "numa_bind") {
      if (!v.is_boolean()) {
        ctx.error(line, name + " must be true or false, not " + value_text(v));
        ok = false;
      } else if (!v.as_boolean()->get()) {
        ctx.warning(line,
                    "removed " + name +
                        " = false: behaviour changes, full offload now always binds each rank's CPU threads "
                        "to its GPU's NUMA node");
      }
    } else if (key == "cpu_optimizer_backend") {
      if (!v.is_string()) {
        ctx.error(line, name + " must be a string, not " + value_text(v));
        ok = false;
      } else if (v.as_string()->get() == "torch") {
        ctx.warning(line, "removed " + name +
                              " = \"torch\": behaviour changes, full offload now always runs the native CPU "
                              "optimizer kernel");
      }
    } else if (branch_table && key == "full") {
      if (!v.is_boolean()) {
        ctx.error(line, name + " must be true or false, not " + value_text(v));
        ok = false;
      } else {
        full = v.as_boolean()->get();
      }
    } else if (branch_table && std::find(std::begin(retired_knobs), std::end(retired_knobs), key) !=
                                   std::end(retired_knobs)) {
      ctx.note(line, "removed " + name + " = " + value_text(v) + ": the setting no longer exists");
    } else {
      ctx.error(line, "unknown key " + name + " in a legacy offload table; nothing to migrate it to");
      ok = false;
    }
  }
  return ok;
}

inline void migrate_table(context& ctx, const path_t& table) {
  const toml::node* t = node_at(ctx.root, table);
  if (t == nullptr || !t->is_table()) return;
  auto get = [&](std::string_view key) {
    setting s;
    s.path = table;
    s.path.emplace_back(key);
    s.node = node_at(ctx.root, s.path);
    if (s.node != nullptr) s.where = find_under(ctx.doc, s.path);
    return s;
  };
  setting fsdp = get(fsdp_key), optim = get(optim_key), full = get(full_key), current = get(new_key);
  std::vector<const setting*> legacy;
  for (const setting* s : {&fsdp, &optim, &full})
    if (s->present()) legacy.push_back(s);
  if (legacy.empty()) return;
  for (const setting* s : legacy) {
    if (s->where.empty()) {  // toml++ sees it but the text map does not: never guess
      ctx.error(0,
                "internal error: could not locate " + dotted(s->path) + " in the text; nothing was changed");
      return;
    }
  }
  const std::string table_name = dotted(table);

  if (current.present()) {
    for (const setting* s : legacy) {
      ctx.error(s->line(), table_name + ".offload is already set (line " +
                               std::to_string(current.line() + 1) + ") next to the legacy key " +
                               dotted(s->path) +
                               "; decide which one is meant and remove the legacy key by hand");
    }
    return;
  }

  const std::size_t errors_before = ctx.findings.size();
  auto failed = [&] {
    for (std::size_t i = errors_before; i < ctx.findings.size(); ++i)
      if (ctx.findings[i].lvl == level::error) return true;
    return false;
  };

  bool fsdp_on = false;
  if (fsdp.present()) {
    if (auto b = fsdp.node->as_boolean()) {
      fsdp_on = b->get();
    } else {
      ctx.error(fsdp.line(), dotted(fsdp.path) + " must be true or false, not " + value_text(*fsdp.node));
    }
  }

  enum class state { absent, on, off };
  state optim_state = state::absent;
  bool optim_written_true = false;  // `optim_cpu_offload = true`, spelled out
  bool optim_table_full = false;    // branch schema: [model.optim_cpu_offload] full = true
  if (optim.present()) {
    if (auto b = optim.node->as_boolean()) {
      optim_state = b->get() ? state::on : state::off;
      optim_written_true = b->get();
    } else if (auto s = optim.node->as_string(); s && s->get() == "None") {
      optim_state = state::off;
    } else if (optim.node->is_table()) {
      optim_state = state::on;
      check_knobs(ctx, optim, true, optim_table_full);
    } else {
      ctx.error(optim.line(),
                dotted(optim.path) + " must be true, false or a table, not " + value_text(*optim.node));
    }
  }

  bool full_on = false;
  if (full.present()) {
    if (auto b = full.node->as_boolean()) {
      full_on = b->get();
    } else if (auto s = full.node->as_string(); s && s->get() == "None") {
      full_on = false;
    } else if (full.node->is_table()) {
      full_on = true;
      bool unused = false;
      check_knobs(ctx, full, false, unused);
    } else {
      ctx.error(full.line(), dotted(full.path) + " must be true, false, \"None\" or a table, not " +
                                 value_text(*full.node));
    }
  }
  if (failed()) return;

  if (fsdp_on && !ctx.opts.fsdp_as_full) {
    ctx.error(
        fsdp.line(),
        dotted(fsdp.path) +
            " = true has no counterpart: FSDP CPU offload was removed. offload = \"full\" covers the same "
            "memory pressure (FP32 master weights, optimizer moments and gradients live in host RAM); "
            "rerun with --fsdp-as=full to migrate to it");
  }
  const bool fsdp_full = fsdp_on && ctx.opts.fsdp_as_full;
  const bool any_full = full_on || optim_table_full || fsdp_full;
  const setting& full_source = full_on ? full : (optim_table_full ? optim : fsdp);
  if (any_full && optim_written_true) {
    ctx.error(optim.line(), dotted(optim.path) + " = true together with " + dotted(full_source.path) +
                                " (line " + std::to_string(full_source.line() + 1) +
                                ") is ambiguous: the old validator rejected it. Keep one of them, or set " +
                                table_name + ".offload = \"optimizer\" or \"full\" by hand");
  }
  if (failed()) return;

  std::string value;
  if (any_full) {
    value = "full";
  } else if (optim_state == state::on) {
    value = "optimizer";
  } else if (optim_state == state::off) {
    value = "none";
  }

  if (any_full && optim_state == state::absent) {
    ctx.note(full_source.line(), "this file was rejected by the old validator (" + dotted(optim.path) +
                                     " defaulted to true and excluded " + dotted(full_source.path) +
                                     "); migrated to the intended offload = \"full\"");
  }
  if (fsdp_full) {
    ctx.note(fsdp.line(),
             dotted(fsdp.path) + " = true mapped to offload = \"full\" as asked by --fsdp-as=full");
  }

  std::vector<occurrence> all;
  for (const setting* s : legacy) all.insert(all.end(), s->where.begin(), s->where.end());
  std::sort(all.begin(), all.end(),
            [](const occurrence& a, const occurrence& b) { return a.begin < b.begin; });

  std::string removed_names;
  for (const setting* s : legacy) {
    removed_names += removed_names.empty() ? "" : ", ";
    removed_names += s->path.back();
  }

  std::size_t skip = all.size();  // index of an occurrence that must stay (rewritten in place)
  if (!value.empty()) {
    const std::string quoted = "\"" + value + "\"";
    auto target = std::find_if(all.begin(), all.end(),
                               [](const occurrence& o) { return o.what != occurrence::kind::header; });
    if (target != all.end()) {
      replace_with_key(ctx.doc, ctx.edits, *target, table, new_key, quoted);
      skip = static_cast<std::size_t>(target - all.begin());
    } else if (add_key(ctx.doc, ctx.edits, table, new_key, quoted, all.front())) {
      skip = 0;
    }
    ctx.note(all.front().line, "[" + table_name + "] " + removed_names + " -> offload = " + quoted);
  } else {
    ctx.note(all.front().line, "[" + table_name + "] removed " + removed_names +
                                   " (they set nothing; offload keeps its default, \"optimizer\")");
  }
  for (std::size_t i = 0; i < all.size(); ++i)
    if (i != skip) remove(ctx.doc, ctx.edits, all[i]);
}

// Legacy key names in a table that is not a ModelConfig (e.g. the pre-RL
// [train] section) are left alone, with a warning.
inline void warn_elsewhere(context& ctx) {
  std::set<std::string> seen;
  auto check = [&](const path_t& path, std::size_t line) {
    for (std::size_t i = 0; i < path.size(); ++i) {
      if (path[i] != fsdp_key && path[i] != optim_key && path[i] != full_key) continue;
      path_t owner(path.begin(), path.begin() + static_cast<std::ptrdiff_t>(i));
      if (std::find(model_tables().begin(), model_tables().end(), owner) != model_tables().end()) return;
      path_t key(path.begin(), path.begin() + static_cast<std::ptrdiff_t>(i) + 1);
      if (seen.insert(dotted(key)).second) {
        ctx.warning(line,
                    dotted(key) + " is not in a model table ([model] or [trainer.model]); left unchanged");
      }
      return;
    }
  };
  for (const auto& h : ctx.doc.headers()) check(h.path, h.line);
  std::function<void(const key_value&)> visit = [&](const key_value& kv) {
    check(kv.path, ctx.doc.line_of(kv.key_begin));
    for (const auto& e : kv.entries) visit(e);
  };
  for (const auto& kv : ctx.doc.key_values()) visit(kv);
}

inline step make() {
  step s;
  s.version = 1;
  s.name = "0001_offload_to_single_field";
  s.summary =
      "fsdp_cpu_offload / optim_cpu_offload / full_offload -> offload = \"none\" | \"optimizer\" | \"full\"";
  s.run = [](context& ctx) {
    for (const path_t& table : model_tables()) migrate_table(ctx, table);
    warn_elsewhere(ctx);
  };
  return s;
}

}  // namespace primecfg::migrate::m0001
