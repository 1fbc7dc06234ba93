#include "distributed/launch.hpp"

#include <fmt/format.h>

#include <charconv>
#include <cstdlib>
#include <stdexcept>
#include <string_view>

namespace primecfg::train {

namespace {

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? v : nullptr;
}

int int_var(const char* name, int fallback, int lo, int hi) {
  const char* v = env(name);
  if (!v) return fallback;
  int n = 0;
  const std::string_view s(v);
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), n);
  if (ec != std::errc() || end != s.data() + s.size() || n < lo || n > hi)
    throw launch_error(
        fmt::format("{}={}: the launcher's variable must be an integer in [{}, {}]", name, v, lo, hi));
  return n;
}

}  // namespace

Launch Launch::from_environment() {
  Launch l;
  l.world = int_var("WORLD_SIZE", 1, 1, 1 << 20);
  if (l.world == 1 && !env("RANK")) return l;
  l.launched = true;
  l.rank = int_var("RANK", -1, 0, l.world - 1);
  if (l.rank < 0) throw launch_error(fmt::format("WORLD_SIZE={} is set but RANK is not", l.world));
  l.local_world = int_var("LOCAL_WORLD_SIZE", l.world, 1, l.world);
  l.local_rank = int_var("LOCAL_RANK", l.rank % l.local_world, 0, l.local_world - 1);
  if (const char* a = env("MASTER_ADDR")) l.master_addr = a;
  l.master_port = int_var("MASTER_PORT", 29500, 1, 65535);
  if (const char* a = env("TORCHELASTIC_USE_AGENT_STORE")) {
    const std::string_view s(a);
    if (s != "True" && s != "true" && s != "1" && s != "False" && s != "false" && s != "0")
      throw launch_error(fmt::format("TORCHELASTIC_USE_AGENT_STORE={}: must be True or False", a));
    l.agent_store = s == "True" || s == "true" || s == "1";
  }
  l.attempt = int_var("TORCHELASTIC_RESTART_COUNT", 0, 0, 1 << 20);
  if (const char* a = env("GLOO_SOCKET_IFNAME")) l.gloo_interfaces = a;
  if (const char* a = env("TORCHELASTIC_RUN_ID"); a && std::string_view(a) != "none") l.job_id = a;
  return l;
}

}  // namespace primecfg::train
