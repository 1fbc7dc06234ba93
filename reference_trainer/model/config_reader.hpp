// Reading config.json strictly: the reader every architecture's config keys go through
// (model/architecture.hpp's read_config). Each key is read once by name; whatever no
// one read is an error that names it (reject_unread), so a key the trainer does not
// understand never passes silently.
//
// Internal to model/ and models/.
#pragma once

#include "base/strict_json.hpp"
#include "model/config.hpp"

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <string_view>

namespace primecfg::train {

class ConfigReader {
 public:
  ConfigReader(const strict_json::value& root, std::string path) : root_(root), path_(std::move(path)) {}

  // model_config_error "<path>: "<key>": <what>".
  [[noreturn]] void fail(std::string_view key, const std::string& what) const;
  [[noreturn]] void fail_value(std::string_view key, const strict_json::value& v,
                               const std::string& what) const;

  // The value of a key, or nullptr when absent or null; marks the key as read.
  const strict_json::value* get(std::string_view key);
  bool has(std::string_view key) const { return strict_json::find(root_, key) != nullptr; }

  // Typed reads; absent or null gives the fallback (or, without one, an error).
  std::int64_t size(std::string_view key, std::optional<std::int64_t> fallback = std::nullopt);
  double positive(std::string_view key, double fallback);
  bool boolean(std::string_view key, bool fallback);
  std::string string(std::string_view key, std::string fallback);
  std::string raw(std::string_view key);  // JSON text, "null" when absent

  // Every key not read yet is an error, unless it is metadata (names, dtype, versions).
  void reject_unread() const;

  const std::string& path() const { return path_; }

 private:
  const strict_json::value& root_;
  std::string path_;
  std::set<std::string, std::less<>> seen_;
};

// rope_theta, partial_rotary_factor and rope_scaling (transformers 4.x) or
// rope_parameters (5.x), into a.rope_theta and a.rope_scaling; reads
// a.max_positions, so read that first.
void read_rope(ConfigReader& r, ModelArgs& a);
// a.rope_scaling as config.json's rope_scaling (null without one).
strict_json::ordered rope_scaling_json(const ModelArgs& a);

}  // namespace primecfg::train
