// strict_json (reference_trainer/strict_json.hpp): nlohmann/json read strictly.
// Each refusal is checked with its place (line, column).
#include "strict_json.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <string>

namespace json = primecfg::train::strict_json;

namespace {

// doctest::Contains takes a C string.
doctest::Contains contains(const std::string& s) { return doctest::Contains(s.c_str()); }

void refused(const std::string& text, const std::string& what, const std::string& where) {
  CAPTURE(text);
  CHECK_THROWS_WITH_AS(json::parse(text), contains(what), json::error);
  CHECK_THROWS_WITH_AS(json::parse(text), contains(" at " + where), json::error);
}

}  // namespace

TEST_CASE("strict_json: values and escapes") {
  auto v = json::parse(R"({"a": [1, 2.5, -3e2], "s": "x\"\u00e9\ud83d\ude00", "t": true, "n": null})");
  CHECK(json::integer(v["a"][0]) == 1);
  CHECK(v["a"][1].get<double>() == 2.5);
  CHECK(json::integer(v["a"][2]) == -300);
  CHECK(v["s"] == "x\"\xc3\xa9\xf0\x9f\x98\x80");
  CHECK(v["t"] == true);
  CHECK(v["n"].is_null());
  CHECK(json::find(v, "a"));
  CHECK_FALSE(json::find(v, "b"));
  CHECK_FALSE(json::find(v["a"], "a"));
  CHECK(json::parse(" {} \n").is_object());
  CHECK(json::parse("\"\\u0000\"").get<std::string>() == std::string(1, '\0'));
}

TEST_CASE("strict_json: a key twice in one object is an error naming the key and where it is") {
  refused("{\"a\": 1,\n  \"a\": 2}", "duplicate key \"a\"", "line 2, column 3");
  refused(R"({"a": 1, "\u0061": 2})", "duplicate key \"a\"", "line 1, column 10");  // the same key escaped
  refused(R"({"x": {"a\"b": 1, "a\"b": 2}})", "duplicate key \"a\\\"b\"", "line 1, column 19");
  // The same key in different objects is fine.
  CHECK(json::parse(R"({"a": {"a": 1}, "b": [{"a": 1}, {"a": 2}]})").size() == 2);
}

TEST_CASE("strict_json: numbers beyond a double or 64 bits are errors, not infinity or a rounded value") {
  refused("[1e400]", "number overflow", "line 1, column 2");
  refused("{\"x\":\n -1e400}", "number overflow", "line 2");
  refused("[1, 18446744073709551616]", "integer 18446744073709551616 does not fit in 64 bits",
          "line 1, column 5");
  refused("-9223372036854775809", "does not fit in 64 bits", "line 1, column 1");
  refused("NaN", "invalid literal", "line 1, column 1");
  refused("[Infinity]", "invalid literal", "line 1, column 2");
  refused("[-Infinity]", "invalid", "line 1");
  // The 64-bit extremes are read exactly.
  CHECK(json::parse("18446744073709551615").get<std::uint64_t>() ==
        std::numeric_limits<std::uint64_t>::max());
  CHECK(json::integer(json::parse("-9223372036854775808")) == std::numeric_limits<std::int64_t>::min());
  CHECK(json::parse("1e-400").get<double>() == 0.0);  // underflow is zero, as in every JSON reader
}

