// [data]: what the trainer reads. SFT takes a tagged union (`sft` when `type`
// is absent, or `fake`); the RL trainer takes [data.fake] for benchmarks.
#pragma once

#include <primecfg/detail/cxx_version.hpp>  // first: C++20 or later

#include <primecfg/describe.hpp>
#include <primecfg/validate.hpp>

#include <fmt/format.h>

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace primecfg {

enum class FakeLength { fixed, variable };
enum class FakeInputIds { increasing, random };
enum class StoppingStrategy { first_exhausted, all_exhausted };

struct LossMaskConfig {
  bool system = false;
  bool user = false;
  bool assistant = true;
  bool tool = false;

  static constexpr auto fields() {
    using S = LossMaskConfig;
    return describe(
        field(&S::system, "Train on system messages."), field(&S::user, "Train on user messages."),
        field(&S::assistant, "Train on assistant messages."), field(&S::tool, "Train on tool messages."));
  }
};

struct SFTDataConfig {
  static constexpr std::string_view type = "sft";
  std::string name = "PrimeIntellect/Reverse-Text-SFT";
  std::optional<std::filesystem::path> path = std::nullopt;
  std::int64_t seq_len = 128;
  std::int64_t batch_size = 128;
  std::int64_t micro_batch_size = 1;
  std::int64_t num_workers = 1;
  std::optional<std::vector<std::string>> subsets = std::nullopt;
  std::optional<std::vector<std::string>> splits = std::nullopt;
  std::optional<std::vector<double>> probabilities = std::nullopt;
  StoppingStrategy stopping_strategy = StoppingStrategy::all_exhausted;
  bool pack = true;
  bool shuffle = true;
  std::int64_t seed = 0;
  LossMaskConfig loss_mask = {};

  static constexpr auto fields() {
    using S = SFTDataConfig;
    return describe(
        field(&S::name, "Dataset name; the reference trainer generates reverse-text itself."),
        field(&S::path,
              "Local JSONL file of {input_ids, loss_mask} records (tools/tokenize_jsonl.py) or "
              "byte-tokenized {prompt, completion}; replaces name."),
        field(&S::seq_len, "Tokens per packed sample.", ge(1)),
        field(&S::batch_size, "Samples per optimizer step (global).", ge(1)),
        field(&S::micro_batch_size, "Samples per forward/backward pass.", ge(1)),
        field(&S::num_workers, "Data loader worker processes.", ge(1)),
        field(&S::subsets, "Subsets of the dataset to load."),
        field(&S::splits, "Split to load for each subset."),
        field(&S::probabilities, "Sampling probability of each subset or split when interleaving."),
        field(&S::stopping_strategy, "When interleaving several subsets or splits stops."),
        field(&S::pack, "Pack several examples into one sample of seq_len tokens."),
        field(&S::shuffle, "Shuffle examples every epoch."), field(&S::seed, "Seed of the shuffle."),
        field(&S::loss_mask, "Which message roles contribute to the loss."));
  }

  // prime-rl's validate_subsets_and_splits: one split and one probability per
  // subset, when those lists are given.
  void validate(validation& v) {
    auto agree = [&](const auto& field, const auto& other, const char* what) {
      if (field && other && field->size() != other->size())
        v.error(field, fmt::format("has {} entries but {} has {}; give one {} each", field->size(),
                                   v.path_of(other), other->size(), what));
    };
    if (!subsets && !splits) return;
    agree(splits, subsets, "split for");
    agree(probabilities, subsets, "probability for");
    if (!subsets || !probabilities || subsets->size() == probabilities->size())
      agree(probabilities, splits, "probability for");
  }
};

struct FakeDataConfig {
  static constexpr std::string_view type = "fake";
  std::int64_t seq_len = 128;
  std::int64_t batch_size = 2;
  std::int64_t micro_batch_size = 1;
  std::int64_t num_workers = 1;
  FakeLength length = FakeLength::fixed;
  FakeInputIds input_ids = FakeInputIds::increasing;
  std::int64_t seed = 0;
  bool generate_samples = false;

  static constexpr auto fields() {
    using S = FakeDataConfig;
    return describe(
        field(&S::seq_len, "Tokens per sample.", ge(1)),
        field(&S::batch_size, "Samples per optimizer step (global).", ge(1)),
        field(&S::micro_batch_size, "Samples per forward/backward pass.", ge(1)),
        field(&S::num_workers, "Data loader worker processes (SFT).", ge(1)),
        field(&S::length, "fixed: every sample has seq_len tokens; variable: random lengths."),
        field(&S::input_ids, "increasing: 0, 1, 2, ...; random: uniform token ids."),
        field(&S::seed, "Seed of the generator."),
        field(&S::generate_samples, "Pack separately generated samples into each micro-batch (RL trainer)."));
  }
};

using SFTDataSource = std::variant<SFTDataConfig, FakeDataConfig>;

// The RL trainer's data: rollouts come from the orchestrator unless [data.fake] is set.
struct TrainerDataConfig {
  std::optional<FakeDataConfig> fake = std::nullopt;

  static constexpr auto fields() {
    return describe(field(&TrainerDataConfig::fake, "Train on generated data instead of rollouts."));
  }
};

}  // namespace primecfg
