// The text map must agree with toml++ on every key and where its value starts:
// the migration edits by these spans.
#include "document.hpp"
#include "helpers.hpp"

#include <map>

using namespace mt;

namespace {

using positions = std::map<std::string, std::size_t>;  // dotted path -> 1-based line of the value

void from_toml(const toml::table& t, path_t& path, positions& out) {
  for (const auto& [k, v] : t) {
    path.emplace_back(k.str());
    const toml::array* arr = v.as_array();
    bool array_of_tables =
        arr != nullptr && !arr->empty() && arr->front().is_table() && !arr->front().as_table()->is_inline();
    if (const toml::table* sub = v.as_table()) {
      from_toml(*sub, path, out);
    } else if (!array_of_tables) {  // [[...]] sections are not model tables; the map skips them
      out[dotted(path)] = v.source().begin.line;
    }
    path.pop_back();
  }
}

void from_document(const document& d, const key_value& kv, positions& out) {
  if (kv.inline_table && !kv.entries.empty()) {
    for (const auto& e : kv.entries) from_document(d, e, out);
  } else if (!kv.inline_table) {
    out[dotted(kv.path)] = d.line_of(kv.value_begin) + 1;
  }
}

void agree(const std::string& text, bool has_values = true) {
  toml::table t = toml::parse(text);
  positions expected, found;
  path_t path;
  from_toml(t, path, expected);
  document d(text);
  for (const auto& kv : d.key_values())
    if (!kv.in_array_of_tables) from_document(d, kv, found);
  if (has_values) CHECK_FALSE(expected.empty());
  CHECK(found == expected);
}

}  // namespace

TEST_CASE("text map: agrees with toml++ on tricky values") {
  agree(
      "a = 1979-05-27 07:32:00Z # date with a space\n"
      "b = '''it's \"multi\"\n"
      "line'''''\n"
      "c = \"\"\"x = [\n"
      "[not.a.header]\"\"\"\n"
      "d = [ # comment\n"
      "  1, # one\n"
      "  [2, 3],\n"
      "  { e = \"}\" },\n"
      "]\n"
      "\"quoted.key\" . 'lit' = { x.y = 1, z = { w = [1, {v = 2}] } }\n"
      "[t . 'u' . \"v\"]  # header\n"
      "k = -inf\n"
      "l = 0x1F\n"
      "m = \"\\u00e9\\\"\"\n"
      "[[arr]]\n"
      "n = 1\n"
      "[[arr]]\n"
      "n = 2\n"
      "[arr.sub]\n"
      "o = 3\n"
      "[after]\n"
      "p = true\n");
}

TEST_CASE("text map: agrees with toml++ on every corpus file") {
  for (const auto& e : fs::recursive_directory_iterator(env("PRIMECFG_MIGRATE_CORPUS"))) {
    if (e.path().extension() != ".toml") continue;
    CAPTURE(e.path());
    agree(read(e.path()), false);
  }
}

TEST_CASE("text map: lines, kinds and line endings") {
  document d("# c\r\n\r\nk = \"\"\"\r\n# not a comment\r\n\"\"\"\n[h]");
  REQUIRE(d.lines().size() == 6);
  CHECK(d.lines()[0].kind == line_kind::comment);
  CHECK(d.lines()[1].kind == line_kind::blank);
  CHECK(d.lines()[2].kind == line_kind::code);
  CHECK(d.lines()[3].kind == line_kind::continuation);
  CHECK(d.eol_of(0) == "\r\n");
  CHECK(d.eol_of(4) == "\n");
  CHECK(d.eol_of(5).empty());
  CHECK_FALSE(d.has_final_newline());
  REQUIRE(d.headers().size() == 1);
  CHECK(d.headers()[0].line == 5);
}
