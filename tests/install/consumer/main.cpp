// A program of another trainer: its own config struct around primecfg's
// ModelConfig, built against an installed primecfg (or the subproject).
#include <primecfg/cli.hpp>
#include <primecfg/help.hpp>
#include <primecfg/model.hpp>
#include <primecfg/report.hpp>

#include <cstdio>
#include <string>
#include <vector>

struct MyTrainerConfig {
  primecfg::ModelConfig model = {};
  std::int64_t steps = 10;

  static constexpr auto fields() {
    return primecfg::describe(primecfg::field(&MyTrainerConfig::model, "The model."),
                              primecfg::field(&MyTrainerConfig::steps, "Steps to run.", primecfg::ge(1)));
  }
};

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  auto cfg = primecfg::load_command_line<MyTrainerConfig>(args);
  if (cfg.help_requested) {
    std::printf("usage: consumer [@ FILE...] [--key=value...]\n\n%s",
                primecfg::help_text<MyTrainerConfig>().c_str());
    return 0;
  }
  if (!cfg.ok()) {
    std::fputs(primecfg::format_text(cfg.diagnostics, "MyTrainerConfig").c_str(), stderr);
    return 1;
  }
  primecfg::visit_offload(cfg.value.model.offload, [&]<class Strategy>(Strategy) {
    std::printf("steps=%lld strategy=%s\n", static_cast<long long>(cfg.value.steps), Strategy::name.data());
  });
  return 0;
}
