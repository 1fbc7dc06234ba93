// strict_json (reference_trainer/base/strict_json.hpp): nlohmann/json read strictly.
// Each refusal is checked with its place (line, column), and again through the
// readers that use it (config.json, JSONL, safetensors headers, manifest.json),
// which must name the file and, where there is one, the key.
#include "base/remove_tree.hpp"
#include "base/safetensors.hpp"
#include "base/strict_json.hpp"
#include "checkpoint/dir.hpp"
#include "data/loader.hpp"
#include "model/config.hpp"

#include <doctest/doctest.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>

namespace fs = std::filesystem;
namespace train = primecfg::train;
namespace json = primecfg::train::strict_json;

namespace {

fs::path temp_dir(const char* name) {
  auto d = fs::temp_directory_path() / ("primecfg-strict-json-test-" + std::to_string(::getpid())) / name;
  primecfg::train::remove_tree(d);
  fs::create_directories(d);
  return d;
}

// doctest::Contains takes a C string.
doctest::Contains contains(const std::string& s) { return doctest::Contains(s.c_str()); }

void refused(const std::string& text, const std::string& what, const std::string& where) {
  CAPTURE(text);
  CHECK_THROWS_WITH_AS(json::parse(text), contains(what), json::error);
  CHECK_THROWS_WITH_AS(json::parse(text), contains(" at " + where), json::error);
}

}  // namespace

TEST_CASE("strict_json: values and escapes") {
  auto v = json::parse(R"({"a": [1, 2.5, -3e2], "s": "x\"\u00e9\ud83d\ude00", "t": true, "n": null})");
  CHECK(json::integer(v["a"][0]) == 1);
  CHECK(v["a"][1].get<double>() == 2.5);
  CHECK(json::integer(v["a"][2]) == -300);
  CHECK(v["s"] == "x\"\xc3\xa9\xf0\x9f\x98\x80");
  CHECK(v["t"] == true);
  CHECK(v["n"].is_null());
  CHECK(json::find(v, "a"));
  CHECK_FALSE(json::find(v, "b"));
  CHECK_FALSE(json::find(v["a"], "a"));
  CHECK(json::parse(" {} \n").is_object());
  CHECK(json::parse("\"\\u0000\"").get<std::string>() == std::string(1, '\0'));
}

TEST_CASE("strict_json: a key twice in one object is an error naming the key and where it is") {
  refused("{\"a\": 1,\n  \"a\": 2}", "duplicate key \"a\"", "line 2, column 3");
  refused(R"({"a": 1, "\u0061": 2})", "duplicate key \"a\"", "line 1, column 10");  // the same key escaped
  refused(R"({"x": {"a\"b": 1, "a\"b": 2}})", "duplicate key \"a\\\"b\"", "line 1, column 19");
  // The same key in different objects is fine.
  CHECK(json::parse(R"({"a": {"a": 1}, "b": [{"a": 1}, {"a": 2}]})").size() == 2);
}

TEST_CASE("strict_json: numbers beyond a double or 64 bits are errors, not infinity or a rounded value") {
  refused("[1e400]", "number overflow", "line 1, column 2");
  refused("{\"x\":\n -1e400}", "number overflow", "line 2");
  refused("[1, 18446744073709551616]", "integer 18446744073709551616 does not fit in 64 bits",
          "line 1, column 5");
  refused("-9223372036854775809", "does not fit in 64 bits", "line 1, column 1");
  refused("NaN", "invalid literal", "line 1, column 1");
  refused("[Infinity]", "invalid literal", "line 1, column 2");
  refused("[-Infinity]", "invalid", "line 1");
  // The 64-bit extremes are read exactly.
  CHECK(json::parse("18446744073709551615").get<std::uint64_t>() ==
        std::numeric_limits<std::uint64_t>::max());
  CHECK(json::integer(json::parse("-9223372036854775808")) == std::numeric_limits<std::int64_t>::min());
  CHECK(json::parse("1e-400").get<double>() == 0.0);  // underflow is zero, as in every JSON reader
}

