#include "data/loader.hpp"

#include "base/strict_json.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <numeric>
#include <stdexcept>

namespace primecfg::train::data {

namespace {

namespace json = strict_json;

// A counter-based generator: the same (seed, stream) always gives the same numbers,
// whatever was drawn before, which is what makes resume exact.
class rng {
 public:
  rng(std::int64_t seed, std::int64_t stream)
      : s_(mix(static_cast<std::uint64_t>(seed) * 0x9E3779B97F4A7C15ull ^
               mix(static_cast<std::uint64_t>(stream)))) {}
  std::uint64_t next() { return mix(s_ += 0x9E3779B97F4A7C15ull); }
  std::int64_t below(std::int64_t n) {
    return static_cast<std::int64_t>(next() % static_cast<std::uint64_t>(n));
  }

 private:
  static std::uint64_t mix(std::uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  std::uint64_t s_;
};

// "<bos> prompt <sep> completion <eos>", loss on completion and eos.
Example prompt_completion(const std::string& prompt, const std::string& completion) {
  Example ex;
  ex.tokens.push_back(ByteTokenizer::bos);
  for (auto t : ByteTokenizer::encode(prompt)) ex.tokens.push_back(t);
  ex.tokens.push_back(ByteTokenizer::sep);
  std::size_t first_target = ex.tokens.size();
  for (auto t : ByteTokenizer::encode(completion)) ex.tokens.push_back(t);
  ex.tokens.push_back(ByteTokenizer::eos);
  ex.loss.assign(ex.tokens.size(), 0);
  std::fill(ex.loss.begin() + static_cast<std::ptrdiff_t>(first_target), ex.loss.end(), 1);
  return ex;
}

class ReverseText final : public ExampleSource {
 public:
  ReverseText(std::int64_t seed, ReverseTextOptions o) : seed_(seed), o_(o) {}
  std::optional<std::int64_t> size() const override { return o_.examples_per_epoch; }
  Example at(std::int64_t position) const override {
    auto [p, c] = reverse_text_pair(seed_, position, o_);
    return prompt_completion(p, c);
  }

 private:
  std::int64_t seed_;
  ReverseTextOptions o_;
};

class Jsonl final : public ExampleSource {
 public:
  Jsonl(const std::filesystem::path& path, bool shuffle, std::int64_t seed, const JsonlLimits& limits)
      : shuffle_(shuffle), seed_(seed) {
    std::error_code ec;
    if (std::filesystem::exists(path, ec) && !std::filesystem::is_regular_file(path, ec))
      throw std::runtime_error(path.string() + ": the JSONL data file is not a regular file");
    std::ifstream in(path);
    if (!in) throw std::runtime_error(path.string() + ": cannot open the JSONL data file");
    std::string line;
    std::int64_t lineno = 0, truncated = 0;
    std::string first_truncated;
    while (std::getline(in, line)) {
      ++lineno;
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      auto where = path.string() + ":" + std::to_string(lineno);
      try {
        Example ex = record(json::parse(line), limits, where);
        const auto max_tokens = static_cast<std::size_t>(limits.seq_len + 1);
        if (limits.seq_len > 0 && ex.tokens.size() > max_tokens) {
          if (std::find(ex.loss.begin() + 1, ex.loss.begin() + static_cast<std::ptrdiff_t>(max_tokens), 1) ==
              ex.loss.begin() + static_cast<std::ptrdiff_t>(max_tokens))
            throw std::runtime_error(fmt::format(
                "the record has {} tokens and every token in the loss lies past seq_len + 1 = {}; "
                "cut at seq_len it would train on nothing (raise data.seq_len or shorten the prompt)",
                ex.tokens.size(), max_tokens));
          if (truncated++ == 0) first_truncated = where;
        }
        examples_.push_back(std::move(ex));
      } catch (const json::error& e) {
        throw std::runtime_error(where + ": " + e.what());
      } catch (const std::runtime_error& e) {
        throw std::runtime_error(where + ": " + e.what());
      }
    }
    if (examples_.empty()) throw std::runtime_error(path.string() + ": no records");
    if (truncated)
      report_ = fmt::format(
          "{}: {} of {} records have more than seq_len + 1 = {} tokens and are truncated to that (the first "
          "at "
          "{})",
          path.string(), truncated, examples_.size(), limits.seq_len + 1, first_truncated);
  }
  std::optional<std::int64_t> size() const override { return static_cast<std::int64_t>(examples_.size()); }
  std::string report() const override { return report_; }
  Example at(std::int64_t position) const override {
    const auto n = static_cast<std::int64_t>(examples_.size());
    std::int64_t epoch = position / n, offset = position % n;
    if (!shuffle_) return examples_[offset];
    if (epoch != cached_epoch_) {
      order_.resize(n);
      std::iota(order_.begin(), order_.end(), 0);
      rng r(seed_, -1 - epoch);
      for (std::int64_t i = n - 1; i > 0; --i) std::swap(order_[i], order_[r.below(i + 1)]);
      cached_epoch_ = epoch;
    }
    return examples_[order_[offset]];
  }

