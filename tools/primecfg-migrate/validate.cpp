// Validating a migrated text with the primecfg library, as the config type
// the file is for. Kept in its own translation unit: the config tree is the
// heaviest thing the tool compiles.
#include "migrate.hpp"

#include <primecfg/load.hpp>
#include <primecfg/report.hpp>
#include <primecfg/rl.hpp>
#include <primecfg/sft.hpp>
#include <primecfg/trainer.hpp>

namespace primecfg::migrate {

namespace {

template <class T>
check_result load_as(std::string_view name, const std::string& text, std::string_view root_name) {
  primecfg::sources src;
  src.add_text(std::string(name), text);
  primecfg::loaded<T> r = primecfg::load<T>(src);
  check_result v;
  v.ok = r.ok();
  v.errors = r.error_count();
  if (!v.ok) v.report = primecfg::format_text(r.diagnostics, root_name);
  return v;
}

}  // namespace

check_result validate(std::string_view name, const std::string& text, root_type root) {
  switch (root) {
    case root_type::sft:
      return load_as<primecfg::SFTConfig>(name, text, "SFTConfig");
    case root_type::trainer:
      return load_as<primecfg::TrainerConfig>(name, text, "TrainerConfig");
    case root_type::rl:
      return load_as<primecfg::RLConfig>(name, text, "RLConfig");
  }
  return {};
}

std::uintmax_t loader_max_bytes() { return primecfg::max_config_bytes; }

}  // namespace primecfg::migrate
