// safetensors, data packing and the shard layout: the trainer's plain C++ parts (JSON:
// test_strict_json.cpp).
#include "base/remove_tree.hpp"
#include "base/safetensors.hpp"
#include "base/strict_json.hpp"
#include "checkpoint/weight_files.hpp"
#include "data/loader.hpp"
#include "distributed/shard_layout.hpp"
#include "support.hpp"

#include <doctest/doctest.h>

#include <unistd.h>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <vector>

namespace fs = std::filesystem;
using namespace primecfg::train;

namespace {
fs::path temp_dir(const char* name) {
  auto d = fs::temp_directory_path() / ("primecfg-trainer-test-" + std::to_string(::getpid())) / name;
  primecfg::train::remove_tree(d);
  fs::create_directories(d);
  return d;
}
}  // namespace

TEST_CASE("remove_tree removes a tree without following its links; a missing path is no error") {
  const fs::path d = temp_dir("remove_tree");
  const fs::path outside = temp_dir("remove_tree_outside");
  fs::create_directories(d / "a" / "b");
  std::ofstream(d / "a" / "b" / "f") << "x";
  std::ofstream(outside / "kept") << "y";
  fs::create_directory_symlink(outside, d / "a" / "link");
  std::error_code ec;
  remove_tree(d, ec);
  CHECK(!ec);
  CHECK(!fs::exists(d));
  CHECK(fs::exists(outside / "kept"));  // the link went, not what it points to
  remove_tree(d, ec);
  CHECK(!ec);
  remove_tree(outside / "kept");  // a plain file
  CHECK(!fs::exists(outside / "kept"));
  // A path that cannot be looked at (below a plain file): an error naming it when thrown.
  std::ofstream(outside / "file") << "z";
  remove_tree(outside / "file" / "below", ec);
  CHECK(ec == std::errc::not_a_directory);
  CHECK_THROWS_WITH_AS(remove_tree(outside / "file" / "below"), doctest::Contains("file/below"),
                       fs::filesystem_error);
  fs::create_directories(d);
  remove_tree(d);
  CHECK(!fs::exists(d));
}

TEST_CASE("shard layout: a piece's whole rows and cut rows, counted element by element") {
  // A 5 x 4 matrix split over every world from 1 to 24: pieces longer than a row, shorter
  // than one (starting on a row's start or inside it), and empty ones past the end.
  const std::int64_t rows = 5, dim = 4, n = rows * dim;
  for (std::int64_t world = 1; world <= 24; ++world)
    for (std::int64_t rank = 0; rank < world; ++rank) {
      CAPTURE(world);
      CAPTURE(rank);
      const ShardSpan s = ShardSpan::of(n, rank, world);
      const PieceRows pr{dim, s.offset, s.offset + s.length};
      std::vector<std::int64_t> cut, whole, touched;
      for (std::int64_t r = 0; r < rows; ++r) {
        std::int64_t held = 0;
        for (std::int64_t e = r * dim; e < (r + 1) * dim; ++e)
          held += e >= s.offset && e < s.offset + s.length;
        CHECK(pr.held(r) == held);
        CHECK(pr.whole(r) == (held == dim));
        if (held == dim) whole.push_back(r);
        if (held > 0 && held < dim) cut.push_back(r);
        if (held > 0) touched.push_back(r);
        if (held > 0) CHECK(pr.to(r) - pr.from(r) == held);
      }
      std::vector<std::int64_t> seen;
      pr.for_each_cut_row([&](std::int64_t r) { seen.push_back(r); });
      CHECK(seen == cut);
      CHECK(cut.size() <= 2);
      std::vector<std::int64_t> range;
      for (std::int64_t r = pr.first_whole(); r < pr.end_whole(); ++r) range.push_back(r);
      CHECK(range == whole);
      range.clear();
      for (std::int64_t r = pr.first_row(); r < pr.end_row(); ++r) range.push_back(r);
      CHECK(range == touched);  // an empty piece touches no row
    }
}

