// primecfg::int_or<E>: a field that holds an integer or one of the keywords
// of the enum E (prime-rl's `int | Literal["auto"]`). In TOML and on the
// command line it is an integer (`ep = 8`) or the keyword's name
// (`ep = "auto"`); bounds in fields() apply to the integer.
//
//   enum class EpKeyword { auto_ };
//   primecfg::int_or<EpKeyword> ep = EpKeyword::auto_;
//   if (cfg.model.ep.is(EpKeyword::auto_)) ... else use(cfg.model.ep.number());
#pragma once

#include <primecfg/detail/cxx_version.hpp>  // first: C++20 or later

#include <cstdint>
#include <type_traits>
#include <variant>

namespace primecfg {

template <class E>
struct int_or {
  static_assert(std::is_enum_v<E>, "primecfg::int_or takes an enum of keywords");
  using keyword_type = E;
  using number_type = std::int64_t;

  std::variant<std::int64_t, E> value;

  constexpr int_or(std::int64_t number = 0) : value(number) {}
  constexpr int_or(E keyword) : value(keyword) {}

  constexpr bool is_number() const { return value.index() == 0; }
  constexpr bool is(E keyword) const { return value.index() == 1 && std::get<1>(value) == keyword; }
  // The integer; only when is_number().
  constexpr std::int64_t number() const { return std::get<0>(value); }
  // The keyword; only when !is_number().
  constexpr E keyword() const { return std::get<1>(value); }

  friend constexpr bool operator==(const int_or&, const int_or&) = default;
};

}  // namespace primecfg
