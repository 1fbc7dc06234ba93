// Helpers of the bad-input suite: scratch files, and running the tools with a
// watchdog so that a hang fails the test instead of stalling the suite.
#pragma once

#include <doctest/doctest.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace bad {

namespace fs = std::filesystem;

// A fresh folder under $TMPDIR, removed at the end of the test.
class scratch {
 public:
  scratch() {
    std::string tmpl = (fs::temp_directory_path() / "primecfg-bad-XXXXXX").string();
    if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    dir_ = tmpl;
  }
  ~scratch() {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  scratch(const scratch&) = delete;
  scratch& operator=(const scratch&) = delete;

  const fs::path& dir() const { return dir_; }

  // Writes `bytes` to dir/name and returns the path.
  std::string file(const std::string& name, const std::string& bytes) const {
    fs::path p = dir_ / name;
    std::ofstream out(p, std::ios::binary);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (!out) throw std::runtime_error("cannot write " + p.string());
    return p.string();
  }

 private:
  fs::path dir_;
};

inline std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline std::string repeat(const std::string& s, std::size_t n) {
  std::string out;
  out.reserve(s.size() * n);
  for (std::size_t i = 0; i < n; ++i) out += s;
  return out;
}

// Generous: only a hang trips it. Times are measured and reported in
// docs/reliability.md, never asserted.
inline constexpr std::chrono::seconds watchdog{20};

struct run_result {
  int exit_code = -1;  // when the process exited
  int signal = 0;      // when a signal ended it
  bool timed_out = false;
  std::string out, err;
};

// Runs `args` (args[0] is the program), stdin from /dev/null; stdout to
// `stdout_path` when given (then r.out is empty), e.g. /dev/full.
inline run_result run(const std::vector<std::string>& args, const std::string& stdout_path = {}) {
  scratch io;
  std::string out_path = stdout_path.empty() ? (io.dir() / "out").string() : stdout_path;
  std::string err_path = (io.dir() / "err").string();
  pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    int in = ::open("/dev/null", O_RDONLY);
    int out = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    int err = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ::dup2(in, 0);
    ::dup2(out, 1);
    ::dup2(err, 2);
    std::vector<char*> argv;
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  run_result r;
  auto deadline = std::chrono::steady_clock::now() + watchdog;
  int status = 0;
  while (true) {
    pid_t done = ::waitpid(pid, &status, WNOHANG);
    if (done == pid) break;
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      r.timed_out = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (!r.timed_out) {
    if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
    if (WIFSIGNALED(status)) r.signal = WTERMSIG(status);
  }
  if (stdout_path.empty()) r.out = read_all(out_path);
  r.err = read_all(err_path);
  return r;
}

// The program a test runs, from the environment the suite sets.
inline std::string tool(const char* variable) {
  const char* p = std::getenv(variable);
  REQUIRE_MESSAGE(p != nullptr, variable, " is not set (run the suite through meson test)");
  return p;
}

// Ended by itself with `code`, within the watchdog, and said something on
// stderr (errors) without a sanitizer report.
inline void expect_exit(const run_result& r, int code) {
  INFO("stdout: ", r.out);
  INFO("stderr: ", r.err);
  REQUIRE_FALSE(r.timed_out);
  REQUIRE(r.signal == 0);
  CHECK(r.exit_code == code);
  CHECK(r.err.find("AddressSanitizer") == std::string::npos);
  CHECK(r.err.find("runtime error:") == std::string::npos);
  if (code != 0) CHECK_FALSE(r.err.empty());
}

inline bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

// Whether this process can be denied reading a file by its permissions
// (root reads files whatever their mode).
inline bool permissions_bind() { return ::geteuid() != 0; }

}  // namespace bad
