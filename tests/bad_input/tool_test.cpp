// Bad input through the command-line tools, as a user meets it: exit codes
// (primecfg: 0 valid, 1 invalid, 2 usage or unreadable; primecfg-migrate:
// 0 done or nothing to do, 1 --check needs work, 2 error), a message on
// stderr, no crash, no hang, and files that fail are never written.
#include "helpers.hpp"

#include <sys/stat.h>

#include <string>
#include <vector>

namespace {

using bad::expect_exit;
using bad::run;

std::string big_comment_file(const bad::scratch& tmp, std::size_t mib) {
  std::string line = "# " + std::string(97, 'x') + "\n";
  return tmp.file("big.toml", "[model]\n" + bad::repeat(line, mib * 1024 * 1024 / line.size() + 1));
}

bad::run_result validate(std::vector<std::string> args, bool as_sft = true) {
  std::vector<std::string> argv = {bad::tool("PRIMECFG"), "validate"};
  if (as_sft) argv.insert(argv.end(), {"--as", "sft"});
  argv.insert(argv.end(), args.begin(), args.end());
  return run(argv);
}

bad::run_result migrate(std::vector<std::string> args) {
  std::vector<std::string> argv = {bad::tool("PRIMECFG_MIGRATE")};
  argv.insert(argv.end(), args.begin(), args.end());
  return run(argv);
}

}  // namespace

TEST_CASE("primecfg validate: invalid configs exit 1 with compiler-style errors") {
  bad::scratch tmp;
  struct bad_case {
    const char* name;
    std::string text;
    const char* words;
  };
  std::vector<bad_case> cases = {
      {"malformed", "[model\nname = 1\n", "[toml_syntax]"},
      {"wrong type", "max_steps = \"ten\"\n", "[int_type]"},
      {"unknown key", "[model]\nnmae = \"x\"\n", "did you mean 'name'?"},
      {"retired key", "[model]\noptim_cpu_offload = false\n", "primecfg-migrate"},
      {"invalid enum", "[model]\noffload = \"ful\"\n", "[literal_error]"},
      {"out of range", "max_steps = -5\n", "[greater_than_equal]"},
      {"beyond int64", "max_steps = 9223372036854775808\n", "64 bits"},
      {"nan", "[optim]\nlr = nan\n", "[finite_number]"},
      {"inf", "[optim]\nlr = -inf\n", "[finite_number]"},
      {"duplicate key", "max_steps = 1\nmax_steps = 2\n", "[toml_syntax]"},
      {"duplicate table", "[model]\n[model]\n", "[toml_syntax]"},
      {"not UTF-8", "[model]\nname = \"\xff\"\n", "utf-8"},
      {"deep arrays", "a = " + bad::repeat("[", 10000) + bad::repeat("]", 10000) + "\n", "nested"},
      {"deep inline tables", "a = " + bad::repeat("{b = ", 10000) + "1" + bad::repeat("}", 10000) + "\n",
       "nested"},
      {"deep table header", "[eval" + bad::repeat(".a", 300000) + "]\n", "nested"},
      {"deep dotted key", "eval" + bad::repeat(".a", 300000) + " = 1\n", "nested"},
  };
  for (const bad_case& c : cases) {
    std::string name = c.name;
    CAPTURE(name);
    std::string path = tmp.file("bad.toml", c.text);
    auto r = validate({path});
    expect_exit(r, 1);
    CHECK(bad::contains(r.err, path + ":"));
    CHECK(bad::contains(r.err, c.words));
    CHECK(bad::contains(r.err, "error"));
    // the type is inferred when --as is left out: the same answer
    expect_exit(validate({path}, false), 1);
  }
}

TEST_CASE("primecfg validate: JSON errors for tools") {
  bad::scratch tmp;
  auto r = validate({tmp.file("bad.toml", "[model]\noffload = \"ful\"\n"), "--errors=json"});
  expect_exit(r, 1);
  CHECK(bad::contains(r.out, "\"kind\" : \"literal_error\""));  // machine output: stdout
  CHECK(bad::contains(r.err, "1 error in SFTConfig"));
}

