// [ckpt] and [resume]: writing and reading training checkpoints.
#pragma once

#include <primecfg/describe.hpp>

#include <cstdint>
#include <filesystem>
#include <optional>

namespace primecfg {

struct CheckpointConfig {
  std::optional<std::int64_t> interval = std::nullopt;
  std::optional<std::filesystem::path> output_dir = std::nullopt;
  std::optional<std::int64_t> keep_last = std::nullopt;
  bool skip_optimizer = false;
  bool skip_scheduler = false;
  bool skip_gather_master_weights = false;

  static constexpr auto fields() {
    using S = CheckpointConfig;
    return describe(field(&S::interval, "Save every interval steps; \"None\" saves only at the end.", ge(1)),
                    field(&S::output_dir, "Checkpoint folder; \"None\" means <output_dir>/checkpoints."),
                    field(&S::keep_last, "Keep only the newest keep_last checkpoints.", ge(1)),
                    field(&S::skip_optimizer, "Do not save or load optimizer state (weights only)."),
                    field(&S::skip_scheduler, "Do not save or load the scheduler position."),
                    field(&S::skip_gather_master_weights, "Save sharded masters without gathering them."));
  }
};

struct ResumeConfig {
  std::optional<std::int64_t> step = std::nullopt;

  static constexpr auto fields() {
    return describe(
        field(&ResumeConfig::step, "Step to resume from; \"None\" takes the newest checkpoint.", ge(0)));
  }
};

}  // namespace primecfg
