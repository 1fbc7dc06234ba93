#include "base/strict_json.hpp"

#include <primecfg/detail/utf8.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <vector>

namespace primecfg::train::strict_json {

namespace {

// "line L, column C" of a byte offset (columns count bytes from 1).
std::string where(std::string_view text, std::size_t offset) {
  offset = std::min(offset, text.size());
  const std::string_view before = text.substr(0, offset);
  const std::size_t line_start = before.rfind('\n') == std::string_view::npos ? 0 : before.rfind('\n') + 1;
  const auto lines = std::count(before.begin(), before.end(), '\n');
  return fmt::format("line {}, column {}", lines + 1, offset - line_start + 1);
}

// A char iterator that counts how far nlohmann's lexer has read, so that the
// errors raised from the SAX callbacks below can say where they are.
struct counting_iterator {
  using iterator_category = std::input_iterator_tag;
  using value_type = char;
  using difference_type = std::ptrdiff_t;
  using pointer = const char*;
  using reference = const char&;

  const char* p;
  std::size_t* consumed;

  reference operator*() const { return *p; }
  counting_iterator& operator++() {
    ++p;
    ++*consumed;
    return *this;
  }
  counting_iterator operator++(int) {
    counting_iterator old = *this;
    ++*this;
    return old;
  }
  bool operator==(const counting_iterator& o) const { return p == o.p; }
  bool operator!=(const counting_iterator& o) const { return p != o.p; }
};

// Builds the document (nlohmann's SAX interface) and refuses what nlohmann lets through.
class strict_builder {
 public:
  strict_builder(std::string_view text, const std::size_t& consumed) : text_(text), consumed_(consumed) {}

  value take() { return std::move(root_); }

  bool null() { return put(nullptr) != nullptr; }
  bool boolean(bool b) { return put(b) != nullptr; }
  bool number_integer(value::number_integer_t n) { return put(n) != nullptr; }
  bool number_unsigned(value::number_unsigned_t n) { return put(n) != nullptr; }
  bool number_float(value::number_float_t d, const value::string_t& literal) {
    // nlohmann reads an integer literal that overflows 64 bits as a double (and
    // refuses 1e400 itself, error 406).
    if (literal.find_first_of(".eE") == std::string::npos)
      fail_at(number_start(literal), "integer " + literal + " does not fit in 64 bits");
    return put(d) != nullptr;
  }
  bool string(value::string_t& s) { return put(std::move(s)) != nullptr; }
  bool binary(value::binary_t&) { return false; }  // JSON text has no binary values
  bool start_object(std::size_t) { return open(value::object()); }
  bool key(value::string_t& k) {
    auto& members = stack_.back()->get_ref<value::object_t&>();
    auto [it, fresh] = members.emplace(k, nullptr);
    if (!fresh) fail_at(key_start(), "duplicate key " + dump(value(k)));
    slot_ = &it->second;
    return true;
  }
  bool end_object() {
    stack_.pop_back();
    return true;
  }
  bool start_array(std::size_t) { return open(value::array()); }
  bool end_array() {
    stack_.pop_back();
    return true;
  }
  bool parse_error(std::size_t position, const std::string& last_token, const nlohmann::json::exception& e) {
    // what(): "[json.exception.parse_error.101] parse error at line 1, column 2: <what>",
    // or "[json.exception.out_of_range.406] number overflow parsing '1e400'".
    std::string what = e.what();
    if (const auto at = what.find("] "); what.rfind("[json.exception.", 0) == 0 && at != std::string::npos)
      what.erase(0, at + 2);
    if (const auto at = what.find(": "); what.rfind("parse error", 0) == 0 && at != std::string::npos)
      what.erase(0, at + 2);
    // The lexer quotes what it read last, bytes that are not UTF-8 included.
    if (!primecfg::detail::is_valid_utf8(what)) {
      std::string clean;
      for (unsigned char c : what)
        clean += c < 0x80 ? std::string(1, static_cast<char>(c)) : fmt::format("\\x{:02X}", c);
      what = clean;
    }
    // position counts the bytes read: the error is at the last of them, or for a
    // number out of range (406) where that number begins.
    fail_at(e.id == 406 && position >= last_token.size() ? position - last_token.size()
            : position == 0                              ? 0
                                                         : position - 1,
            what);
  }