 private:
  // One record, either form; errors say what is wrong (the caller adds file:line).
  static Example record(const json::value& v, const JsonlLimits& limits, const std::string& where) {
    if (!v.is_object()) throw std::runtime_error("a record must be a JSON object");
    for (const auto& [key, val] : v.items())
      if (key != "prompt" && key != "completion" && key != "input_ids" && key != "loss_mask")
        throw std::runtime_error(fmt::format(
            "unknown key \"{}\" (records hold prompt and completion, or input_ids and loss_mask{})", key,
            key == "messages" || key == "text"
                ? "; tokenize chat or text records with tools/tokenize_jsonl.py"
                : ""));
    const auto* ids = json::find(v, "input_ids");
    if (!ids) {
      const auto* p = json::find(v, "prompt");
      const auto* c = json::find(v, "completion");
      if (!p || !c || json::find(v, "loss_mask"))
        throw std::runtime_error(
            "a record needs \"prompt\" and \"completion\" strings, or \"input_ids\" (and optional "
            "\"loss_mask\")");
      if (limits.vocab_size < ByteTokenizer::vocab_size)
        throw std::runtime_error(fmt::format(
            "prompt/completion records are byte-tokenized (ids up to {}), but the model's vocabulary has {} "
            "tokens; give input_ids made with the model's tokenizer (tools/tokenize_jsonl.py)",
            ByteTokenizer::vocab_size - 1, limits.vocab_size));
      if (!p->is_string() || !c->is_string())
        throw std::runtime_error(
            "\"prompt\" and \"completion\" must be strings (tokenize chat records with "
            "tools/tokenize_jsonl.py)");
      Example ex = prompt_completion(p->get<std::string>(), c->get<std::string>());
      (void)where;
      return ex;
    }
    if (json::find(v, "prompt") || json::find(v, "completion"))
      throw std::runtime_error("a record has either input_ids or prompt and completion, not both");
    Example ex;
    if (!ids->is_array()) throw std::runtime_error("input_ids must be an array of integers");
    const auto& list = *ids;
    if (list.size() < 2) throw std::runtime_error("input_ids needs at least two tokens (one to predict)");
    for (std::size_t i = 0; i < list.size(); ++i) {
      const auto& t = list[i];
      const std::optional<std::int64_t> id_or = json::integer(t);
      if (!id_or)
        throw std::runtime_error(fmt::format("input_ids[{}] = {} is not an integer", i, json::dump(t)));
      const std::int64_t id = *id_or;
      if (id < 0 || id >= limits.vocab_size)
        throw std::runtime_error(fmt::format("input_ids[{}] = {} is outside the vocabulary (0 .. {})", i, id,
                                             limits.vocab_size - 1));
      ex.tokens.push_back(id);
    }
    ex.loss.assign(ex.tokens.size(), 1);
    if (const auto* mask = json::find(v, "loss_mask")) {
      if (!mask->is_array()) throw std::runtime_error("loss_mask must be an array of 0, 1, true or false");
      const auto& m = *mask;
      if (m.size() != list.size())
        throw std::runtime_error(
            fmt::format("loss_mask has {} entries, input_ids {}; they must match", m.size(), list.size()));
      for (std::size_t i = 0; i < m.size(); ++i) {
        const std::optional<std::int64_t> bit = json::integer(m[i]);
        if (m[i].is_boolean())
          ex.loss[i] = m[i].get<bool>();
        else if (bit == 0 || bit == 1)
          ex.loss[i] = static_cast<std::uint8_t>(*bit);
        else
          throw std::runtime_error(fmt::format("loss_mask[{}] must be 0, 1, true or false", i));
      }
    }
    ex.loss[0] = 0;  // the first token is never predicted
    if (std::find(ex.loss.begin(), ex.loss.end(), 1) == ex.loss.end())
      throw std::runtime_error("loss_mask leaves no token to train on (only input_ids[0] or zeros)");
    return ex;
  }

