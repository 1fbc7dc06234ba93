#include "step.hpp"

#include <algorithm>

namespace primecfg::migrate {

std::string_view to_string(level l) {
  switch (l) {
    case level::error:
      return "error";
    case level::warning:
      return "warning";
    case level::note:
      return "note";
  }
  return "note";
}

const std::vector<path_t>& model_tables() {
  static const std::vector<path_t> tables = {{"model"}, {"trainer", "model"}};
  return tables;
}

const toml::node* node_at(const toml::table& root, const path_t& path) {
  const toml::node* n = &root;
  for (const auto& seg : path) {
    const toml::table* t = n->as_table();
    if (t == nullptr) return nullptr;
    n = t->get(seg);
    if (n == nullptr) return nullptr;
  }
  return n;
}

namespace {

std::size_t container_size(const key_value& kv) { return kv.path.size() - kv.key.size(); }

std::size_t last_line(const document& d, const key_value& kv) {
  return d.line_of(kv.value_end > kv.value_begin ? kv.value_end - 1 : kv.value_begin);
}

std::string indentation(const document& d, std::size_t line) {
  std::string_view s = d.line_text(line);
  return std::string(
      s.substr(0, s.find_first_not_of(" \t") == std::string_view::npos ? 0 : s.find_first_not_of(" \t")));
}

void visit(const document& d, const key_value& kv, bool entry, const path_t& p,
           std::vector<occurrence>& out) {
  if (starts_with(kv.path, p)) {
    occurrence o;
    o.what = entry ? occurrence::kind::inline_entry : occurrence::kind::key_value;
    o.kv = &kv;
    o.begin = kv.key_begin;
    o.line = d.line_of(kv.key_begin);
    out.push_back(o);
  } else if (kv.inline_table && starts_with(p, kv.path)) {
    for (const auto& e : kv.entries) visit(d, e, true, p, out);
  }
}

}  // namespace

std::vector<occurrence> find_under(const document& d, const path_t& p) {
  std::vector<occurrence> out;
  const auto& hs = d.headers();
  for (std::size_t i = 0; i < hs.size(); ++i) {
    if (hs[i].in_array_of_tables || !starts_with(hs[i].path, p)) continue;
    occurrence o;
    o.what = occurrence::kind::header;
    o.header_index = static_cast<int>(i);
    o.begin = hs[i].begin;
    o.line = hs[i].line;
    out.push_back(o);
  }
  for (const auto& kv : d.key_values()) {
    if (kv.in_array_of_tables) continue;
    if (kv.header >= 0 && starts_with(hs[kv.header].path, p)) continue;
    visit(d, kv, false, p, out);
  }
  std::sort(out.begin(), out.end(),
            [](const occurrence& a, const occurrence& b) { return a.begin < b.begin; });
  return out;
}

std::pair<std::size_t, std::size_t> header_region(const document& d, int header_index) {
  const auto& lines = d.lines();
  std::size_t first = d.headers()[header_index].line;
  std::size_t next = d.section_end_line(header_index);
  std::size_t last_body = first;
  for (const auto& kv : d.key_values())
    if (kv.header == header_index) last_body = std::max(last_body, last_line(d, kv));
  std::size_t e = next - 1;
  while (e > first && lines[e].kind == line_kind::comment) --e;
  while (e > first && lines[e].kind == line_kind::blank) --e;
  return {first, std::max(e, last_body)};
}

void remove(const document& d, plan& edits, const occurrence& o) {
  switch (o.what) {
    case occurrence::kind::header: {
      auto [first, last] = header_region(d, o.header_index);
      edits.delete_lines(first, last);
      break;
    }
    case occurrence::kind::key_value:
      edits.delete_lines(d.line_of(o.kv->key_begin), last_line(d, *o.kv));
      break;
    case occurrence::kind::inline_entry:
      edits.remove_entry(*o.kv);
      break;
  }
}

void replace_with_key(const document& d, plan& edits, const occurrence& o, const path_t& table,
                      std::string_view key, std::string_view value_text) {
  if (o.what == occurrence::kind::header) throw internal_error("a table header cannot be replaced by a key");
  const key_value& kv = *o.kv;
  std::size_t c = container_size(kv);
  if (table.size() < c || table.size() - c >= kv.key.size())
    throw internal_error("the key " + dotted(kv.path) + " is not written below " + dotted(table));
  std::size_t idx = table.size() - c;
  std::string text(d.slice(kv.key_begin, kv.key[idx].begin));
  text += key;
  text += d.slice(kv.key_end, kv.value_begin);
  text += value_text;
  if (o.what == occurrence::kind::inline_entry) {
    edits.replace_entry(kv, std::move(text));
  } else {
    edits.replace(kv.key_begin, kv.value_end, std::move(text));
  }
}

bool add_key(const document& d, plan& edits, const path_t& table, std::string_view key,
             std::string_view value_text, const occurrence& sub) {
  const auto& hs = d.headers();
  std::string assignment = std::string(key) + " = " + std::string(value_text);

  // (a) The table has its own [table] header: append to its pairs.
  for (std::size_t i = 0; i < hs.size(); ++i) {
    if (hs[i].array || hs[i].path != table) continue;
    std::size_t anchor = hs[i].line;
    bool after_pair = false;
    for (const auto& kv : d.key_values()) {
      if (kv.header != static_cast<int>(i)) continue;
      std::size_t l = last_line(d, kv);
      if (!edits.line_deleted(l) && l >= anchor) {
        anchor = l;
        after_pair = true;
      }
    }
    edits.insert_after(anchor, (after_pair ? indentation(d, anchor) : std::string()) + assignment);
    return false;
  }

  // (b) The table is written with dotted keys in a table above it.
  const key_value* last = nullptr;
  for (const auto& kv : d.key_values()) {
    if (kv.in_array_of_tables || !starts_with(kv.path, table) || kv.path.size() <= table.size()) continue;
    if (container_size(kv) >= table.size()) continue;
    if (edits.line_deleted(last_line(d, kv))) continue;
    last = &kv;
  }
  if (last != nullptr) {
    std::size_t idx = table.size() - container_size(*last);
    std::size_t anchor = last_line(d, *last);
    edits.insert_after(anchor, indentation(d, d.line_of(last->key_begin)) +
                                   std::string(d.slice(last->key_begin, last->key[idx].begin)) + assignment);
    return false;
  }

  // (c) The table exists only through sub-table headers: the removed
  // sub-table's header becomes the [table] header.
  if (sub.what != occurrence::kind::header)
    throw internal_error("no place to add " + dotted(table) + "." + assignment);
  const header& h = hs[sub.header_index];
  auto [first, last_l] = header_region(d, sub.header_index);
  if (last_l > first) edits.delete_lines(first + 1, last_l);
  std::string head(d.slice(h.begin, h.key.front().begin));  // "[" and any spacing
  head += d.slice(h.key.front().begin, h.key[table.size() - 1].end);
  head += d.slice(h.key.back().end, h.end);  // spacing and "]"
  edits.replace(h.begin, h.end, std::move(head));
  edits.insert_after(h.line, indentation(d, h.line) + assignment);
  return true;
}

void apply_rename(context& ctx, const key_rename& r) {
  const document& d = ctx.doc;
  std::string to_text = dotted({r.to});
  for (const auto& table : r.tables) {
    path_t from = table, to = table;
    from.push_back(r.from);
    to.push_back(r.to);
    auto found = find_under(d, from);
    if (found.empty()) continue;
    auto clash = find_under(d, to);
    if (!clash.empty()) {
      ctx.error(found.front().line, dotted(from) + " and " + dotted(to) + " (line " +
                                        std::to_string(clash.front().line + 1) +
                                        ") are both set; keep one of them");
      continue;
    }
    for (const auto& o : found) {
      if (o.what == occurrence::kind::header) {
        const header& h = d.headers()[o.header_index];
        const key_segment& seg = h.key[table.size()];
        ctx.edits.replace(seg.begin, seg.end, to_text);
        continue;
      }
      const key_value& kv = *o.kv;
      const key_segment& seg = kv.key[table.size() - container_size(kv)];
      if (o.what == occurrence::kind::inline_entry) {
        ctx.edits.replace_entry(kv, std::string(d.slice(kv.key_begin, seg.begin)) + to_text +
                                        std::string(d.slice(seg.end, kv.value_end)));
      } else {
        ctx.edits.replace(seg.begin, seg.end, to_text);
      }
    }
    std::string msg = "renamed " + dotted(from) + " to " + dotted(to);
    if (!r.why.empty()) msg += " (" + r.why + ")";
    ctx.note(found.front().line, std::move(msg));
  }
}

step rename_step(int version, std::string_view name, std::string_view summary,
                 std::vector<key_rename> renames) {
  step s;
  s.version = version;
  s.name = name;
  s.summary = summary;
  s.run = [renames = std::move(renames)](context& ctx) {
    for (const auto& r : renames) apply_rename(ctx, r);
  };
  return s;
}

}  // namespace primecfg::migrate
