// A small config that uses every supported field type, for the library tests.
#pragma once

#include <primecfg/describe.hpp>
#include <primecfg/validate.hpp>

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace sample {

enum class Color { red, green, blue };

struct Inner {
  std::int64_t x = 1;
  std::optional<double> y = std::nullopt;

  static constexpr auto fields() {
    return primecfg::describe(primecfg::field(&Inner::x, "An integer.", primecfg::ge(1)),
                              primecfg::field(&Inner::y, "An optional float.", primecfg::lt(10)));
  }
};

struct First {
  static constexpr std::string_view type = "first";
  std::int64_t a = 1;
  static constexpr auto fields() { return primecfg::describe(primecfg::field(&First::a, "Only in first.")); }
};

struct Second {
  static constexpr std::string_view type = "second";
  std::string b = "bee";
  bool shared = false;
  static constexpr auto fields() {
    return primecfg::describe(primecfg::field(&Second::b, "Only in second."),
                              primecfg::field(&Second::shared, "A flag."));
  }
};

struct Sample {
  bool flag = false;
  std::int32_t small = 3;
  std::uint8_t tiny = 1;
  double rate = 0.5;
  std::string name = "n";
  std::filesystem::path dir = "out";
  Color color = Color::red;
  std::optional<std::int64_t> limit = std::nullopt;
  std::vector<std::int64_t> sizes = std::vector<std::int64_t>(2, 7);
  std::map<std::string, std::string> env = {};
  Inner inner = {};
  std::optional<Inner> maybe = std::nullopt;
  std::variant<First, Second> choice = First{};
  std::string token = "";

  static constexpr auto fields() {
    using S = Sample;
    using namespace primecfg;
    return describe(field(&S::flag, "A boolean."), field(&S::small, "A bounded int32.", ge(0)),
                    field(&S::tiny, "A uint8."), field(&S::rate, "A ratio.", gt(0), le(1)),
                    field(&S::name, "A string."), field(&S::dir, "A path."), field(&S::color, "An enum."),
                    field(&S::limit, "An optional integer.", ge(0)), field(&S::sizes, "A list.", ge(1)),
                    field(&S::env, "A map."), field(&S::inner, "A nested struct."),
                    field(&S::maybe, "An optional struct."), field(&S::choice, "A tagged union."),
                    field(&S::token, "A required string.", required), retired("old_flag", "flag"));
  }

  // Two rules: one that only reports, one that changes a default.
  void validate(primecfg::validation& v) {
    if (color == Color::blue && flag) v.error(color, "blue cannot be combined with flag = true");
    if (name == "strict") v.require_value(small, 0, "name = \"strict\" needs small = 0");
  }
};

}  // namespace sample
