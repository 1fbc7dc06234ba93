// Deep merge of TOML tables, for opaque sections that several files extend.
#pragma once

#include <primecfg/detail/toml.hpp>

namespace primecfg::detail {

// Tables merge key by key; anything else in `top` replaces what `base` had.
inline void merge_tables(toml::table& base, const toml::table& top) {
  for (auto&& [key, value] : top) {
    toml::node* existing = base.get(key.str());
    if (existing && existing->is_table() && value.is_table()) {
      merge_tables(*existing->as_table(), *value.as_table());
    } else {
      base.insert_or_assign(key, value);
    }
  }
}

}  // namespace primecfg::detail