TEST_CASE("strict_json: text that is not UTF-8, and lone surrogates, are errors") {
  refused("\"\xff\"", "ill-formed UTF-8", "line 1, column 2");
  refused("{\"k\": \"ok\",\n \"\xc0\xaf\": 1}", "ill-formed UTF-8", "line 2");  // overlong '/'
  refused("\"\xed\xa0\x80\"", "ill-formed UTF-8", "line 1");                    // a surrogate in UTF-8
  refused("\"\xf4\x90\x80\x80\"", "ill-formed UTF-8", "line 1");                // above U+10FFFF
  refused(R"(["\ud800"])", "surrogate U+D800..U+DBFF must be followed by U+DC00..U+DFFF", "line 1");
  refused(R"("\udc00")", "surrogate U+DC00..U+DFFF must follow U+D800..U+DBFF", "line 1");
  refused(R"("\ud83d\u0041")", "surrogate", "line 1");
  refused("\"a\tb\"", "control character U+0009", "line 1, column 3");
  // The lexer's "last read" quote in the message is escaped, so the message itself is UTF-8.
  try {
    json::parse("\"\xff\"");
  } catch (const json::error& e) {
    CHECK(std::string(e.what()).find("\\xFF") != std::string::npos);
  }
}

TEST_CASE("strict_json: text after the value, a byte order mark, comments are errors") {
  refused("{} x", "expected end of input", "line 1, column 4");
  refused("{}{}", "expected end of input", "line 1, column 3");
  refused("1 2", "expected end of input", "line 1, column 3");
  refused("\xEF\xBB\xBF{}", "byte order mark", "line 1, column 1");
  refused("// c\n{}", "invalid literal", "line 1, column 1");
  refused("{\"a\": 1 /* c */}", "invalid literal", "line 1");
  refused("", "unexpected end of input", "line 1, column 1");
  refused("[1, 2", "unexpected end of input", "line 1, column 6");
  refused("{\"a\": }", "unexpected '}'", "line 1, column 7");
  refused("[1,]", "unexpected ']'", "line 1, column 4");
  // json.cpp took these (strtod); nlohmann, like RFC 8259, does not.
  refused("01", "expected end of input", "line 1");
  refused("+1", "invalid literal", "line 1");
  refused("[1.]", "invalid number", "line 1");
}

TEST_CASE("strict_json: nesting deeper than 256 is an error") {
  const auto nested = [](std::size_t n) { return std::string(n, '[') + std::string(n, ']'); };
  CHECK(json::parse(nested(json::max_depth)).is_array());
  refused(nested(json::max_depth + 1), "nested more than 256 deep", "line 1, column 257");
  refused(std::string(100000, '['), "nested more than 256 deep", "line 1, column 257");
}

TEST_CASE("strict_json: integer() takes integral values only, within int64") {
  CHECK(json::integer(json::parse("7")) == 7);
  CHECK(json::integer(json::parse("2.0")) == 2);
  CHECK(json::integer(json::parse("1e3")) == 1000);
  CHECK(json::integer(json::parse("9223372036854775807")) == std::numeric_limits<std::int64_t>::max());
  CHECK_FALSE(json::integer(json::parse("9223372036854775808")));  // an unsigned 64-bit value above int64
  CHECK_FALSE(json::integer(json::parse("1.5")));
  CHECK_FALSE(json::integer(json::parse("1e300")));
  CHECK_FALSE(json::integer(json::parse("true")));
  CHECK_FALSE(json::integer(json::parse("\"1\"")));
  CHECK_FALSE(json::integer(json::parse("null")));
}

TEST_CASE("strict_json: dump writes keys in order, non-finite numbers as null, and refuses bad UTF-8") {
  const json::ordered v = {{"z", 1},
                           {"a", std::nan("")},
                           {"m", std::numeric_limits<double>::infinity()},
                           {"f", 10000.0},
                           {"s", "\"\\\n\x01\xc3\xa9"}};
  CHECK(json::dump(v) == R"({"z":1,"a":null,"m":null,"f":10000.0,"s":"\"\\\n\u0001é"})");
  CHECK(json::parse(json::dump(v))["s"] == "\"\\\n\x01\xc3\xa9");
  CHECK_THROWS_WITH_AS(json::dump(json::ordered{{"k", "\xff"}}), doctest::Contains("not valid UTF-8"),
                       json::error);
  CHECK_THROWS_AS(json::dump(json::ordered{{"\xff", 1}}), json::error);
}