 private:
  [[noreturn]] void fail_at(std::size_t offset, const std::string& what) const {
    throw error("JSON: " + what + " at " + where(text_, offset));
  }

  // Where the key just read begins: the lexer stopped after its closing quote,
  // and every quote inside a JSON string is escaped.
  std::size_t key_start() const {
    std::size_t i = consumed_ - 1;
    while (i > 0) {
      --i;
      if (text_[i] != '"') continue;
      std::size_t backslashes = 0;
      while (backslashes < i && text_[i - 1 - backslashes] == '\\') ++backslashes;
      if (backslashes % 2 == 0) return i;
    }
    return i;
  }
  // Where the number just read begins: the lexer read one byte past it unless it
  // ended the input.
  std::size_t number_start(const std::string& literal) const {
    const std::size_t n = literal.size();
    if (consumed_ >= n + 1 && text_.substr(consumed_ - 1 - n, n) == literal) return consumed_ - 1 - n;
    return consumed_ >= n ? consumed_ - n : 0;
  }

  value* put(value v) {
    if (stack_.empty()) {
      root_ = std::move(v);
      return &root_;
    }
    value& top = *stack_.back();
    if (top.is_array()) {
      top.push_back(std::move(v));
      return &top.back();
    }
    *slot_ = std::move(v);
    return slot_;
  }
  bool open(value container) {
    if (stack_.size() >= max_depth)
      fail_at(consumed_ - 1, fmt::format("containers nested more than {} deep", max_depth));
    stack_.push_back(put(std::move(container)));
    return true;
  }

  std::string_view text_;
  const std::size_t& consumed_;
  value root_;
  // The containers being filled, innermost last. Each pointer stays valid: only the
  // innermost container grows, and object members never move.
  std::vector<value*> stack_;
  value* slot_ = nullptr;  // the member whose key was read last
};

}  // namespace

value parse(std::string_view text) {
  if (text.substr(0, 3) == "\xEF\xBB\xBF")
    throw error("JSON: a byte order mark (U+FEFF) before the value at " + where(text, 0) +
                "; JSON text has none (RFC 8259), and Python's json refuses it");
  std::size_t consumed = 0;
  strict_builder builder(text, consumed);
  const counting_iterator first{text.data(), &consumed}, last{text.data() + text.size(), &consumed};
  // strict: the value must end the input; comments are errors.
  if (!value::sax_parse(first, last, &builder, nlohmann::json::input_format_t::json, true, false))
    throw error("JSON: not a JSON document");  // binary(), which JSON text never reaches
  return builder.take();
}

std::optional<std::int64_t> integer(const value& v) {
  if (v.is_number_unsigned()) {
    const auto u = v.get<value::number_unsigned_t>();
    if (u > static_cast<std::uint64_t>(INT64_MAX)) return std::nullopt;
    return static_cast<std::int64_t>(u);
  }
  if (v.is_number_integer()) return v.get<value::number_integer_t>();
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (d == std::floor(d) && std::fabs(d) < 0x1p53) return static_cast<std::int64_t>(d);
  }
  return std::nullopt;
}

const value* find(const value& v, std::string_view key) {
  if (!v.is_object()) return nullptr;
  const auto it = v.find(key);
  return it == v.end() ? nullptr : &*it;
}

namespace {
template <class Json>
std::string dump_as(const Json& v, int indent) {
  try {
    // strict: invalid UTF-8 throws type_error 316 instead of being replaced.
    return v.dump(indent, ' ', false, nlohmann::json::error_handler_t::strict);
  } catch (const nlohmann::json::type_error& e) {
    throw error(std::string("JSON: cannot write a string that is not valid UTF-8 (") + e.what() + ")");
  }
}
}  // namespace

std::string dump(const ordered& v, int indent) { return dump_as(v, indent); }
std::string dump(const value& v, int indent) { return dump_as(v, indent); }

}  // namespace primecfg::train::strict_json