TEST_CASE("primecfg validate: files that cannot be read exit 2") {
  bad::scratch tmp;
  std::string big = big_comment_file(tmp, 50);
  expect_exit(validate({big}), 2);
  expect_exit(validate({big}, false), 2);  // inference does not parse it either
  auto zero = validate({"/dev/zero"}, false);
  expect_exit(zero, 2);
  CHECK(bad::contains(zero.err, "/dev/zero: error: is a character device, not a regular file"));
  auto dir = validate({tmp.dir().string()});
  expect_exit(dir, 2);
  CHECK(bad::contains(dir.err, "is a directory"));
  expect_exit(validate({(tmp.dir() / "missing.toml").string()}), 2);
  auto mem = validate({"/proc/self/mem"}, false);
  expect_exit(mem, 2);
  CHECK(bad::contains(mem.err, "read failed"));
  auto at = validate({"@", (tmp.dir() / "missing.toml").string()});
  expect_exit(at, 2);
  CHECK(bad::contains(at.err, "missing.toml"));
  if (bad::permissions_bind()) {
    std::string locked = tmp.file("locked.toml", "max_steps = 1\n");
    ::chmod(locked.c_str(), 0);
    expect_exit(validate({locked}), 2);
  }
}

TEST_CASE("primecfg validate: an empty file is the default config") {
  bad::scratch tmp;
  std::string empty = tmp.file("empty.toml", "");
  expect_exit(validate({empty}), 0);
  expect_exit(validate({empty}, false), 0);
}

TEST_CASE("primecfg validate: a FIFO or a device as a config file exits 2 at once, naming it") {
  bad::scratch tmp;
  std::string fifo = (tmp.dir() / "config.fifo").string();
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  for (bool as_sft : {true, false}) {  // inferring the root type does not open it either
    auto r = validate({"@", fifo}, as_sft);
    expect_exit(r, 2);
    CHECK(bad::contains(r.err, fifo + ": error: is a FIFO (named pipe), not a regular file"));
  }
  for (const char* device : {"/dev/null", "/dev/stdin", "/dev/tty"}) {
    if (::access(device, F_OK) != 0) continue;
    auto r = validate({device});
    INFO(device);
    expect_exit(r, 2);
    CHECK(bad::contains(r.err, "not a regular file"));
  }
}

TEST_CASE("primecfg: a failed write of its output is an error and exit 2, never an abort or a silent 0") {
  bad::scratch tmp;
  std::string ok = tmp.file("ok.toml", "max_steps = 10\n");
  std::string primecfg = bad::tool("PRIMECFG");
  std::vector<std::vector<std::string>> commands = {
      {primecfg, "dump", "--as", "sft", ok},     {primecfg, "dump", "--as", "sft", ok, "--format=json"},
      {primecfg, "validate", "--as", "sft", ok}, {primecfg, "schema", "--as", "rl"},
      {primecfg, "help", "--as", "sft"},         {primecfg, "reference"},
  };
  for (const auto& command : commands) {
    CAPTURE(command[1]);
    auto r = run(command, "/dev/full");
    expect_exit(r, 2);
    CHECK(bad::contains(r.err, "primecfg: error: cannot write to standard output"));
  }
  // schema --out-dir into a folder that cannot hold the files: the folder is named
  auto r = run({primecfg, "schema", "--out-dir", (tmp.dir() / "missing" / "deeper").string()});
  expect_exit(r, 2);
  CHECK(bad::contains(r.err, "primecfg: error: --out-dir " + (tmp.dir() / "missing" / "deeper").string() +
                                 ": No such file or directory"));
}

TEST_CASE("primecfg validate: flags that name no field or a section exit 1") {
  bad::scratch tmp;
  std::string ok = tmp.file("ok.toml", "max_steps = 10\n");
  expect_exit(validate({ok}), 0);
  struct flag_case {
    std::vector<std::string> args;
    const char* words;
  };
  std::vector<flag_case> cases = {
      {{"--model.nmae=x"}, "did you mean '--model.name'?"},
      // the suggestion spelled as the flag was: dashes for dashes, underscores for underscores
      {{"--data.seq-lenn=5"}, "did you mean '--data.seq-len'?"},
      {{"--data.seq_lenn=5"}, "did you mean '--data.seq_len'?"},
      {{"--frobnicate"}, "names no config field"},
      {{"--model"}, "is a section"},
      {{"--optim.lr"}, "needs a value"},
      {{"--optim.lr=fast"}, "[float_type]"},
      {{"--max-steps=5\nx = 1"}, "[int_type]"},
      {{"--model.name=\xff"}, "UTF-8"},
      {{"@"}, "must be followed by a file"},
  };
  for (const flag_case& c : cases) {
    std::vector<std::string> args = {ok};
    args.insert(args.end(), c.args.begin(), c.args.end());
    CAPTURE(args.back());
    auto r = validate(args);
    expect_exit(r, 1);
    CHECK(bad::contains(r.err, c.words));
  }
}

