#include "document.hpp"

#include <primecfg/detail/utf8.hpp>

#include <algorithm>
#include <cstdint>
#include <stdexcept>

namespace primecfg::migrate {

namespace {

bool is_bare_char(char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
}

// A recursive-descent walk over text that toml++ has already accepted.
class scanner {
 public:
  explicit scanner(const std::string& t) : t_(t) {}

  void run(std::vector<header>& headers, std::vector<key_value>& kvs,
           std::vector<std::pair<std::size_t, std::size_t>>& multiline_values) {
    spans_ = &multiline_values;
    if (t_.compare(0, 3, "\xEF\xBB\xBF") == 0) p_ = 3;
    path_t table;
    int current_header = -1;
    bool in_array = false;
    std::vector<path_t> array_tables;
    while (true) {
      skip_ws_newlines_comments();
      if (p_ >= t_.size()) break;
      if (t_[p_] == '[') {
        header h;
        h.begin = p_;
        ++p_;
        if (peek() == '[') {
          h.array = true;
          ++p_;
        }
        skip_ws();
        h.key = parse_key();
        skip_ws();
        p_ += h.array ? 2 : 1;  // "]]" or "]"
        h.end = p_;
        for (const auto& s : h.key) h.path.push_back(s.name);
        h.in_array_of_tables = h.array;
        for (const auto& a : array_tables)
          h.in_array_of_tables = h.in_array_of_tables || starts_with(h.path, a);
        if (h.array) array_tables.push_back(h.path);
        table = h.path;
        in_array = h.in_array_of_tables;
        headers.push_back(std::move(h));
        current_header = static_cast<int>(headers.size()) - 1;
      } else {
        std::size_t before = p_;
        key_value kv = parse_key_value(table);
        if (p_ <= before || kv.key_end == kv.key_begin)
          throw std::runtime_error("the text map lost its place");
        kv.header = current_header;
        kv.in_array_of_tables = in_array;
        kvs.push_back(std::move(kv));
      }
    }
  }

 private:
  char peek(std::size_t ahead = 0) const { return p_ + ahead < t_.size() ? t_[p_ + ahead] : '\0'; }

  void skip_ws() {
    while (p_ < t_.size() && (t_[p_] == ' ' || t_[p_] == '\t')) ++p_;
  }

  void skip_comment() {
    if (peek() == '#')
      while (p_ < t_.size() && t_[p_] != '\n') ++p_;
  }

  void skip_ws_newlines_comments() {
    while (p_ < t_.size()) {
      char c = t_[p_];
      if (c == ' ' || c == '\t' || c == '\r' || c == '\n') {
        ++p_;
      } else if (c == '#') {
        skip_comment();
      } else {
        break;
      }
    }
  }

  std::string parse_basic_string_body() {  // p_ just after the opening quote
    std::string out;
    while (p_ < t_.size() && t_[p_] != '"') {
      if (t_[p_] == '\\') {
        char e = peek(1);
        p_ += 2;
        switch (e) {
          case 'b':
            out += '\b';
            break;
          case 't':
            out += '\t';
            break;
          case 'n':
            out += '\n';
            break;
          case 'f':
            out += '\f';
            break;
          case 'r':
            out += '\r';
            break;
          case 'e':
            out += '\x1B';
            break;
          case 'u':
          case 'U': {
            std::size_t n = e == 'u' ? 4 : 8;
            std::uint32_t cp = static_cast<std::uint32_t>(std::stoul(t_.substr(p_, n), nullptr, 16));
            p_ += n;
            primecfg::detail::append_utf8(out, cp);
            break;
          }
          default:
            out += e;
            break;
        }
      } else {
        out += t_[p_++];
      }
    }
    ++p_;  // closing quote
    return out;
  }

  std::vector<key_segment> parse_key() {
    std::vector<key_segment> key;
    while (true) {
      key_segment s;
      s.begin = p_;
      if (peek() == '"') {
        ++p_;
        s.name = parse_basic_string_body();
      } else if (peek() == '\'') {
        ++p_;
        std::size_t close = t_.find('\'', p_);
        s.name = t_.substr(p_, close - p_);
        p_ = close + 1;
      } else {
        while (p_ < t_.size() && is_bare_char(t_[p_])) ++p_;
        s.name = t_.substr(s.begin, p_ - s.begin);
      }
      s.end = p_;
      key.push_back(std::move(s));
      std::size_t save = p_;
      skip_ws();
      if (peek() == '.') {
        ++p_;
        skip_ws();
        continue;
      }
      p_ = save;
      return key;
    }
  }

  key_value parse_key_value(const path_t& container) {
    need_more();
    key_value kv;
    kv.key_begin = p_;
    kv.key = parse_key();
    kv.key_end = p_;
    kv.path = container;
    for (const auto& s : kv.key) kv.path.push_back(s.name);
    skip_ws();
    ++p_;  // '='
    skip_ws();
    kv.value_begin = p_;
    if (peek() == '{') {
      kv.inline_table = true;
      parse_inline_table(kv.path, kv.entries);
    } else {
      skip_value();
    }
    kv.value_end = p_;
    if (std::find(t_.begin() + kv.value_begin, t_.begin() + kv.value_end, '\n') != t_.begin() + kv.value_end)
      spans_->emplace_back(kv.value_begin, kv.value_end);
    return kv;
  }

  // The text parsed with toml++ first, so running off its end means the
  // scanner and toml++ disagree: stop rather than guess.
  void need_more() const {
    if (p_ >= t_.size()) throw std::runtime_error("the text map ran past the end of the document");
  }

  void parse_inline_table(const path_t& path, std::vector<key_value>& entries) {
    ++p_;  // '{'
    while (true) {
      skip_ws_newlines_comments();
      need_more();
      if (peek() == '}') {
        ++p_;
        return;
      }
      if (peek() == ',') {
        ++p_;
        continue;
      }
      entries.push_back(parse_key_value(path));
    }
  }

