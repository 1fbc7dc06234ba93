#include "plan.hpp"

#include <algorithm>

namespace primecfg::migrate {

void plan::delete_lines(std::size_t first, std::size_t last) {
  for (std::size_t l = first; l <= last && l < deleted_.size(); ++l) deleted_[l] = true;
}

void plan::replace(std::size_t begin, std::size_t end, std::string text) {
  spans_.push_back({begin, end, std::move(text)});
}

void plan::insert_after(std::size_t line, std::string content) { inserts_.emplace(line, std::move(content)); }

bool plan::empty() const {
  return spans_.empty() && inserts_.empty() && entry_edits_.empty() &&
         std::none_of(deleted_.begin(), deleted_.end(), [](bool b) { return b; });
}

bool plan::has_entry_edits(const key_value& kv) const {
  for (const auto& e : kv.entries) {
    if (entry_edits_.count(&e) || (e.inline_table && has_entry_edits(e))) return true;
  }
  return false;
}

std::string plan::render_inline(const key_value& kv) const {
  const document& d = *doc_;
  const auto& es = kv.entries;
  auto entry_text = [&](const key_value& e) -> std::string {
    if (auto it = entry_edits_.find(&e); it != entry_edits_.end()) return *it->second;
    if (e.inline_table && has_entry_edits(e))
      return std::string(d.slice(e.key_begin, e.value_begin)) + render_inline(e);
    return std::string(d.slice(e.key_begin, e.value_end));
  };
  std::vector<std::size_t> kept;
  for (std::size_t i = 0; i < es.size(); ++i) {
    auto it = entry_edits_.find(&es[i]);
    if (it == entry_edits_.end() || it->second.has_value()) kept.push_back(i);
  }
  if (kept.empty()) return "{}";
  std::string out = "{";
  out += d.slice(kv.value_begin + 1, es.front().key_begin);
  for (std::size_t j = 0; j < kept.size(); ++j) {
    if (j > 0) out += d.slice(es[kept[j - 1]].value_end, es[kept[j - 1] + 1].key_begin);
    out += entry_text(es[kept[j]]);
  }
  out += d.slice(es.back().value_end, kv.value_end - 1);
  out += '}';
  return out;
}

std::string plan::apply() const {
  const document& d = *doc_;
  const auto& lines = d.lines();
  const std::size_t n = lines.size();
  auto blank = [&](std::size_t l) { return lines[l].kind == line_kind::blank; };
  auto has_insert = [&](std::size_t l) { return inserts_.count(l) > 0; };

  // Collapse the blank lines a removal leaves doubled (or leading / trailing).
  std::vector<bool> del = deleted_;
  for (std::size_t a = 0; a < n;) {
    if (!deleted_[a]) {
      ++a;
      continue;
    }
    std::size_t b = a;
    while (b + 1 < n && deleted_[b + 1]) ++b;
    bool before_blank = a == 0 || (blank(a - 1) && !del[a - 1] && !has_insert(a - 1));
    if (a > 0 && del[a - 1]) before_blank = false;
    if (before_blank && !has_insert(b)) {
      std::size_t m = b + 1;
      while (m < n && blank(m) && !deleted_[m] && !has_insert(m - 1)) {
        del[m] = true;
        ++m;
      }
      if (m == n && a > 0) {  // the removal reached the end: drop the blank lines before it as well
        for (std::size_t k = a; k-- > 0 && blank(k) && !del[k] && !has_insert(k);) del[k] = true;
      }
    }
    a = b + 1;
  }

  std::vector<span> all;
  for (std::size_t a = 0; a < n;) {
    if (!del[a]) {
      ++a;
      continue;
    }
    std::size_t b = a;
    while (b + 1 < n && del[b + 1]) ++b;
    all.push_back({lines[a].begin, lines[b].end, ""});
    a = b + 1;
  }
  for (const auto& s : spans_) all.push_back(s);
  for (const auto& [line, content] : inserts_) {
    if (del[line]) throw internal_error("a line was to be inserted after a removed line");
    std::string_view eol = d.eol_of(line);
    if (!eol.empty()) {
      all.push_back({lines[line].end, lines[line].end, content + std::string(eol)});
    } else {
      all.push_back(
          {lines[line].content_end, lines[line].content_end, std::string(d.preferred_eol()) + content});
    }
  }
  // Inline tables with edited entries are re-rendered from their own bytes.
  for (const auto& kv : d.key_values()) {
    if (kv.inline_table && has_entry_edits(kv)) {
      all.push_back({kv.value_begin, kv.value_end, render_inline(kv)});
    }
  }

  std::stable_sort(all.begin(), all.end(), [](const span& x, const span& y) {
    if (x.begin != y.begin) return x.begin < y.begin;
    return (x.end == x.begin) > (y.end == y.begin);  // insertions before a removal at the same place
  });
  std::string out;
  out.reserve(d.text().size() + 64);
  std::size_t pos = 0;
  for (const auto& s : all) {
    if (s.begin < pos) throw internal_error("two edits overlap");
    out += d.slice(pos, s.begin);
    out += s.text;
    pos = s.end;
  }
  out += d.slice(pos, d.text().size());

  if (!d.has_final_newline() && !out.empty() && out.back() == '\n') {
    out.pop_back();
    if (!out.empty() && out.back() == '\r') out.pop_back();
  }
  return out;
}

}  // namespace primecfg::migrate