  std::vector<Example> examples_;
  bool shuffle_;
  std::int64_t seed_;
  std::string report_;
  mutable std::int64_t cached_epoch_ = -1;
  mutable std::vector<std::int64_t> order_;
};

class Fake final : public ExampleSource {
 public:
  Fake(const FakeDataConfig& c, std::int64_t vocab) : c_(c), vocab_(vocab) {}
  std::optional<std::int64_t> size() const override { return std::nullopt; }
  Example at(std::int64_t position) const override {
    rng r(1234, position);
    std::int64_t len = c_.seq_len + 1;
    if (c_.length == FakeLength::variable) len = 2 + r.below(c_.seq_len);
    Example ex;
    for (std::int64_t i = 0; i < len; ++i)
      ex.tokens.push_back(c_.input_ids == FakeInputIds::increasing ? i % vocab_ : r.below(vocab_));
    ex.loss.assign(ex.tokens.size(), 1);
    return ex;
  }

 private:
  FakeDataConfig c_;
  std::int64_t vocab_;
};

}  // namespace

std::vector<std::int64_t> ByteTokenizer::encode(const std::string& text) {
  std::vector<std::int64_t> ids;
  ids.reserve(text.size());
  for (unsigned char c : text) ids.push_back(c);
  return ids;
}

std::string ByteTokenizer::decode(const std::vector<std::int64_t>& ids) {
  std::string out;
  for (auto id : ids)
    if (id >= 0 && id < 256) out += static_cast<char>(id);
  return out;
}

std::pair<std::string, std::string> reverse_text_pair(std::int64_t seed, std::int64_t position,
                                                      const ReverseTextOptions& o) {
  rng r(seed, position);
  std::int64_t len = o.min_len + r.below(o.max_len - o.min_len + 1);
  std::string s;
  for (std::int64_t i = 0; i < len; ++i) s += static_cast<char>('a' + r.below(26));
  return {s, std::string(s.rbegin(), s.rend())};
}

std::unique_ptr<ExampleSource> make_reverse_text(std::int64_t seed, const ReverseTextOptions& o) {
  return std::make_unique<ReverseText>(seed, o);
}
std::unique_ptr<ExampleSource> make_jsonl(const std::filesystem::path& path, bool shuffle, std::int64_t seed,
                                          const JsonlLimits& limits) {
  return std::make_unique<Jsonl>(path, shuffle, seed, limits);
}
std::unique_ptr<ExampleSource> make_fake(const FakeDataConfig& cfg, std::int64_t vocab_size) {
  return std::make_unique<Fake>(cfg, vocab_size);
}

Loader::Loader(std::unique_ptr<ExampleSource> source, const LoaderOptions& opts)
    : source_(std::move(source)), opts_(opts) {
  if (opts_.batch_size % opts_.micro_batch_size != 0)
    throw std::invalid_argument("batch_size must be a multiple of micro_batch_size");
}

bool Loader::epoch_done() const {
  auto n = source_->size();
  return n && position_ >= *n;
}

// Fills one row with whole documents (inputs = tokens[:-1], targets = tokens[1:]).
// A document longer than the row is cut; one that does not fit in what is left
// starts the next row (documents are never split across rows).
void Loader::fill_row(MicroBatch& mb, std::int64_t row) {
  const std::int64_t L = opts_.seq_len;
  const std::int64_t base = row * L;
  std::int64_t used = 0, doc = 0;
  for (;;) {
    Example ex = source_->at(position_);
    std::int64_t n = std::min<std::int64_t>(static_cast<std::int64_t>(ex.tokens.size()) - 1, L);
    if (n <= 0) {
      ++position_;
      continue;
    }
    if (used > 0 && used + n > L) break;  // starts the next row
    for (std::int64_t i = 0; i < n; ++i) {
      const std::int64_t k = base + used + i;
      mb.input_ids[k] = ex.tokens[i];
      mb.targets[k] = ex.loss[i + 1] ? ex.tokens[i + 1] : -100;
      mb.positions[k] = i;
      mb.doc_ids[k] = doc;
      mb.loss_tokens += ex.loss[i + 1] ? 1 : 0;
    }
    mb.tokens += n;
    used += n;
    ++doc;
    ++position_;
    if (!opts_.pack || used >= L) break;
  }
  if (doc > 1 || used < L) mb.one_doc_per_row = false;
  // Padding: its own document so no real token attends to it.
  for (std::int64_t i = used; i < L; ++i) mb.doc_ids[base + i] = doc;
}

Batch Loader::next() {
  Batch b;
  const std::int64_t n_micro = opts_.batch_size / opts_.micro_batch_size;
  for (std::int64_t m = 0; m < n_micro; ++m) {
    MicroBatch mb;
    mb.rows = opts_.micro_batch_size;
    mb.seq_len = opts_.seq_len;
    const auto total = static_cast<std::size_t>(mb.rows * mb.seq_len);
    mb.input_ids.assign(total, opts_.pad_id);
    mb.targets.assign(total, -100);
    mb.positions.assign(total, 0);
    mb.doc_ids.assign(total, 0);
    for (std::int64_t r = 0; r < mb.rows; ++r) fill_row(mb, r);
    b.loss_tokens += mb.loss_tokens;
    b.tokens += mb.tokens;
    b.micro.push_back(std::move(mb));
  }
  return b;
}

Loader make_loader(const SFTDataSource& cfg, std::int64_t vocab_size) {
  return std::visit(
      [&](const auto& c) -> Loader {
        using C = std::decay_t<decltype(c)>;
        LoaderOptions o{c.seq_len, c.batch_size, c.micro_batch_size, true};
        // The byte tokenizer's pad id where the vocabulary has it, else 0 (padding
        // is masked out of attention and loss, but it must still be a valid id).
        o.pad_id = vocab_size > ByteTokenizer::pad ? ByteTokenizer::pad : 0;
        if constexpr (std::is_same_v<C, FakeDataConfig>) {
          o.pack = c.length == FakeLength::variable;
          return Loader(make_fake(c, vocab_size), o);
        } else {
          o.pack = c.pack;
          if (c.path)
            return Loader(make_jsonl(*c.path, c.shuffle, c.seed, JsonlLimits{vocab_size, c.seq_len}), o);
          if (vocab_size < ByteTokenizer::vocab_size)
            throw std::runtime_error(fmt::format(
                "data: the built-in reverse-text task is byte-tokenized (ids up to {}), but the model's "
                "vocabulary has {} tokens; set data.path to pre-tokenized JSONL",
                ByteTokenizer::vocab_size - 1, vocab_size));
          return Loader(make_reverse_text(c.seed), o);
        }
      },
      cfg);
}

}  // namespace primecfg::train::data
