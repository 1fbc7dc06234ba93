// JSON Schema (draft-07) of a config struct, generated from the same
// reflection, descriptions and bounds the loader uses, so editors (Taplo /
// Even Better TOML via `#:schema`) and check-jsonschema agree with primecfg.
//
// A struct can add what its validate() checks and JSON Schema can say with
//   static void extend_schema(toml::table& schema);
//
// The definitions are in detail/schema.inl.
#pragma once

#include <primecfg/detail/cxx_version.hpp>  // first: C++20 or later

#include <primecfg/describe.hpp>
#include <primecfg/detail/enum_names.hpp>
#include <primecfg/detail/field_names.hpp>
#include <primecfg/detail/fields.hpp>
#include <primecfg/detail/type_name.hpp>
#include <primecfg/detail/type_traits.hpp>
#include <primecfg/dump.hpp>
#include <primecfg/opaque.hpp>

#include <primecfg/detail/toml.hpp>

#include <sstream>
#include <string>

namespace primecfg {

// The JSON Schema of T as a table, for a program that adds to it.
template <class T>
toml::table json_schema_table();

// The JSON Schema text of T (stable: keys sorted, two-space indent).
template <class T>
std::string json_schema();

}  // namespace primecfg

#include <primecfg/detail/schema.inl>