TEST_CASE("safetensors: write then read gives the same names, dtypes, shapes, bytes and metadata") {
  auto dir = temp_dir("st");
  std::vector<float> a{1.5f, -2.0f, 3.25f, 0.0f, 1e-30f, 7.0f};
  std::vector<std::uint16_t> b{0x3f80, 0xbf80, 0x0000};
  std::vector<std::int64_t> c{42};
  safetensors::write(dir / "x.safetensors",
                     {{"w.a", safetensors::dtype::F32, {2, 3}, a.data(), a.size() * 4},
                      {"w.b", safetensors::dtype::BF16, {3}, b.data(), b.size() * 2},
                      {"step", safetensors::dtype::I64, {}, c.data(), 8}},
                     {{"format", "pt"}, {"note", "quote \" and \\ back"}});
  auto f = safetensors::file::open(dir / "x.safetensors");
  REQUIRE(f.tensors().size() == 3);
  const auto* ta = f.find("w.a");
  REQUIRE(ta);
  CHECK(ta->type == safetensors::dtype::F32);
  CHECK(ta->shape == std::vector<std::int64_t>{2, 3});
  CHECK(std::memcmp(ta->data, a.data(), 24) == 0);
  CHECK(reinterpret_cast<std::uintptr_t>(ta->data) % 8 == 0);
  const auto* tb = f.find("w.b");
  REQUIRE(tb);
  CHECK(tb->type == safetensors::dtype::BF16);
  CHECK(std::memcmp(tb->data, b.data(), 6) == 0);
  const auto* tc = f.find("step");
  REQUIRE(tc);
  CHECK(tc->shape.empty());
  CHECK(tc->numel() == 1);
  CHECK(f.metadata().at("note") == "quote \" and \\ back");
}

