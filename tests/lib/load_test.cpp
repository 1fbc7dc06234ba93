// Loading: every field type, every error kind, layering, command-line forms
// and provenance, on the small Sample config.
#include "sample_config.hpp"
#include "test_helpers.hpp"

#include <primecfg/cli.hpp>
#include <primecfg/help.hpp>
#include <primecfg/load.hpp>
#include <primecfg/report.hpp>

#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>

#include <unistd.h>

using primecfg::error_kind;
using sample::Sample;
using testing::at;
using testing::error_at;
using testing::load_text;

namespace {

const std::string required_token = "token = \"t\"\n";

// One folder of this process's files, removed when the tests end.
struct TempFolder {
  std::filesystem::path path =
      std::filesystem::temp_directory_path() / ("primecfg-load-test-" + std::to_string(::getpid()));
  TempFolder() { std::filesystem::create_directories(path); }
  ~TempFolder() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

std::filesystem::path write_temp(const std::string& name, const std::string& text) {
  static const TempFolder dir;
  auto path = dir.path / name;
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

// A rule that names a copy of a field instead of the field.
struct CopyingRule {
  std::int64_t steps = 5;
  void validate(primecfg::validation& v) {
    std::int64_t copy = steps;
    if (copy > 1) v.error(copy, "too many steps");
  }
};

}  // namespace

// docs/library.md used to say g++ 12 crashes on this; it does not. (Outside the
// anonymous namespace: a described struct there does not link at -O0, as the
// never-defined object its field names are read from gets internal linkage.)
namespace braced {
struct BracedDefaults {
  std::int64_t rank = 16;
  std::vector<std::string> targets = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj"};
  std::vector<std::string> saved = {};
  static constexpr auto fields() {
    using S = BracedDefaults;
    return primecfg::describe(primecfg::field(&S::rank, "Rank."), primecfg::field(&S::targets, "Targets."),
                              primecfg::field(&S::saved, "Saved."));
  }
};
}  // namespace braced

TEST_CASE("a braced std::vector<std::string> default compiles and loads") {
  auto r = load_text<braced::BracedDefaults>("saved = [\"x\"]\n");
  REQUIRE(r.ok());
  CHECK(r.value.targets.size() == 6);
  CHECK(r.value.targets[5] == "up_proj");
  CHECK(r.value.saved == std::vector<std::string>{"x"});
}

TEST_CASE("no source at all: defaults, and the required field is missing") {
  primecfg::loaded<Sample> r = primecfg::load<Sample>({});
  CHECK(r.value.small == 3);
  CHECK(r.value.color == sample::Color::red);
  CHECK(r.error_count() == 1);
  CHECK(error_at(r, "token").kind == error_kind::missing);
}

TEST_CASE("every field type decodes") {
  auto r = load_text<Sample>(R"(
flag = true
small = -0
tiny = 255
rate = 1
name = "hello"
dir = "/tmp/x"
color = "green"
limit = 12
sizes = [1, 2, 3]
token = "t"
[env]
A = "1"
[inner]
y = 2.5
[choice]
type = "second"
b = "x"
)");
  INFO(primecfg::format_text(r.diagnostics, "Sample"));
  CHECK(r.ok());
  CHECK(r.value.flag);
  CHECK(r.value.tiny == 255);
  CHECK(r.value.rate == 1.0);  // an integer is a valid float
  CHECK(r.value.dir == std::filesystem::path("/tmp/x"));
  CHECK(r.value.color == sample::Color::green);
  CHECK(r.value.limit == 12);
  CHECK(r.value.sizes == std::vector<std::int64_t>{1, 2, 3});
  CHECK(r.value.env.at("A") == "1");
  CHECK(r.value.inner.x == 1);  // untouched: tables merge into defaults
  CHECK(r.value.inner.y == 2.5);
  REQUIRE(std::holds_alternative<sample::Second>(r.value.choice));
  CHECK(std::get<sample::Second>(r.value.choice).b == "x");
}

TEST_CASE("type errors say what was expected and what was found, with line and column") {
  auto r = load_text<Sample>(required_token + R"(flag = "yes"
small = 1.5
rate = "fast"
name = 3
sizes = 4
inner = 5
)");
  CHECK(r.error_count() == 6);
  auto flag = error_at(r, "flag");
  CHECK(flag.kind == error_kind::bool_type);
  CHECK(at(flag) == "test.toml:2:8");
  CHECK(flag.message == "expected true or false, got a string");
  CHECK(flag.input == "\"yes\"");
  CHECK(error_at(r, "small").kind == error_kind::int_type);
  CHECK(error_at(r, "rate").kind == error_kind::float_type);
  CHECK(error_at(r, "name").kind == error_kind::string_type);
  CHECK(error_at(r, "sizes").kind == error_kind::array_type);
  CHECK(error_at(r, "inner").kind == error_kind::table_type);
}

TEST_CASE("integers are range-checked against the field's type, never narrowed") {
  auto r = load_text<Sample>(required_token + "tiny = 256\nsmall = 3000000000\n");
  CHECK(error_at(r, "tiny").kind == error_kind::int_overflow);
  CHECK(error_at(r, "tiny").message == "integer out of range: this field holds 0 to 255");
  CHECK(error_at(r, "small").kind == error_kind::int_overflow);
  auto negative = load_text<Sample>(required_token + "tiny = -1\n");
  CHECK(error_at(negative, "tiny").kind == error_kind::int_overflow);
  CHECK(negative.value.tiny == 1);  // the bad value was not stored
}

TEST_CASE("floats must be finite") {
  auto r = load_text<Sample>(required_token + "rate = inf\n[inner]\ny = nan\n");
  CHECK(error_at(r, "rate").kind == error_kind::finite_number);
  CHECK(error_at(r, "inner.y").kind == error_kind::finite_number);
}

TEST_CASE("declared bounds are checked, for plain, optional and list values") {
  auto r = load_text<Sample>(required_token +
                             "small = -1\nrate = 0\nlimit = -5\nsizes = [1, 0]\n[inner]\nx = 0\ny = 10\n");
  CHECK(error_at(r, "small").kind == error_kind::greater_than_equal);
  CHECK(error_at(r, "small").message == "must be greater than or equal to 0");
  CHECK(error_at(r, "rate").kind == error_kind::greater_than);
  CHECK(error_at(r, "limit").kind == error_kind::greater_than_equal);
  CHECK(error_at(r, "sizes[1]").kind == error_kind::greater_than_equal);
  CHECK(error_at(r, "inner.x").kind == error_kind::greater_than_equal);
  CHECK(error_at(r, "inner.y").kind == error_kind::less_than);
  auto high = load_text<Sample>(required_token + "rate = 1.5\n");
  CHECK(error_at(high, "rate").kind == error_kind::less_than_equal);
}

// A bound broken by one element of a list names that element and points at
// it, as a type error in a list does (issue 26).
TEST_CASE("a bound broken inside a list names the element, at the element") {
  auto r = load_text<Sample>(required_token + "sizes = [32, 0, 99999, -1]\n");
  REQUIRE(r.error_count() == 2);
  auto zero = error_at(r, "sizes[1]");
  CHECK(zero.kind == error_kind::greater_than_equal);
  CHECK(at(zero) == "test.toml:2:14");
  CHECK(zero.input == "0");
  CHECK(at(error_at(r, "sizes[3]")) == "test.toml:2:24");
  auto cli = load_text<Sample>(required_token, {"--sizes=[3, 0]"});
  auto flag = error_at(cli, "sizes[1]");
  CHECK(at(flag) == "command line --sizes");
  CHECK(flag.input == "0");
}

TEST_CASE("enum values are checked and the allowed ones listed") {
  auto r = load_text<Sample>(required_token + "color = \"gren\"\n");
  auto e = error_at(r, "color");
  CHECK(e.kind == error_kind::literal_error);
  CHECK(e.message == "expected one of 'red', 'green', 'blue'; did you mean 'green'?");
  CHECK(at(e) == "test.toml:2:9");
}

TEST_CASE("\"None\" clears an optional; an empty table turns an optional section on") {
  auto r = load_text<Sample>(required_token + "limit = \"None\"\n[maybe]\n");
  CHECK(r.ok());
  CHECK_FALSE(r.value.limit.has_value());
  REQUIRE(r.value.maybe.has_value());
  CHECK(r.value.maybe->x == 1);
  primecfg::sources src;
  src.add_text("a.toml", required_token + "limit = 3\n[maybe]\nx = 4\n")
      .add_text("b.toml", "limit = \"None\"\nmaybe = \"None\"\n");
  auto layered = primecfg::load<Sample>(src);
  CHECK(layered.ok());
  CHECK_FALSE(layered.value.limit);
  CHECK_FALSE(layered.value.maybe);
}

TEST_CASE("unknown keys are rejected, with a suggestion when one is close") {
  auto r = load_text<Sample>(required_token + "nmae = \"x\"\nzzz = 1\n[inner]\nxx = 2\n");
  CHECK(testing::of_kind(r, error_kind::extra_forbidden).size() == 3);
  auto near = error_at(r, "nmae");
  CHECK(near.message == "unknown key 'nmae' at the top level; did you mean 'name'?");
  CHECK(at(near) == "test.toml:2:1");
  CHECK(error_at(r, "zzz").message == "unknown key 'zzz' at the top level");
  CHECK(error_at(r, "inner.xx").message == "unknown key 'xx' in [inner]; did you mean 'x'?");
}

TEST_CASE("a retired key names its replacement and the migration command") {
  auto r = load_text<Sample>(required_token + "old_flag = true\n");
  auto e = error_at(r, "old_flag");
  CHECK(e.kind == error_kind::extra_forbidden);
  CHECK(e.message == "'old_flag' was replaced by 'flag'; run `primecfg-migrate test.toml`");
}

TEST_CASE("tagged unions: default alternative, switching, bad tags, foreign keys") {
  auto absent = load_text<Sample>(required_token + "[choice]\na = 5\n");
  CHECK(absent.ok());
  CHECK(std::get<sample::First>(absent.value.choice).a == 5);

  auto bad = load_text<Sample>(required_token + "[choice]\ntype = \"secnd\"\nb = 1\n");
  auto e = error_at(bad, "choice.type");
  CHECK(e.kind == error_kind::union_tag_invalid);
  CHECK(e.message == "'type' must be one of 'first', 'second'; did you mean 'second'?");
  CHECK(bad.error_count() == 1);  // keys of an unknown alternative are not judged

  auto foreign = load_text<Sample>(required_token + "[choice]\ntype = \"first\"\nb = \"x\"\n");
  CHECK(error_at(foreign, "choice.b").kind == error_kind::extra_forbidden);
  // ... and the message says which alternative has the key (issue 26)
  CHECK(error_at(foreign, "choice.b").message ==
        "'b' belongs to choice.type = \"second\", not choice.type = \"first\" (set at test.toml:3:8); set "
        "choice.type = \"second\" or remove 'b'");
  CHECK(at(error_at(foreign, "choice.b")) == "test.toml:4:1");
  auto by_default = load_text<Sample>(required_token, {"--choice.b=x"});
  CHECK(error_at(by_default, "choice.b").message ==
        "'b' belongs to choice.type = \"second\", not choice.type = \"first\" (its default); set "
        "choice.type = \"second\" or remove 'b'");
  auto unknown = load_text<Sample>(required_token + "[choice]\nzz = 1\n");
  CHECK(error_at(unknown, "choice.zz").message.rfind("unknown key 'zz' in [choice]", 0) == 0);

  // A later file without `type` keeps the alternative an earlier file chose.
  primecfg::sources src;
  src.add_text("a.toml", required_token + "[choice]\ntype = \"second\"\n")
      .add_text("b.toml", "[choice]\nb = \"z\"\n");
  auto layered = primecfg::load<Sample>(src);
  CHECK(layered.ok());
  CHECK(std::get<sample::Second>(layered.value.choice).b == "z");
}

TEST_CASE("layering: tables deep-merge, scalars and arrays replace, provenance follows") {
  primecfg::sources src;
  src.add_text(
         "base.toml",
         required_token + "name = \"base\"\nsizes = [1, 2]\n[inner]\nx = 2\ny = 1.0\n[env]\nA = \"a\"\n")
      .add_text("top.toml", "sizes = [9]\n[inner]\ny = 3.0\n[env]\nB = \"b\"\n");
  auto r = primecfg::load<Sample>(src);
  REQUIRE(r.ok());
  CHECK(r.value.name == "base");
  CHECK(r.value.sizes == std::vector<std::int64_t>{9});
  CHECK(r.value.inner.x == 2);
  CHECK(r.value.inner.y == 3.0);
  CHECK(r.value.env.size() == 2);
  CHECK(r.source_of("name").to_string() == "base.toml:2:8");
  CHECK(r.source_of("inner.y").to_string() == "top.toml:3:5");
  CHECK(r.source_of("inner.x").to_string() == "base.toml:5:5");
  CHECK(r.source_of("color").is_default());
}

TEST_CASE("files are read from disk in order; a missing file or a directory is a file error") {
  auto a = write_temp("a.toml", required_token + "small = 1\n");
  auto b = write_temp("b.toml", "small = 2\n");
  std::vector<std::string> args = {"@", a.string(), "@" + b.string()};
  auto r = primecfg::load_command_line<Sample>(args);
  CHECK(r.ok());
  CHECK(r.value.small == 2);
  CHECK(r.source_of("small").file == b.string());

  std::vector<std::string> missing = {"@", "/nonexistent/c.toml", "@", a.parent_path().string()};
  auto m = primecfg::load_command_line<Sample>(missing);
  CHECK(testing::of_kind(m, error_kind::file_error).size() == 2);
  CHECK(m.diagnostics[0].message.find("cannot open") == 0);
  CHECK(m.diagnostics[1].message == "is a directory, not a config file");
}

TEST_CASE("TOML syntax errors carry the parser's position, and other files are still read") {
  primecfg::sources src;
  src.add_text("broken.toml", "name = \"x\"\nsmall = = 3\n")
      .add_text("fine.toml", required_token + "zzz = 1\n");
  auto r = primecfg::load<Sample>(src);
  REQUIRE(r.error_count() == 2);
  CHECK(r.diagnostics[0].kind == error_kind::toml_syntax);
  CHECK(r.diagnostics[0].where.to_string() == "broken.toml:2:9");
  CHECK(r.diagnostics[1].kind == error_kind::extra_forbidden);
}

TEST_CASE("duplicate keys and tables are syntax errors") {
  CHECK(
      testing::of_kind(load_text<Sample>(required_token + "small = 1\nsmall = 2\n"), error_kind::toml_syntax)
          .size() == 1);
  CHECK(testing::of_kind(load_text<Sample>(required_token + "[inner]\nx = 1\n[inner]\nx = 2\n"),
                         error_kind::toml_syntax)
            .size() == 1);
}

// toml++ 3.3 garbles a quoted duplicate key ('"naname" ', marzer/tomlplusplus#300)
// and points at the value: the report names the key as written, at the key.
TEST_CASE("a duplicate key is named as written, at its line and column") {
  struct duplicate {
    std::string text, where, message;
  };
  for (const duplicate& c : std::vector<duplicate>{
           {"name = \"a\"\n\"name\" = \"b\"\n", "test.toml:3:1",
            "cannot redefine existing string '\"name\"'"},
           {"[inner]\nx = 1\n  'x' = 2\n", "test.toml:4:3", "cannot redefine existing integer ''x''"},
           {"small = 1\nsmall = 2\n", "test.toml:3:1", "cannot redefine existing integer 'small'"},
           {"env = {A = \"1\", \"A\" = \"2\"}\n", "test.toml:2:17",
            "cannot redefine existing string '\"A\"'"},
           {"[inner]\n[\"inner\"]\n", "test.toml:3:1", "cannot redefine existing table '\"inner\"'"},
       }) {
    CAPTURE(c.text);
    auto errors = testing::of_kind(load_text<Sample>(required_token + c.text), error_kind::toml_syntax);
    REQUIRE(errors.size() == 1);
    CHECK(at(errors[0]) == c.where);
    CHECK(errors[0].message.find(c.message) != std::string::npos);
  }
}

TEST_CASE("command line: an array in a form that does not work names the one that does") {
  auto r = load_text<Sample>(required_token, {"--sizes", "64,128"});
  auto e = error_at(r, "sizes");
  CHECK(e.kind == error_kind::array_type);
  CHECK(e.message.find("on the command line an array is TOML: --sizes='[64, 128]'") != std::string::npos);
  auto one = load_text<Sample>(required_token, {"--sizes=64"});
  CHECK(error_at(one, "sizes").message.find("--sizes='[64]'") != std::string::npos);
}

// A program built on the library can offer --help (issue 26).
TEST_CASE("command line: --help and -h ask for help; the help text lists the bounds") {
  for (const char* flag : {"--help", "-h"}) {
    CAPTURE(flag);
    auto r = load_text<Sample>(required_token, {"--small=1", flag});
    CHECK(r.help_requested);
    // also an error, so a program that does not look never runs as if it were not there
    REQUIRE(r.error_count() == 1);
    CHECK(at(r.diagnostics[0]) == std::string("command line ") + flag);
    CHECK(r.diagnostics[0].message.find("asks for help") != std::string::npos);
  }
  auto plain = load_text<Sample>(required_token, {"--small=1"});
  CHECK_FALSE(plain.help_requested);
  CHECK(plain.ok());
  std::string help = primecfg::help_text<Sample>();
  CHECK(help.find("  --small INT (>= 0)\n      A bounded int32. (default: 3)\n") != std::string::npos);
  CHECK(help.find("  --rate FLOAT (> 0, <= 1)\n") != std::string::npos);
  CHECK(help.find("  --tiny INT\n") != std::string::npos);
}

TEST_CASE("command line: every spelling of an override") {
  std::vector<std::string> args = {
      "--small=5",      "--name",        "from-cli",      "--flag", "--inner.y",      "2", "--limit", "None",
      "--sizes=[3, 4]", "--env.KEY-1=v", "--choice.type", "second", "--choice.shared"};
  auto r = load_text<Sample>(required_token + "small = 1\nlimit = 3\n", args);
  INFO(primecfg::format_text(r.diagnostics, "Sample"));
  REQUIRE(r.ok());
  CHECK(r.value.small == 5);
  CHECK(r.value.name == "from-cli");
  CHECK(r.value.flag);
  CHECK(r.value.inner.y == 2.0);
  CHECK_FALSE(r.value.limit);
  CHECK(r.value.sizes == std::vector<std::int64_t>{3, 4});
  CHECK(r.value.env.at("KEY-1") == "v");  // map keys are taken verbatim
  CHECK(std::get<sample::Second>(r.value.choice).shared);
  CHECK(r.source_of("small").to_string() == "command line --small");
}

TEST_CASE("command line: kebab case, --no-, optional sections and overrides beat files") {
  auto file = write_temp("cli.toml", required_token + "flag = true\nsmall = 9\n");
  std::vector<std::string> args = {"--small", "4", "--no-flag", "@", file.string(), "--maybe", "--maybe.x=3"};
  auto r = primecfg::load_command_line<Sample>(args);
  REQUIRE(r.ok());
  CHECK(r.value.small == 4);  // the override wins although the file comes later on the line
  CHECK_FALSE(r.value.flag);
  REQUIRE(r.value.maybe);
  CHECK(r.value.maybe->x == 3);
  auto off = primecfg::load_command_line<Sample>(
      std::vector<std::string>{"@" + file.string(), "--maybe", "--no-maybe"});
  CHECK_FALSE(off.value.maybe);
}

TEST_CASE("command line: bad flags are errors with a suggestion") {
  std::vector<std::string> args = {"--nmae=x", "--inner", "--small", "--inner.x=abc", "stray", "--limit=-2"};
  auto r = load_text<Sample>(required_token, args);
  INFO(primecfg::format_text(r.diagnostics, "Sample"));
  CHECK(r.error_count() == 6);
  CHECK(r.diagnostics[0].message == "'--nmae' names no config field; did you mean '--name'?");
  CHECK(r.diagnostics[0].where.to_string() == "command line --nmae");
  CHECK(r.diagnostics[1].message.find("is a section") != std::string::npos);
  CHECK(r.diagnostics[2].message == "'--small' needs a value");
  bool saw_type_error = false, saw_bound = false;
  for (const auto& d : r.diagnostics) {
    saw_type_error = saw_type_error || (d.kind == error_kind::int_type && d.input == "abc");
    saw_bound = saw_bound || (d.kind == error_kind::greater_than_equal && d.path == "limit");
  }
  CHECK(saw_type_error);
  CHECK(saw_bound);
}

TEST_CASE("rules: errors point at the value's source; defaults may change with a note, user values may not") {
  auto blue = load_text<Sample>(required_token + "color = \"blue\"\nflag = true\n");
  auto e = error_at(blue, "color");
  CHECK(e.kind == error_kind::value_error);
  CHECK(at(e) == "test.toml:2:9");

  auto by_default = load_text<Sample>(required_token + "name = \"strict\"\n");
  CHECK(by_default.ok());
  CHECK(by_default.value.small == 0);
  REQUIRE(by_default.diagnostics.size() == 1);
  CHECK(by_default.diagnostics[0].level == primecfg::severity::note);
  CHECK(by_default.diagnostics[0].path == "small");

  auto explicit_value = load_text<Sample>(required_token + "name = \"strict\"\nsmall = 2\n");
  CHECK(error_at(explicit_value, "small").message == "name = \"strict\" needs small = 0");
  CHECK(explicit_value.value.small == 2);
}

TEST_CASE("reports: compiler-style text with a summary, and JSON for tools") {
  auto r = load_text<Sample>(required_token + "nmae = 1\ncolor = \"x\"\n");
  std::string text = primecfg::format_text(r.diagnostics, "Sample");
  CHECK(text.find("test.toml:2:1: error: nmae: unknown key 'nmae' at the top level; did you mean 'name'? "
                  "[extra_forbidden]\n") == 0);
  CHECK(text.find("2 errors in Sample\n") != std::string::npos);
  std::string json = primecfg::format_json(r.diagnostics);
  CHECK(json.find("\"kind\" : \"literal_error\"") != std::string::npos);
  CHECK(json.find("\"line\" : 3") != std::string::npos);
  CHECK(json.find("\"file\" : \"test.toml\"") != std::string::npos);
  CHECK(json.front() == '[');
}

// v.error(local_var, ...) used to print "<unknown field>" and nothing else
// (issue 26); a temporary does not compile (compile_fail_test.sh).
TEST_CASE("a rule that names a value that is not a field is an error naming the rule") {
  auto r = load_text<CopyingRule>("");
  INFO(primecfg::format_text(r.diagnostics, "CopyingRule"));
  REQUIRE(r.error_count() == 2);
  auto says = [&](const std::string& text) {
    return std::any_of(r.diagnostics.begin(), r.diagnostics.end(), [&](const primecfg::diagnostic& d) {
      return d.message.find(text) != std::string::npos;
    });
  };
  CHECK(says("too many steps"));
  CHECK(says("names a value that is not a field of this config"));
  CHECK(says("load_test.cpp:"));
  CHECK(says("CopyingRule::validate"));
}
