// Parse + validate time of real configs: loads each file many times and
// prints microseconds per load, next to a bare toml++ parse of the same text.
#include <primecfg/load.hpp>
#include <primecfg/rl.hpp>
#include <primecfg/sft.hpp>

#include <fmt/format.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <string>

namespace {

template <class F>
double microseconds_per_call(F&& f, int iterations) {
  auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < iterations; ++i) f();
  std::chrono::duration<double, std::micro> elapsed = std::chrono::steady_clock::now() - start;
  return elapsed.count() / iterations;
}

template <class T>
void row(const std::string& path, int iterations) {
  std::ifstream in(path);
  std::stringstream buffer;
  buffer << in.rdbuf();
  std::string text = buffer.str();
  bool ok = true;
  double load_us = microseconds_per_call(
      [&] {
        primecfg::sources src;
        src.add_text(path, text);
        ok = primecfg::load<T>(src).ok() && ok;
      },
      iterations);
  double parse_us = microseconds_per_call(
      [&] { (void)toml::parse(std::string_view(text), std::string_view(path)); }, iterations);
  fmt::print("| {} | {} | {:.1f} | {:.1f} | {} |\n", path.substr(path.rfind("prime-rl-configs/") + 17),
             text.size(), parse_us, load_us, ok ? "valid" : "INVALID");
}

}  // namespace

int main(int argc, char** argv) {
  std::string corpus = argc > 1 ? argv[1] : "tests/corpus/prime-rl-configs";
  int iterations = argc > 2 ? std::stoi(argv[2]) : 2000;
  fmt::print(
      "| file | bytes | toml++ parse (us) | primecfg load + validate (us) | result |\n| --- | --- | --- | "
      "--- | --- |\n");
  row<primecfg::SFTConfig>(corpus + "/559b44772/configs/debug/fake/sft.toml", iterations);
  row<primecfg::SFTConfig>(corpus + "/559b44772/configs/basic/reverse-text/sft.toml", iterations);
  row<primecfg::RLConfig>(corpus + "/559b44772/examples/advanced/glm-5.2/swe.toml", iterations);
  row<primecfg::RLConfig>(corpus + "/559b44772/examples/basic/reverse-text/rl.toml", iterations);
}