  void skip_value() {
    char c = peek();
    if (c == '"' || c == '\'') {
      if (peek(1) == c && peek(2) == c) {  // multi-line string
        p_ += 3;
        while (p_ < t_.size()) {
          if (c == '"' && t_[p_] == '\\') {
            p_ += 2;
            continue;
          }
          if (t_[p_] == c && peek(1) == c && peek(2) == c) {
            std::size_t q = 0;
            while (peek(q) == c && q < 5) ++q;
            p_ += q;
            return;
          }
          ++p_;
        }
        return;
      }
      ++p_;
      if (c == '"') {
        parse_basic_string_body();
      } else {
        p_ = t_.find('\'', p_) + 1;
      }
      return;
    }
    if (c == '[') {
      ++p_;
      while (true) {
        skip_ws_newlines_comments();
        need_more();
        if (peek() == ']') {
          ++p_;
          return;
        }
        if (peek() == ',') {
          ++p_;
          continue;
        }
        if (peek() == '{') {
          std::vector<key_value> ignored;
          parse_inline_table({}, ignored);
        } else {
          skip_value();
        }
      }
    }
    if (c == '{') {
      std::vector<key_value> ignored;
      parse_inline_table({}, ignored);
      return;
    }
    // A bare scalar: number, boolean, date or time.
    std::size_t start = p_;
    auto stops = [](char ch) {
      return ch == ' ' || ch == '\t' || ch == ',' || ch == ']' || ch == '}' || ch == '#' || ch == '\r' ||
             ch == '\n';
    };
    while (p_ < t_.size() && !stops(t_[p_])) ++p_;
    // A date and a time may be separated by one space: 1979-05-27 07:32:00.
    if (p_ - start == 10 && t_[start + 4] == '-' && t_[start + 7] == '-' && peek() == ' ' &&
        std::isdigit(static_cast<unsigned char>(peek(1))) &&
        std::isdigit(static_cast<unsigned char>(peek(2))) && peek(3) == ':') {
      ++p_;
      while (p_ < t_.size() && !stops(t_[p_])) ++p_;
    }
  }

  const std::string& t_;
  std::size_t p_ = 0;
  std::vector<std::pair<std::size_t, std::size_t>>* spans_ = nullptr;
};

}  // namespace

bool starts_with(const path_t& path, const path_t& prefix) {
  return prefix.size() <= path.size() && std::equal(prefix.begin(), prefix.end(), path.begin());
}

std::string dotted(const path_t& path) {
  std::string out;
  for (const auto& s : path) {
    if (!out.empty()) out += '.';
    bool bare = !s.empty() && std::all_of(s.begin(), s.end(), is_bare_char);
    if (bare) {
      out += s;
    } else {
      out += '"';
      for (char c : s) {
        if (c == '"' || c == '\\') out += '\\';
        out += c;
      }
      out += '"';
    }
  }
  return out;
}

document::document(std::string text) : text_(std::move(text)) {
  // Lines and their end-of-line sequences.
  std::size_t b = 0;
  while (b < text_.size()) {
    std::size_t nl = text_.find('\n', b);
    line_info li;
    li.begin = b;
    if (nl == std::string::npos) {
      li.content_end = li.end = text_.size();
    } else {
      li.content_end = (nl > b && text_[nl - 1] == '\r') ? nl - 1 : nl;
      li.end = nl + 1;
    }
    lines_.push_back(li);
    b = li.end;
  }

  std::vector<std::pair<std::size_t, std::size_t>> multiline;
  scanner(text_).run(headers_, key_values_, multiline);
  for (auto& h : headers_) h.line = line_of(h.begin);

  for (auto& li : lines_) {
    std::string_view s(text_.data() + li.begin, li.content_end - li.begin);
    std::size_t first = s.find_first_not_of(" \t");
    if (li.begin == 0 && s.substr(0, 3) == "\xEF\xBB\xBF") first = s.find_first_not_of(" \t", 3);
    if (first == std::string_view::npos) {
      li.kind = line_kind::blank;
    } else if (s[first] == '#') {
      li.kind = line_kind::comment;
    } else {
      li.kind = line_kind::code;
    }
  }
  for (auto [vb, ve] : multiline) {
    for (std::size_t l = line_of(vb) + 1; l <= line_of(ve > 0 ? ve - 1 : 0) && l < lines_.size(); ++l)
      lines_[l].kind = line_kind::continuation;
  }
}

std::size_t document::line_of(std::size_t offset) const {
  auto it = std::upper_bound(lines_.begin(), lines_.end(), offset,
                             [](std::size_t off, const line_info& li) { return off < li.begin; });
  if (it == lines_.begin()) return 0;
  return static_cast<std::size_t>(it - lines_.begin()) - 1;
}

std::string_view document::line_text(std::size_t line) const {
  const auto& li = lines_.at(line);
  return std::string_view(text_).substr(li.begin, li.content_end - li.begin);
}

std::string_view document::eol_of(std::size_t line) const {
  const auto& li = lines_.at(line);
  return std::string_view(text_).substr(li.content_end, li.end - li.content_end);
}

std::string_view document::preferred_eol() const {
  for (std::size_t l = 0; l < lines_.size(); ++l)
    if (!eol_of(l).empty()) return eol_of(l);
  return "\n";
}

bool document::has_final_newline() const { return !text_.empty() && text_.back() == '\n'; }

std::size_t document::section_end_line(int h) const {
  std::size_t next = static_cast<std::size_t>(h + 1);
  return next < headers_.size() ? headers_[next].line : lines_.size();
}

}  // namespace primecfg::migrate
