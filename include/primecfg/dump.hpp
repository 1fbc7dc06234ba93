// Writing a resolved config back out: TOML with each value's provenance as a
// comment (re-reading it gives the same config), or JSON for tools.
//
// The definitions are in detail/dump.inl.
#pragma once

#include <primecfg/detail/cxx_version.hpp>  // first: C++20 or later

#include <primecfg/describe.hpp>
#include <primecfg/detail/field_names.hpp>
#include <primecfg/detail/fields.hpp>
#include <primecfg/detail/type_name.hpp>
#include <primecfg/detail/type_traits.hpp>
#include <primecfg/detail/value_text.hpp>
#include <primecfg/opaque.hpp>
#include <primecfg/validate.hpp>

#include <fmt/format.h>
#include <primecfg/detail/toml.hpp>

#include <sstream>
#include <string>
#include <variant>

namespace primecfg {

// TOML text of the resolved config; every value carries a comment saying
// where it came from ("# a.toml:3:11", "# command line --x"); defaults are
// listed commented out.
template <class T>
std::string dump_toml(const T& value, const provenance_map& sources = {});

// The resolved config as a TOML table (empty optionals as "None").
template <class T>
toml::table to_toml_table(const T& value);

// The resolved config as JSON text (empty optionals as "None").
template <class T>
std::string dump_json(const T& value);

}  // namespace primecfg

#include <primecfg/detail/dump.inl>