TEST_CASE("primecfg: usage errors exit 2") {
  expect_exit(run({bad::tool("PRIMECFG")}), 2);
  expect_exit(run({bad::tool("PRIMECFG"), "validate"}), 2);
  expect_exit(run({bad::tool("PRIMECFG"), "validate", "--as"}), 2);
  expect_exit(run({bad::tool("PRIMECFG"), "validate", "--as", "ppo", "x.toml"}), 2);
  expect_exit(run({bad::tool("PRIMECFG"), "validate", "--errors=yaml", "x.toml"}), 2);
}

TEST_CASE("primecfg-migrate: bad input exits 2 and leaves the file as it was") {
  bad::scratch tmp;
  struct bad_case {
    const char* name;
    std::string text;
    const char* words;
  };
  std::vector<bad_case> cases = {
      {"malformed", "[model\noptim_cpu_offload = false\n", "not valid TOML"},
      {"duplicate key", "[model]\noptim_cpu_offload = false\noptim_cpu_offload = true\n", "not valid TOML"},
      {"duplicate table", "[model]\noptim_cpu_offload = false\n[model]\n", "not valid TOML"},
      {"not UTF-8", "[model]\noptim_cpu_offload = false\nname = \"\xff\"\n", "not valid TOML"},
      {"beyond int64", "[model]\noptim_cpu_offload = false\nx = 9223372036854775808\n", "not valid TOML"},
      {"deep arrays", "a = " + bad::repeat("[", 10000) + bad::repeat("]", 10000) + "\n", "not valid TOML"},
      {"deep inline tables", "a = " + bad::repeat("{b = ", 10000) + "1" + bad::repeat("}", 10000) + "\n",
       "nested"},
      {"deep table header", "[model" + bad::repeat(".a", 300000) + "]\n", "nested"},
      {"deep dotted key", "model" + bad::repeat(".a", 300000) + " = 1\n", "nested"},
      {"new and old key", "[model]\noffload = \"none\"\noptim_cpu_offload = false\n", "error"},
      {"invalid result", "[model]\noptim_cpu_offload = false\nnmae = \"x\"\n", "not a valid"},
  };
  for (const bad_case& c : cases) {
    std::string name = c.name;
    CAPTURE(name);
    std::string path = tmp.file("old.toml", c.text);
    for (std::string mode : {"--check", "--in-place", "--diff"}) {
      CAPTURE(mode);
      std::vector<std::string> args = {path};
      if (mode != "--diff") args.insert(args.begin(), mode);
      auto r = migrate(args);
      expect_exit(r, 2);
      CHECK(bad::contains(r.err, c.words));
      CHECK(bad::read_all(path) == c.text);
    }
  }
}

TEST_CASE("primecfg-migrate: files that cannot be read exit 2") {
  bad::scratch tmp;
  std::string big = big_comment_file(tmp, 50);
  auto r = migrate({big});
  expect_exit(r, 2);
  CHECK(bad::contains(r.err, "16 MiB"));
  expect_exit(migrate({"/dev/zero"}), 2);
  expect_exit(migrate({tmp.dir().string()}), 2);
  expect_exit(migrate({(tmp.dir() / "missing.toml").string()}), 2);
  auto mem = migrate({"/proc/self/mem"});
  expect_exit(mem, 2);
  CHECK(bad::contains(mem.err, "read failed"));
  expect_exit(migrate({"--in-place", "/proc/self/mem"}), 2);
}

TEST_CASE("primecfg-migrate: an empty file needs nothing and is not written") {
  bad::scratch tmp;
  std::string empty = tmp.file("empty.toml", "");
  struct stat before {};
  ::stat(empty.c_str(), &before);
  auto r = migrate({"--in-place", empty});
  expect_exit(r, 0);
  CHECK(r.out.empty());
  expect_exit(migrate({"--check", empty}), 0);
  struct stat after {};
  ::stat(empty.c_str(), &after);
  CHECK(after.st_ino == before.st_ino);  // not replaced by a rename
  CHECK(bad::read_all(empty).empty());
}

TEST_CASE("primecfg-migrate: usage errors exit 2") {
  expect_exit(migrate({}), 2);
  expect_exit(migrate({"--frobnicate", "x.toml"}), 2);
  expect_exit(migrate({"--as=ppo", "x.toml"}), 2);
  expect_exit(migrate({"--fsdp-as=none", "x.toml"}), 2);
  expect_exit(migrate({"--check", "--in-place", "x.toml"}), 2);
}