TEST_CASE("strict_json in the readers: the file, the place and the key are named") {
  const std::string good =
      R"({"model_type": "qwen3", "vocab_size": 64, "hidden_size": 32, "num_hidden_layers": 2,
 "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 48)";
  auto config = [&](const std::string& extra) {
    return train::parse_hf_config(good + extra + "}", "m/config.json");
  };
  CHECK(config("").vocab_size == 64);
  CHECK_THROWS_WITH_AS(
      config(",\n \"hidden_size\": 64"),
      doctest::Contains("m/config.json: JSON: duplicate key \"hidden_size\" at line 3, column 2"),
      train::model_config_error);
  CHECK_THROWS_WITH_AS(config(", \"rms_norm_eps\": 1e400"),
                       doctest::Contains("m/config.json: JSON: number overflow"), train::model_config_error);
  CHECK_THROWS_WITH_AS(config(", \"bos_token_id\": 100000000000000000000"),
                       doctest::Contains("does not fit in 64 bits at line 2"), train::model_config_error);
  CHECK_THROWS_WITH_AS(config(", \"head_dim\": 9223372036854775808"),
                       doctest::Contains("m/config.json: \"head_dim\": must be a positive integer (found "
                                         "9223372036854775808)"),
                       train::model_config_error);
  CHECK_THROWS_WITH_AS(config(", \"head_dim\": 8.5"),
                       doctest::Contains("\"head_dim\": must be a positive integer"),
                       train::model_config_error);
  CHECK_THROWS_WITH_AS(config(", \"x\": \"\xff\""), doctest::Contains("m/config.json: JSON: syntax error"),
                       train::model_config_error);
  // Token ids are written back as they were read.
  const auto a = config(", \"eos_token_id\": [3, 4], \"bos_token_id\": 2.0");
  const auto written = json::parse(train::hf_config_json(a, "float32"));
  CHECK(json::dump(written["eos_token_id"]) == "[3,4]");
  CHECK(json::dump(written["bos_token_id"]) == "2.0");

  auto dir = temp_dir("readers");
  auto jsonl = [&](const std::string& second_line) {
    std::ofstream(dir / "d.jsonl") << "{\"input_ids\": [1, 2]}\n" << second_line << "\n";
    train::data::JsonlLimits limits;
    limits.vocab_size = 300;
    return train::data::make_jsonl(dir / "d.jsonl", false, 0, limits);
  };
  CHECK(jsonl("{\"input_ids\": [3, 4]}")->size() == 2);
  const std::string d2 = (dir / "d.jsonl").string() + ":2: ";
  CHECK_THROWS_WITH(jsonl(R"({"input_ids": [3, 4], "input_ids": [5, 6]})"),
                    contains(d2 + "JSON: duplicate key \"input_ids\" at line 1, column 23"));
  CHECK_THROWS_WITH(jsonl(R"({"input_ids": [3, 4.5]})"),
                    contains(d2 + "input_ids[1] = 4.5 is not an integer"));
  CHECK_THROWS_WITH(jsonl(R"({"input_ids": [3, 18446744073709551617]})"),
                    contains(d2 + "JSON: integer 18446744073709551617 does not fit in 64 bits"));
  CHECK_THROWS_WITH(jsonl(R"({"input_ids": [3, 4]} {})"), contains(d2 + "JSON: syntax error"));
  CHECK_THROWS_WITH(jsonl(R"({"prompt": [{"role": "user"}], "completion": "x"})"),
                    contains(d2 + "\"prompt\" and \"completion\" must be strings"));

  // A safetensors header: the same checks, named with the file.
  auto header_file = [&](const std::string& header) {
    std::ofstream out(dir / "h.safetensors", std::ios::binary);
    std::uint64_t n = header.size();
    out.write(reinterpret_cast<const char*>(&n), 8);
    out << header << std::string(8, '\0');
    out.close();
    return train::safetensors::file::open(dir / "h.safetensors");
  };
  CHECK(header_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})").tensors().size() == 1);
  CHECK_THROWS_WITH_AS(
      header_file(
          R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})"),
      doctest::Contains("h.safetensors: bad header: JSON: duplicate key \"a\" at line 1, column 55"),
      train::safetensors::error);
  CHECK_THROWS_WITH_AS(header_file(R"({"a":{"dtype":"F32","shape":[2.5],"data_offsets":[0,8]}})"),
                       doctest::Contains("tensor a: shape must be an array of integers"),
                       train::safetensors::error);
  CHECK_THROWS_WITH_AS(header_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8.5]}})"),
                       doctest::Contains("tensor a: data_offsets needs two integers"),
                       train::safetensors::error);
  CHECK_THROWS_WITH_AS(header_file(R"({"__metadata__":{"step":3}})"),
                       doctest::Contains("__metadata__ value \"step\" must be a string"),
                       train::safetensors::error);

  // manifest.json, as resume reads it.
  auto ckpt = dir / "step_3";
  fs::create_directories(ckpt);
  for (const char* f : {"model.safetensors", "config.json", "trainer_state.safetensors"})
    std::ofstream(ckpt / f) << f;
  train::write_manifest(ckpt, 3, false);
  CHECK(train::verify_checkpoint(ckpt, 3).files.size() == 3);
  std::string manifest;
  {
    std::ifstream in(ckpt / "manifest.json");
    manifest.assign(std::istreambuf_iterator<char>(in), {});
  }
  CHECK(manifest.rfind("{\n  \"format\": \"primecfg-checkpoint/1\",\n  \"step\": 3,\n  \"optimizer\": false,",
                       0) == 0);
  std::ofstream(ckpt / "manifest.json") << "{\"step\": 3,\n" << manifest.substr(1);
  CHECK_THROWS_WITH_AS(train::verify_checkpoint(ckpt, 3),
                       doctest::Contains("manifest.json: JSON: duplicate key \"step\" at line 4, column 3"),
                       train::checkpoint_error);
  std::ofstream(ckpt / "manifest.json") << manifest.substr(0, manifest.find("\"step\": 3")) << "\"step\": 3.5"
                                        << manifest.substr(manifest.find("\"step\": 3") + 9);
  CHECK_THROWS_WITH_AS(train::verify_checkpoint(ckpt, 3), doctest::Contains("\"step\" must be an integer"),
                       train::checkpoint_error);
  primecfg::train::remove_tree(dir);
}

