#include "json.hpp"

#include <primecfg/detail/quote.hpp>
#include <primecfg/detail/utf8.hpp>

#include <charconv>
#include <cmath>
#include <cstdio>

namespace primecfg::train::json {

namespace {

class parser {
 public:
  explicit parser(std::string_view text) : s_(text) {}

  value document() {
    value v = parse_value(0);
    skip_ws();
    if (pos_ != s_.size()) fail("trailing characters after the JSON value");
    return v;
  }

 private:
  std::string_view s_;
  std::size_t pos_ = 0;

  [[noreturn]] void fail(const std::string& what) const {
    throw error("JSON: " + what + " at byte " + std::to_string(pos_));
  }

  void skip_ws() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\n' || s_[pos_] == '\r' || s_[pos_] == '\t'))
      ++pos_;
  }

  char peek() {
    skip_ws();
    if (pos_ >= s_.size()) fail("unexpected end of input");
    return s_[pos_];
  }

  void expect(std::string_view word) {
    if (s_.substr(pos_, word.size()) != word) fail("expected '" + std::string(word) + "'");
    pos_ += word.size();
  }

  value parse_value(int depth) {
    if (depth > 256) fail("nesting deeper than 256");
    switch (peek()) {
      case '{':
        return parse_object(depth);
      case '[':
        return parse_array(depth);
      case '"':
        return value{parse_string()};
      case 't':
        expect("true");
        return value{true};
      case 'f':
        expect("false");
        return value{false};
      case 'n':
        expect("null");
        return value{};
      default:
        return value{parse_number()};
    }
  }

  value parse_object(int depth) {
    ++pos_;  // '{'
    object out;
    if (peek() == '}') {
      ++pos_;
      return value{std::move(out)};
    }
    for (;;) {
      if (peek() != '"') fail("expected a string key");
      const std::size_t key_at = pos_;
      std::string key = parse_string();
      if (peek() != ':') fail("expected ':'");
      ++pos_;
      // A key twice would keep one of the values silently: which one is not the writer's intent.
      if (out.count(key)) {
        pos_ = key_at;
        fail("duplicate key " + quote(key));
      }
      out.emplace(std::move(key), parse_value(depth + 1));
      char c = peek();
      ++pos_;
      if (c == '}') break;
      if (c != ',') fail("expected ',' or '}'");
    }
    return value{std::move(out)};
  }

  value parse_array(int depth) {
    ++pos_;  // '['
    array out;
    if (peek() == ']') {
      ++pos_;
      return value{std::move(out)};
    }
    for (;;) {
      out.push_back(parse_value(depth + 1));
      char c = peek();
      ++pos_;
      if (c == ']') break;
      if (c != ',') fail("expected ',' or ']'");
    }
    return value{std::move(out)};
  }

  std::uint32_t hex4() {
    if (pos_ + 4 > s_.size()) fail("truncated \\u escape");
    std::uint32_t cp = 0;
    auto r = std::from_chars(s_.data() + pos_, s_.data() + pos_ + 4, cp, 16);
    if (r.ptr != s_.data() + pos_ + 4) fail("bad \\u escape");
    pos_ += 4;
    return cp;
  }

  std::string parse_string() {
    ++pos_;  // opening quote
    std::string out;
    while (pos_ < s_.size()) {
      char c = s_[pos_++];
      if (c == '"') return out;
      if (static_cast<unsigned char>(c) < 0x20) fail("control character in string");
      if (c != '\\') {
        out += c;
        continue;
      }
      if (pos_ >= s_.size()) break;
      char e = s_[pos_++];
      switch (e) {
        case '"':
          out += '"';
          break;
        case '\\':
          out += '\\';
          break;
        case '/':
          out += '/';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'n':
          out += '\n';
          break;
        case 'r':
          out += '\r';
          break;
        case 't':
          out += '\t';
          break;
        case 'u': {
          std::uint32_t cp = hex4();
          // A surrogate only as the first half of a pair: a lone one (or a
          // pair with a bad second half) is no character, and used to become
          // invalid UTF-8 or a different character.
          if (cp >= 0xDC00 && cp < 0xE000) fail("a lone UTF-16 low surrogate in a \\u escape");
          if (cp >= 0xD800 && cp < 0xDC00) {
            if (s_.substr(pos_, 2) != "\\u") fail("a lone UTF-16 high surrogate in a \\u escape");
            pos_ += 2;
            std::uint32_t lo = hex4();
            if (lo < 0xDC00 || lo >= 0xE000) fail("a UTF-16 high surrogate not followed by a low one");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          }
          primecfg::detail::append_utf8(out, cp);
          break;
        }
        default:
          fail("bad escape");
      }
    }
    fail("unterminated string");
  }

  number parse_number() {
    std::size_t start = pos_;
    if (pos_ < s_.size() && s_[pos_] == '-') ++pos_;
    bool integral = true;
    while (pos_ < s_.size()) {
      char c = s_[pos_];
      if (c >= '0' && c <= '9') {
        ++pos_;
      } else if (c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-') {
        integral = false;
        ++pos_;
      } else {
        break;
      }
    }
    std::string_view text = s_.substr(start, pos_ - start);
    if (text.empty() || text == "-") fail("expected a value");
    number n;
    std::string copy(text);
    char* end = nullptr;
    n.d = std::strtod(copy.c_str(), &end);
    if (end != copy.c_str() + copy.size()) fail("bad number");
    // 1e400 reads as infinity, which JSON cannot write back (it came out as `inf`).
    if (!std::isfinite(n.d)) fail("number out of range: " + copy);
    if (integral) {
      auto r = std::from_chars(text.data(), text.data() + text.size(), n.i);
      n.integral = r.ec == std::errc{};
    } else if (std::isfinite(n.d) && n.d == std::floor(n.d) && std::fabs(n.d) < 9e15) {
      n.i = static_cast<std::int64_t>(n.d);
      n.integral = true;
    }
    return n;
  }
};

[[noreturn]] void wrong(const char* expected) { throw error(std::string("JSON: expected ") + expected); }

}  // namespace

bool value::as_bool() const {
  if (!is_bool()) wrong("a boolean");
  return std::get<bool>(v);
}
double value::as_double() const {
  if (!is_number()) wrong("a number");
  return std::get<number>(v).d;
}
std::int64_t value::as_int() const {
  if (!is_number() || !std::get<number>(v).integral) wrong("an integer");
  return std::get<number>(v).i;
}
const std::string& value::as_string() const {
  if (!is_string()) wrong("a string");
  return std::get<std::string>(v);
}
const array& value::as_array() const {
  if (!is_array()) wrong("an array");
  return std::get<array>(v);
}
const object& value::as_object() const {
  if (!is_object()) wrong("an object");
  return std::get<object>(v);
}
const value* value::find(std::string_view key) const {
  if (!is_object()) return nullptr;
  const auto& o = std::get<object>(v);
  auto it = o.find(key);
  return it == o.end() ? nullptr : &it->second;
}

value parse(std::string_view text) { return parser(text).document(); }

// JSON and TOML basic strings escape alike; one implementation for both.
std::string quote(std::string_view s) { return primecfg::detail::quote_toml_string(s); }

}  // namespace primecfg::train::json