TEST_CASE("strict_json: text that is not UTF-8, and lone surrogates, are errors") {
  refused("\"\xff\"", "ill-formed UTF-8", "line 1, column 2");
  refused("{\"k\": \"ok\",\n \"\xc0\xaf\": 1}", "ill-formed UTF-8", "line 2");  // overlong '/'
  refused("\"\xed\xa0\x80\"", "ill-formed UTF-8", "line 1");                    // a surrogate in UTF-8
  refused("\"\xf4\x90\x80\x80\"", "ill-formed UTF-8", "line 1");                // above U+10FFFF
  refused(R"(["\ud800"])", "surrogate U+D800..U+DBFF must be followed by U+DC00..U+DFFF", "line 1");
  refused(R"("\udc00")", "surrogate U+DC00..U+DFFF must follow U+D800..U+DBFF", "line 1");
  refused(R"("\ud83d\u0041")", "surrogate", "line 1");
  refused("\"a\tb\"", "control character U+0009", "line 1, column 3");
  // The lexer's "last read" quote in the message is escaped, so the message itself is UTF-8.
  try {
    json::parse("\"\xff\"");
  } catch (const json::error& e) {
    CHECK(std::string(e.what()).find("\\xFF") != std::string::npos);
  }
}

TEST_CASE("strict_json: text after the value, a byte order mark, comments are errors") {
  refused("{} x", "expected end of input", "line 1, column 4");
  refused("{}{}", "expected end of input", "line 1, column 3");
  refused("1 2", "expected end of input", "line 1, column 3");
  refused("\xEF\xBB\xBF{}", "byte order mark", "line 1, column 1");
  refused("// c\n{}", "invalid literal", "line 1, column 1");
  refused("{\"a\": 1 /* c */}", "invalid literal", "line 1");
  refused("", "unexpected end of input", "line 1, column 1");
  refused("[1, 2", "unexpected end of input", "line 1, column 6");
  refused("{\"a\": }", "unexpected '}'", "line 1, column 7");
  refused("[1,]", "unexpected ']'", "line 1, column 4");
  // json.cpp took these (strtod); nlohmann, like RFC 8259, does not.
  refused("01", "expected end of input", "line 1");
  refused("+1", "invalid literal", "line 1");
  refused("[1.]", "invalid number", "line 1");
}

TEST_CASE("strict_json: nesting deeper than 256 is an error") {
  const auto nested = [](std::size_t n) { return std::string(n, '[') + std::string(n, ']'); };
  CHECK(json::parse(nested(json::max_depth)).is_array());
  refused(nested(json::max_depth + 1), "nested more than 256 deep", "line 1, column 257");
  refused(std::string(100000, '['), "nested more than 256 deep", "line 1, column 257");
}

TEST_CASE("strict_json: integer() takes integral values only, within int64") {
  CHECK(json::integer(json::parse("7")) == 7);
  CHECK(json::integer(json::parse("2.0")) == 2);
  CHECK(json::integer(json::parse("1e3")) == 1000);
  CHECK(json::integer(json::parse("9223372036854775807")) == std::numeric_limits<std::int64_t>::max());
  CHECK_FALSE(json::integer(json::parse("9223372036854775808")));  // an unsigned 64-bit value above int64
  CHECK_FALSE(json::integer(json::parse("1.5")));
  CHECK_FALSE(json::integer(json::parse("1e300")));
  CHECK_FALSE(json::integer(json::parse("true")));
  CHECK_FALSE(json::integer(json::parse("\"1\"")));
  CHECK_FALSE(json::integer(json::parse("null")));
}

TEST_CASE("strict_json: dump writes keys in order, non-finite numbers as null, and refuses bad UTF-8") {
  const json::ordered v = {{"z", 1},
                           {"a", std::nan("")},
                           {"m", std::numeric_limits<double>::infinity()},
                           {"f", 10000.0},
                           {"s", "\"\\\n\x01\xc3\xa9"}};
  CHECK(json::dump(v) == R"({"z":1,"a":null,"m":null,"f":10000.0,"s":"\"\\\n\u0001é"})");
  CHECK(json::parse(json::dump(v))["s"] == "\"\\\n\x01\xc3\xa9");
  CHECK_THROWS_WITH_AS(json::dump(json::ordered{{"k", "\xff"}}), doctest::Contains("not valid UTF-8"),
                       json::error);
  CHECK_THROWS_AS(json::dump(json::ordered{{"\xff", 1}}), json::error);
}