TEST_CASE(
    "manifest: the sums of other ranks' files are taken as they summed them; a resume's ranks share the "
    "reading") {
  auto dir = temp_dir("manifest-parts");
  auto ckpt = dir / "step_5";
  fs::create_directories(ckpt);
  const std::vector<std::string> names = {
      "config.json", "model.safetensors", "optimizer-00000-of-00002.safetensors",
      "optimizer-00001-of-00002.safetensors", "trainer_state.safetensors"};
  for (const auto& f : names) std::ofstream(ckpt / f) << "bytes of " << f;
  // Rank 1 summed its piece: the manifest records that sum, without reading the file again.
  const std::string piece = "optimizer-00001-of-00002.safetensors";
  const train::Manifest::File real = train::sum_file(ckpt / piece);
  CHECK(real.xxh64.size() == 16);
  train::write_manifest(ckpt, 5, true, {{piece, {real.bytes, "00000000000000ab"}}});
  CHECK(train::verify_checkpoint(ckpt, 5, 0, 2).files.at(piece).xxh64 == "00000000000000ab");
  CHECK_THROWS_WITH_AS(
      train::write_manifest(ckpt, 5, true, {{piece, {real.bytes + 1, real.xxh64}}}),
      doctest::Contains((piece + ": " + std::to_string(real.bytes) + " bytes, its writer summed").c_str()),
      train::checkpoint_error);
  CHECK_THROWS_WITH_AS(train::write_manifest(ckpt, 5, true, {{"optimizer-00002-of-00002.safetensors", real}}),
                       doctest::Contains("summed by its writer, but not in the folder"),
                       train::checkpoint_error);
  train::write_manifest(ckpt, 5, true, {{piece, real}});
  // Changed after writing (same size): of two ranks, exactly the one whose share holds
  // the file finds it, whichever file it is; one rank alone always does.
  for (const auto& f : names) {
    CAPTURE(f);
    std::string text = "bytes of " + f;
    text[0] = 'B';
    std::ofstream(ckpt / f) << text;
    int found = 0;
    for (int part = 0; part < 2; ++part) {
      try {
        train::verify_checkpoint(ckpt, 5, part, 2);
      } catch (const train::checkpoint_error& e) {
        CHECK(std::string(e.what()).find(f + ": checksum") != std::string::npos);
        ++found;
      }
    }
    CHECK(found == 1);
    CHECK_THROWS_AS(train::verify_checkpoint(ckpt, 5), train::checkpoint_error);
    std::ofstream(ckpt / f) << "bytes of " << f;
    CHECK(train::verify_checkpoint(ckpt, 5).files.size() == names.size());
  }
  primecfg::train::remove_tree(dir);
}

