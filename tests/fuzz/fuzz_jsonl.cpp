// Fuzz target: the trainer's JSONL reader (data::make_jsonl,
// reference_trainer/data/loader.hpp) and the packer behind it, on arbitrary files,
// through an in-memory file so that the real reading path runs.
//
// The first byte picks the limits (vocabulary: the byte tokenizer's 260 or a
// smaller or larger one; seq_len: none, 4 or 16); the rest is the file.
//
// Properties checked, beyond "no crash, no sanitizer report":
//  - it either reads the file or throws std::runtime_error naming file:line
//    (or the file, for "no records");
//  - every example has as many loss flags as tokens, at least two tokens, ids
//    inside the vocabulary, no loss on the first token, and some loss within
//    the first seq_len + 1 tokens;
//  - a prompt/completion record reads as <bos> prompt <sep> completion <eos>
//    (its bytes, in order), with the loss on the completion and <eos>;
//  - the shuffled order is a permutation, the same every time it is asked for;
//  - a few batches of the loader (packed and not) have the declared shapes,
//    targets inside the vocabulary or -100, and loss_tokens that count them.
#include "base/strict_json.hpp"
#include "data/loader.hpp"
#include "fuzz_check.hpp"
#include "memfile.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace {

namespace data = primecfg::train::data;
namespace json = primecfg::train::strict_json;
using primecfg::fuzz::check;
using primecfg::fuzz::memfile;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* bytes, std::size_t size) {
  if (size < 1) return 0;
  static memfile file("fuzz-jsonl");
  data::JsonlLimits limits;
  const std::int64_t vocabs[] = {260, 100, 50000, 300};
  const std::int64_t seq_lens[] = {0, 4, 16, 0};
  limits.vocab_size = vocabs[bytes[0] & 3];
  limits.seq_len = seq_lens[(bytes[0] >> 2) & 3];
  const std::string text(reinterpret_cast<const char*>(bytes + 1), size - 1);
  file.set(text.data(), text.size());

  std::unique_ptr<data::ExampleSource> plain, shuffled;
  try {
    plain = data::make_jsonl(file.path(), false, 7, limits);
  } catch (const std::runtime_error& e) {
    check(std::string(e.what()).rfind(file.path() + ":", 0) == 0, "the error names the file", e.what());
    return 0;
  }
  check(plain->size().has_value() && *plain->size() > 0, "a read file has records", text);
  const std::int64_t n = *plain->size();

  // The records as JSON, in file order, to compare with (the reader accepted them).
  std::vector<json::value> records;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);)
    if (line.find_first_not_of(" \t\r") != std::string::npos) records.push_back(json::parse(line));
  check(static_cast<std::int64_t>(records.size()) == n, "one example per non-blank line", text);

  const std::size_t max_tokens = static_cast<std::size_t>(limits.seq_len + 1);
  for (std::int64_t i = 0; i < n; ++i) {
    const data::Example ex = plain->at(i);
    check(ex.tokens.size() == ex.loss.size(), "a loss flag per token", text);
    check(ex.tokens.size() >= 2, "at least two tokens", text);
    for (auto t : ex.tokens) check(t >= 0 && t < limits.vocab_size, "ids inside the vocabulary", text);
    check(ex.loss[0] == 0, "no loss on the first token", text);
    const auto end = limits.seq_len > 0 && ex.tokens.size() > max_tokens
                         ? ex.loss.begin() + static_cast<std::ptrdiff_t>(max_tokens)
                         : ex.loss.end();
    check(std::find(ex.loss.begin(), end, 1) != end, "some loss within the first seq_len + 1 tokens", text);
    const json::value& r = records[static_cast<std::size_t>(i)];
    if (const json::value* p = json::find(r, "prompt")) {
      const std::string& prompt = p->get_ref<const std::string&>();
      const std::string& completion = json::find(r, "completion")->get_ref<const std::string&>();
      std::vector<std::int64_t> want{data::ByteTokenizer::bos};
      for (unsigned char c : prompt) want.push_back(c);
      want.push_back(data::ByteTokenizer::sep);
      const std::size_t first_target = want.size();
      for (unsigned char c : completion) want.push_back(c);
      want.push_back(data::ByteTokenizer::eos);
      check(ex.tokens == want, "<bos> prompt <sep> completion <eos>", text);
      for (std::size_t k = 0; k < want.size(); ++k)
        check(ex.loss[k] == (k >= first_target ? 1 : 0), "the loss on the completion and <eos>", text);
      check(data::ByteTokenizer::decode(ex.tokens) == prompt + completion, "decode drops the special tokens",
            text);
    }
  }

  // Shuffled: a permutation of the same examples, stable per epoch.
  shuffled = data::make_jsonl(file.path(), true, 7, limits);
  check(shuffled->size() == plain->size(), "the same records shuffled", text);
  if (n <= 64) {
    std::multiset<std::vector<std::int64_t>> a, b;
    for (std::int64_t i = 0; i < n; ++i) {
      a.insert(plain->at(i).tokens);
      b.insert(shuffled->at(n + i).tokens);  // the second epoch
    }
    check(a == b, "an epoch of the shuffled source is a permutation", text);
    check(shuffled->at(n).tokens == shuffled->at(n).tokens, "the same example at the same position", text);
  }

  // The loader: a few batches, packed and one document per row.
  for (bool pack : {true, false}) {
    data::LoaderOptions o;
    o.seq_len = limits.seq_len > 0 ? limits.seq_len : 8;
    o.batch_size = 4;
    o.micro_batch_size = 2;
    o.pack = pack;
    data::Loader loader(data::make_jsonl(file.path(), true, 3, limits), o);
    for (int step = 0; step < 3; ++step) {
      const data::Batch b = loader.next();
      check(b.micro.size() == 2, "batch_size / micro_batch_size micro-batches", text);
      std::int64_t loss_tokens = 0;
      for (const auto& mb : b.micro) {
        const auto cells = static_cast<std::size_t>(mb.rows * mb.seq_len);
        check(mb.rows == 2 && mb.seq_len == o.seq_len, "micro-batch shape", text);
        check(mb.input_ids.size() == cells && mb.targets.size() == cells && mb.positions.size() == cells &&
                  mb.doc_ids.size() == cells,
              "micro-batch sizes", text);
        std::int64_t counted = 0;
        for (std::size_t k = 0; k < cells; ++k) {
          const auto t = mb.targets[k];
          check(t == -100 || (t >= 0 && t < limits.vocab_size), "targets inside the vocabulary or -100",
                text);
          counted += t != -100;
          const auto id = mb.input_ids[k];
          check((id >= 0 && id < limits.vocab_size) || id == o.pad_id, "inputs inside the vocabulary", text);
        }
        check(counted == mb.loss_tokens, "loss_tokens counts the targets", text);
        loss_tokens += mb.loss_tokens;
      }
      check(loss_tokens == b.loss_tokens, "the batch's loss_tokens is the sum", text);
    }
  }
  return 0;
}
