// [ckpt] and [resume]: writing and reading training checkpoints.
#pragma once

#include <primecfg/detail/cxx_version.hpp>  // first: C++20 or later

#include <primecfg/describe.hpp>
#include <primecfg/validate.hpp>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>

namespace primecfg {

struct CheckpointConfig {
  std::optional<std::int64_t> interval = std::nullopt;
  std::optional<std::filesystem::path> output_dir = std::nullopt;
  std::optional<std::int64_t> keep_last = std::nullopt;
  std::optional<std::int64_t> keep_interval = std::nullopt;
  bool skip_progress = false;
  bool skip_dataloader = false;
  bool skip_optimizer = false;
  bool skip_scheduler = false;
  bool skip_gather_master_weights = false;

  static constexpr auto fields() {
    using S = CheckpointConfig;
    return describe(
        field(&S::interval, "Save every interval steps; \"None\" saves only at the end.", ge(1)),
        field(&S::output_dir, "Checkpoint folder; \"None\" means <output_dir>/checkpoints."),
        field(&S::keep_last, "Keep only the newest keep_last checkpoints.", ge(1)),
        field(&S::keep_interval, "Keep every keep_interval-th step's checkpoint for good.", ge(1)),
        field(&S::skip_progress, "Do not load the progress (step counters) from a checkpoint."),
        field(&S::skip_dataloader, "Do not load the data loader position from a checkpoint."),
        field(&S::skip_optimizer, "Do not save or load optimizer state (weights only)."),
        field(&S::skip_scheduler, "Do not save or load the scheduler position."),
        field(&S::skip_gather_master_weights, "Save sharded masters without gathering them."));
  }
};

struct ResumeConfig {
  std::optional<std::int64_t> step = std::nullopt;
  std::optional<std::filesystem::path> dir = std::nullopt;

  static constexpr auto fields() {
    return describe(
        field(&ResumeConfig::step, "Step to resume from; \"None\" takes the newest checkpoint.", ge(1)),
        field(&ResumeConfig::dir,
              "Another run's checkpoint folder .../step_<N> to start from (not with step)."));
  }

  // prime-rl's validate_step_xor_dir.
  void validate(validation& v) {
    if (step && dir)
      v.error(dir, "resume.step and resume.dir exclude each other (the step is in dir's name)");
    if (dir) {
      std::string name = dir->filename().string();
      bool digits = name.size() > 5 && name.compare(0, 5, "step_") == 0 &&
                    std::all_of(name.begin() + 5, name.end(), [](char ch) { return ch >= '0' && ch <= '9'; });
      if (!digits) v.error(*dir, "must name a checkpoint step folder (.../step_<N>)");
    }
  }
};

}  // namespace primecfg
