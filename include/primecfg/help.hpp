// `--help` text generated from the config's fields and descriptions.
//
// The definitions are in detail/help.inl.
#pragma once

#include <primecfg/detail/cxx_version.hpp>  // first: C++20 or later

#include <primecfg/describe.hpp>
#include <primecfg/detail/enum_names.hpp>
#include <primecfg/detail/field_names.hpp>
#include <primecfg/detail/fields.hpp>
#include <primecfg/detail/type_traits.hpp>
#include <primecfg/detail/value_text.hpp>
#include <primecfg/dump.hpp>
#include <primecfg/opaque.hpp>

#include <fmt/format.h>

#include <string>
#include <variant>

namespace primecfg {

// The Markdown reference of every field of T (docs/config-reference.md).
template <class T>
std::string markdown_reference();

// One entry per settable field: flag, accepted values, description, default.
template <class T>
std::string help_text();

}  // namespace primecfg

#include <primecfg/detail/help.inl>