TEST_CASE("safetensors: a file written one tensor at a time, in any order, is the file write() gives") {
  auto dir = temp_dir("st-writer");
  std::vector<float> a{1.5f, -2.0f, 3.25f, 0.0f, 1e-30f, 7.0f};
  std::vector<std::uint16_t> b{0x3f80, 0xbf80, 0x0000};
  const std::vector<safetensors::entry> entries{
      {"w.a", safetensors::dtype::F32, {2, 3}, a.data(), a.size() * 4},
      {"w.b", safetensors::dtype::BF16, {3}, b.data(), b.size() * 2},
      {"empty", safetensors::dtype::F32, {0}, nullptr, 0}};
  safetensors::write(dir / "whole.safetensors", entries, {{"format", "pt"}});
  safetensors::writer w(dir / "streamed.safetensors", entries, {{"format", "pt"}});
  w.put("w.b", b.data(), 6);  // the last in the file first
  w.put("empty", nullptr, 0);
  w.put("w.a", a.data(), 24);
  w.finish();
  auto bytes = [](const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  CHECK(bytes(dir / "streamed.safetensors") == bytes(dir / "whole.safetensors"));

  // Misuse and failures name the file and the tensor.
  safetensors::writer part(dir / "part.safetensors", entries);
  CHECK_THROWS_WITH_AS(part.put("w.c", a.data(), 24), doctest::Contains("w.c is not in the file's layout"),
                       safetensors::error);
  CHECK_THROWS_WITH_AS(part.put("w.a", a.data(), 20), doctest::Contains("20 bytes given, its shape needs 24"),
                       safetensors::error);
  part.put("w.a", a.data(), 24);
  CHECK_THROWS_WITH_AS(part.put("w.a", a.data(), 24), doctest::Contains("w.a written twice"),
                       safetensors::error);
  CHECK_THROWS_WITH_AS(part.finish(), doctest::Contains("part.safetensors: tensor empty was never written"),
                       safetensors::error);
  if (fs::exists("/dev/full"))  // a full disk: the header's write fails already
    CHECK_THROWS_WITH_AS(safetensors::writer("/dev/full", entries),
                         doctest::Contains("/dev/full: write failed"), safetensors::error);
}

TEST_CASE("weight files: split as huggingface_hub splits a state dict, named as transformers names them") {
  using Files = std::vector<std::vector<std::size_t>>;
  auto files_of = [](const WeightFiles& w) {
    Files out;
    for (const auto& f : w.files) out.push_back(f.tensors);
    return out;
  };
  // huggingface_hub's own example: [6, 6, 2, 6, 2, 2] at 10 is [6], [6 + 2], [6 + 2 + 2].
  WeightFiles w = split_weight_files({6, 6, 2, 6, 2, 2}, 10);
  CHECK(files_of(w) == Files{{0}, {1, 2}, {3, 4, 5}});
  CHECK(w.total_bytes == 24);
  CHECK(w.indexed());
  CHECK(w.files[0].name == "model-00001-of-00003.safetensors");
  CHECK(w.files[2].name == "model-00003-of-00003.safetensors");
  // A tensor larger than the limit has a file of its own, before the one being filled.
  CHECK(files_of(split_weight_files({3, 12, 4}, 10)) == Files{{1}, {0, 2}});
  // Exactly the limit is one file, named model.safetensors, and needs no index.
  w = split_weight_files({5, 5}, 10);
  CHECK(files_of(w) == Files{{0, 1}});
  CHECK(w.files[0].name == "model.safetensors");
  CHECK_FALSE(w.indexed());
  CHECK(split_weight_files({5, 5}, hf_max_shard_bytes).files.size() == 1);

  // The index: total size and each tensor's file.
  w = split_weight_files({6, 6, 2}, 10);
  const auto index = strict_json::parse(weight_index_json(w, {"a", "b", "c"}));
  CHECK(index["metadata"]["total_size"] == 14);
  CHECK(index["weight_map"]["a"] == "model-00001-of-00002.safetensors");
  CHECK(index["weight_map"]["c"] == "model-00002-of-00002.safetensors");
  CHECK(index["weight_map"].size() == 3);

  // transformers' state-dict order: attention, MLP, then the block's two norms.
  const std::vector<std::string> ours{"model.embed_tokens.weight",
                                      "model.layers.0.input_layernorm.weight",
                                      "model.layers.0.self_attn.q_proj.weight",
                                      "model.layers.0.self_attn.k_norm.weight",
                                      "model.layers.0.post_attention_layernorm.weight",
                                      "model.layers.0.mlp.down_proj.weight",
                                      "model.layers.10.input_layernorm.weight",
                                      "model.layers.2.self_attn.q_proj.weight",
                                      "model.norm.weight",
                                      "lm_head.weight"};
  std::vector<std::string> got;
  for (std::size_t i : hf_state_dict_order(ours)) got.push_back(ours[i]);
  CHECK(got == std::vector<std::string>{
                   "model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight",
                   "model.layers.0.self_attn.k_norm.weight", "model.layers.0.mlp.down_proj.weight",
                   "model.layers.0.input_layernorm.weight", "model.layers.0.post_attention_layernorm.weight",
                   "model.layers.2.self_attn.q_proj.weight", "model.layers.10.input_layernorm.weight",
                   "model.norm.weight", "lm_head.weight"});
}

TEST_CASE("safetensors: truncated and corrupt files fail with the file name") {
  auto dir = temp_dir("st-bad");
  std::vector<float> a(64, 1.0f);
  safetensors::write(dir / "ok.safetensors", {{"a", safetensors::dtype::F32, {64}, a.data(), 256}});
  auto size = fs::file_size(dir / "ok.safetensors");
  fs::copy_file(dir / "ok.safetensors", dir / "cut.safetensors");
  fs::resize_file(dir / "cut.safetensors", size - 10);
  CHECK_THROWS_WITH_AS(safetensors::file::open(dir / "cut.safetensors"), doctest::Contains("cut.safetensors"),
                       safetensors::error);
  std::ofstream(dir / "tiny.safetensors") << "abc";
  CHECK_THROWS_AS(safetensors::file::open(dir / "tiny.safetensors"), safetensors::error);
  std::ofstream junk(dir / "junk.safetensors", std::ios::binary);
  std::uint64_t n = 5;
  junk.write(reinterpret_cast<const char*>(&n), 8);
  junk << "{nope";
  junk.close();
  CHECK_THROWS_AS(safetensors::file::open(dir / "junk.safetensors"), safetensors::error);
  CHECK_THROWS_AS(safetensors::file::open(dir / "missing.safetensors"), safetensors::error);
}

TEST_CASE("data: reverse-text packing, loss on completions only, positions restart per document") {
  data::Loader loader(data::make_reverse_text(5), data::LoaderOptions{32, 2, 1, true});
  auto batch = loader.next();
  REQUIRE(batch.micro.size() == 2);
  const auto& mb = batch.micro[0];
  CHECK(mb.rows == 1);
  CHECK(mb.seq_len == 32);
  CHECK_FALSE(mb.one_doc_per_row);
  // The first document: <bos> prompt <sep> completion <eos>.
  auto [prompt, completion] = data::reverse_text_pair(5, 0);
  CHECK(mb.input_ids[0] == data::ByteTokenizer::bos);
  const auto sep_at = 1 + static_cast<std::int64_t>(prompt.size());
  CHECK(mb.input_ids[sep_at] == data::ByteTokenizer::sep);
  for (std::int64_t i = 0; i < sep_at; ++i) CHECK(mb.targets[i] == -100);  // no loss on the prompt
  CHECK(mb.targets[sep_at] == static_cast<unsigned char>(completion[0]));
  CHECK(mb.positions[0] == 0);
  // The second document starts at position 0 again and has a new doc id.
  const auto doc_len = static_cast<std::int64_t>(prompt.size() + completion.size()) + 2;
  CHECK(mb.positions[doc_len] == 0);
  CHECK(mb.doc_ids[doc_len] == 1);
  std::int64_t counted = 0;
  for (auto t : mb.targets) counted += t != -100;
  CHECK(counted == mb.loss_tokens);
  // Same position, same batch (what resume relies on).
  data::Loader again(data::make_reverse_text(5), data::LoaderOptions{32, 2, 1, true});
  again.set_position(loader.position());
  auto b1 = loader.next();
  auto b2 = again.next();
  CHECK(b1.micro[0].input_ids == b2.micro[0].input_ids);
}

TEST_CASE("data: fake data fixed and variable, increasing and random") {
  primecfg::FakeDataConfig fixed;
  fixed.seq_len = 16;
  fixed.batch_size = 2;
  fixed.micro_batch_size = 1;
  auto l = data::make_loader(fixed, 1000);
  auto b = l.next();
  REQUIRE(b.micro.size() == 2);
  CHECK(b.micro[0].input_ids[5] == 5);
  CHECK(b.micro[0].targets[5] == 6);
  CHECK(b.micro[0].one_doc_per_row);
  CHECK(b.loss_tokens == 32);
  primecfg::FakeDataConfig var = fixed;
  var.length = primecfg::FakeLength::variable;
  var.input_ids = primecfg::FakeInputIds::random;
  auto lv = data::make_loader(var, 50);
  auto bv = lv.next();
  for (auto t : bv.micro[0].input_ids) CHECK(t < 50);  // padding too: a small vocabulary pads with 0
}

TEST_CASE("data: JSONL records, and a bad line names file and line") {
  auto dir = temp_dir("jsonl");
  std::ofstream(dir / "ok.jsonl") << R"({"prompt": "hi", "completion": "there"})"
                                  << "\n\n"
                                  << R"({"prompt": "a", "completion": "b"})"
                                  << "\n";
  data::Loader l(data::make_jsonl(dir / "ok.jsonl", false, 0), data::LoaderOptions{64, 1, 1, false});
  auto b = l.next();
  CHECK(b.micro[0].loss_tokens == 6);  // "there" + eos
  CHECK(l.position() == 1);
  std::ofstream(dir / "bad.jsonl") << R"({"prompt": "hi", "completion": "x"})"
                                   << "\n"
                                   << R"({"prompt": 3})"
                                   << "\n";
  CHECK_THROWS_WITH(data::make_jsonl(dir / "bad.jsonl", false, 0), doctest::Contains("bad.jsonl:2"));
}

// model.quantization as prime-rl's: accepted (the device is the run's business), with
// routed experts FP8 cannot take whole and a pattern that is no regex named by their fields.
TEST_CASE("support: model.quantization is checked field by field") {
  auto errors = [](const primecfg::SFTConfig& cfg) {
    std::vector<std::string> out;
    for (const auto& d : check_support(cfg, {}))
      if (d.level == primecfg::severity::error) out.push_back(d.path + ": " + d.message);
    return out;
  };
  primecfg::SFTConfig dense;
  dense.model.compile = std::nullopt;
  dense.model.quantization = primecfg::QuantizationConfig{};
  CHECK(errors(dense).empty());
  auto moe = dense;
  moe.model.name = "primecfg/tiny-moe";
  const auto e = errors(moe);
  REQUIRE(e.size() == 1);
  CHECK(
      e[0].starts_with("model.quantization.enable_grouped_gemm: true, and primecfg/tiny-moe's routed experts "
                       "are 96 x 128"));
  moe.model.quantization->enable_grouped_gemm = false;
  CHECK(errors(moe).empty());
  moe.model.quantization->enable_grouped_gemm = true;
  moe.model.name = "Qwen/Qwen3-30B-A3B";  // 768 x 2048: FP8 experts
  CHECK(errors(moe).empty());
  dense.model.quantization->ignore_patterns.push_back("mlp\\.(gate");
  const auto bad = errors(dense);
  REQUIRE(bad.size() == 1);
  CHECK(
      bad[0].starts_with("model.quantization.ignore_patterns: \"mlp\\.(gate\" is not a regular expression"));
}

TEST_CASE("support: values the trainer does not implement are errors naming the field") {
  primecfg::SFTConfig cfg;
  cfg.model.compile = std::nullopt;
  cfg.model.cp = 2;
  cfg.model.ep = 4;
  cfg.model.lora = primecfg::LoraConfig{};
  // Fields declared for prime-rl's sake that the trainer does not implement.
  cfg.model.attn = primecfg::Attention::flash_attention_4;
  cfg.model.ep_comm_backend = primecfg::EpCommBackend::deepep;
  cfg.trace_path = "trace.json";
  cfg.matmul_precision = primecfg::MatmulPrecision::highest;
  cfg.env_vars["A"] = "1";
  cfg.ckpt = primecfg::CheckpointConfig{};
  cfg.ckpt->skip_dataloader = true;
  primecfg::provenance_map where;
  where["model.cp"] = primecfg::provenance::in_file("a.toml", 3, 1);
  auto diags = check_support(cfg, where);
  auto has = [&](std::string_view path) {
    for (const auto& d : diags)
      if (d.path == path && d.level == primecfg::severity::error) return true;
    return false;
  };
  CHECK(has("model.cp"));
  CHECK(has("model.ep"));
  CHECK(has("model.lora"));
  for (const char* path : {"model.attn", "model.ep_comm_backend", "trace_path", "matmul_precision",
                           "env_vars", "ckpt.skip_dataloader"})
    CHECK_MESSAGE(has(path), path);
  for (const auto& d : diags)
    if (d.path == "model.cp") CHECK(d.where.to_string() == "a.toml:3:1");
  // prime-rl settings declared later: refused where set to what the trainer does not do.
  primecfg::SFTConfig later;
  later.model.compile = std::nullopt;
  later.val = primecfg::SFTValConfig{};
  later.run.name = "exp";
  later.log.json_logging = true;
  later.log.log_data = true;
  later.monitors.file->path = "elsewhere.jsonl";
  std::get<primecfg::SFTDataConfig>(later.data).subsets = std::vector<std::string>{"a"};
  auto later_diags = check_support(later, {});
  auto later_has = [&](std::string_view path) {
    for (const auto& d : later_diags)
      if (d.path == path && d.level == primecfg::severity::error) return true;
    return false;
  };
  for (const char* path :
       {"val", "run.name", "log.json_logging", "log.log_data", "monitors.file.path", "data.subsets"})
    CHECK_MESSAGE(later_has(path), path);
  later.monitors.file = std::nullopt;
  later_diags = check_support(later, {});
  CHECK(later_has("monitors.file"));
  // A fake-data seed or generated samples are refused too.
  primecfg::SFTConfig fake;
  fake.model.compile = std::nullopt;
  primecfg::FakeDataConfig generated;
  generated.seed = 3;
  generated.generate_samples = true;
  fake.data = generated;
  later_diags = check_support(fake, {});
  CHECK(later_has("data.seed"));
  CHECK(later_has("data.generate_samples"));
  // The defaults themselves are fine.
  primecfg::SFTConfig plain;
  plain.model.compile = std::nullopt;
  for (const auto& d : check_support(plain, {})) CHECK(d.level != primecfg::severity::error);
}