TEST_CASE("the files the trainer writes: one JSON writer, keys in a fixed order") {
  auto dir = temp_dir("written");
  std::vector<float> a(2, 1.0f);
  train::safetensors::write(dir / "x.safetensors",
                            {{"w.z", train::safetensors::dtype::F32, {2}, a.data(), 8},
                             {"w.a", train::safetensors::dtype::F32, {2}, a.data(), 8}},
                            {{"format", "pt"}, {"note", "\"quoted\" \xc3\xa9"}});
  std::ifstream in(dir / "x.safetensors", std::ios::binary);
  std::uint64_t n = 0;
  in.read(reinterpret_cast<char*>(&n), 8);
  std::string header(n, '\0');
  in.read(header.data(), static_cast<std::streamsize>(n));
  CHECK(
      header.find(R"({"__metadata__":{"format":"pt","note":"\"quoted\" é"},"w.a":{"dtype":"F32","shape":[2],)"
                  R"("data_offsets":[0,8]},"w.z":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})") == 0);
  CHECK(header.size() % 8 == 0);
  // A name twice, or one that is not UTF-8, is an error naming the file; nothing half-written is read back.
  CHECK_THROWS_WITH_AS(train::safetensors::write(dir / "y.safetensors",
                                                 {{"w", train::safetensors::dtype::F32, {2}, a.data(), 8},
                                                  {"w", train::safetensors::dtype::F32, {2}, a.data(), 8}}),
                       doctest::Contains("y.safetensors: tensor w given twice"), train::safetensors::error);
  CHECK_THROWS_WITH_AS(
      train::safetensors::write(dir / "z.safetensors",
                                {{"\xff", train::safetensors::dtype::F32, {2}, a.data(), 8}}),
      doctest::Contains("z.safetensors: JSON: cannot write a string that is not valid UTF-8"),
      train::safetensors::error);

  const std::string cfg = train::hf_config_json(*train::preset("meta-llama/Llama-3.2-1B"), "bfloat16");
  CHECK(cfg.rfind("{\n  \"architectures\": [\n    \"LlamaForCausalLM\"\n  ],\n  \"model_type\": \"llama\",",
                  0) == 0);
  CHECK(cfg.find("\"rope_theta\": 500000.0,") != std::string::npos);
  CHECK(cfg.find("\"rope_type\": \"llama3\"") < cfg.find("\"factor\": 32.0"));
  CHECK(cfg.ends_with(",\n  \"torch_dtype\": \"bfloat16\"\n}\n"));
  primecfg::train::remove_tree(dir);
}
