// Training data without LibTorch: a byte-level tokenizer, the example sources
// (built-in reverse-text generator, local JSONL, prime-rl's fake data), and the
// packer that turns examples into micro-batches of seq_len tokens.
//
// Everything is a pure function of (config, seed, position), so a checkpoint
// stores one integer (the next example) and resume sees the same batches.
#pragma once

#include <primecfg/data.hpp>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace primecfg::train::data {

// Bytes 0..255 are themselves; four special tokens follow.
struct ByteTokenizer {
  static constexpr std::int64_t pad = 256;
  static constexpr std::int64_t bos = 257;
  static constexpr std::int64_t sep = 258;  // between prompt and completion
  static constexpr std::int64_t eos = 259;
  static constexpr std::int64_t vocab_size = 260;

  static std::vector<std::int64_t> encode(const std::string& text);
  static std::string decode(const std::vector<std::int64_t>& ids);  // drops special tokens
};

// One training document: the tokens and, per token, whether predicting it counts in the loss.
struct Example {
  std::vector<std::int64_t> tokens;
  std::vector<std::uint8_t> loss;  // loss[i]: tokens[i] is a target that counts
};

class ExampleSource {
 public:
  virtual ~ExampleSource() = default;
  // Examples per epoch, or nullopt for an endless stream.
  virtual std::optional<std::int64_t> size() const = 0;
  // The example at a global position (epoch * size + offset); deterministic.
  virtual Example at(std::int64_t position) const = 0;
  // What the user should know about the data as read (e.g. truncated records); empty if nothing.
  virtual std::string report() const { return {}; }
};

// The reverse-text task: prompt "<bos>abcd<sep>", completion "dcba<eos>", loss on the completion.
struct ReverseTextOptions {
  std::int64_t min_len = 3;
  std::int64_t max_len = 8;
  std::int64_t examples_per_epoch = 100000;
};
std::unique_ptr<ExampleSource> make_reverse_text(std::int64_t seed, const ReverseTextOptions& = {});
// The pair the reverse-text generator produces at a position (for demos and tests).
std::pair<std::string, std::string> reverse_text_pair(std::int64_t seed, std::int64_t position,
                                                      const ReverseTextOptions& = {});

// What a JSONL file is checked against when it is read.
struct JsonlLimits {
  std::int64_t vocab_size = ByteTokenizer::vocab_size;  // token ids must lie below it
  std::int64_t seq_len = 0;  // a record of more than seq_len + 1 tokens is truncated (0: no limit)
};

// JSONL, one record a line, either
//   {"prompt": str, "completion": str}: byte-tokenized, loss on the completion and eos; or
//   {"input_ids": [int, ...], "loss_mask": [0/1 or bool, ...]}: pre-tokenized (by
//     tools/tokenize_jsonl.py with the model's tokenizer); loss_mask[i] says whether
//     predicting input_ids[i] counts, and without it every token counts.
// Shuffled per epoch. Every error names file:line: an unknown key, an id outside the
// vocabulary, a record with no token in the loss, and a record whose loss tokens all lie
// past the truncation at seq_len + 1 tokens. Truncated records are counted (report()).
std::unique_ptr<ExampleSource> make_jsonl(const std::filesystem::path& path, bool shuffle, std::int64_t seed,
                                          const JsonlLimits& limits = {});

// prime-rl's fake data: loss on every token; fixed (seq_len + 1 tokens, one per sample)
// or variable (random lengths, packed); increasing (0, 1, 2, ...) or random ids.
std::unique_ptr<ExampleSource> make_fake(const FakeDataConfig& cfg, std::int64_t vocab_size);

// A micro-batch: rows x seq_len, flattened row-major.
struct MicroBatch {
  std::int64_t rows = 0, seq_len = 0;
  std::vector<std::int64_t> input_ids;
  std::vector<std::int64_t> targets;    // -100 where no loss
  std::vector<std::int64_t> positions;  // restart at 0 for every packed document
  std::vector<std::int64_t> doc_ids;    // document index within its row (for the attention mask)
  bool one_doc_per_row = true;          // then plain causal attention is exact
  std::int64_t loss_tokens = 0;
  std::int64_t tokens = 0;  // non-padding tokens
};

struct Batch {
  std::vector<MicroBatch> micro;
  std::int64_t loss_tokens = 0;
  std::int64_t tokens = 0;
};

// Shape of the batches and how examples become samples.
struct LoaderOptions {
  std::int64_t seq_len = 128;
  std::int64_t batch_size = 8;        // samples per optimizer step
  std::int64_t micro_batch_size = 1;  // samples per forward/backward
  bool pack = true;
  std::int64_t pad_id = ByteTokenizer::pad;  // input id of padding (no loss, attends to nothing real)
};

class Loader {
 public:
  Loader(std::unique_ptr<ExampleSource> source, const LoaderOptions& opts);

  Batch next();
  // Position of the next example; the whole data state a checkpoint needs.
  std::int64_t position() const { return position_; }
  void set_position(std::int64_t p) { position_ = p; }
  // True once an epoch of a finite source has been consumed.
  bool epoch_done() const;
  const LoaderOptions& options() const { return opts_; }
  std::string source_report() const { return source_->report(); }

 private:
  void fill_row(MicroBatch& mb, std::int64_t row);
  std::unique_ptr<ExampleSource> source_;
  LoaderOptions opts_;
  std::int64_t position_ = 0;
};

// Builds the source and loader for a config's [data] (vocab_size bounds fake ids).
Loader make_loader(const SFTDataSource& cfg, std::int64_t vocab_size);

}  // namespace primecfg::train::data
