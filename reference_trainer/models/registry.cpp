// The architectures (model/architecture.hpp): one line per architecture in the product,
// beside models/blocks.cpp's line for its block.
#include "model/architecture.hpp"
#include "model/config.hpp"
#include "models/llama/spec.hpp"
#include "models/qwen3_moe/spec.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <mutex>
#include <stdexcept>

namespace primecfg::train {

namespace {

std::vector<const Architecture*> product() { return {&llama_architecture(), &qwen3_moe_architecture()}; }

std::mutex& added_mutex() {
  static std::mutex m;
  return m;
}
std::vector<const Architecture*>& added() {
  static std::vector<const Architecture*> a;
  return a;
}

}  // namespace

std::vector<const Architecture*> architectures() {
  std::vector<const Architecture*> all = product();
  const std::lock_guard lock(added_mutex());
  all.insert(all.end(), added().begin(), added().end());
  return all;
}

const Architecture* find_architecture(std::string_view model_type) {
  for (const Architecture* a : architectures()) {
    const auto types = a->model_types();
    if (std::find(types.begin(), types.end(), model_type) != types.end()) return a;
  }
  return nullptr;
}

const Architecture* find_architecture_named(std::string_view name) {
  for (const Architecture* a : architectures())
    if (a->name() == name) return a;
  return nullptr;
}

void add_architecture(const Architecture& a) {
  if (find_architecture_named(a.name()))
    throw std::logic_error(fmt::format("add_architecture: \"{}\" is taken", a.name()));
  for (std::string_view t : a.model_types())
    if (find_architecture(t))
      throw std::logic_error(fmt::format("add_architecture: model_type \"{}\" is taken", t));
  const std::lock_guard lock(added_mutex());
  added().push_back(&a);
}

std::int64_t Architecture::block_active_matmul_params(const ModelArgs& a, int layer) const {
  std::vector<ParamShape> ps;
  block_params(a, layer, ps);
  std::int64_t n = 0;
  for (const auto& p : ps)
    if (p.is_matrix()) n += p.numel();
  return n;
}

double Architecture::block_param_count(const ModelArgs& a, int layer) const {
  std::vector<ParamShape> ps;
  block_params(a, layer, ps);
  double n = 0;
  for (const auto& p : ps) n += static_cast<double>(p.rows) * static_cast<double>(p.cols);
  return n;
}

std::optional<HfSlice> Architecture::hf_fused_source(const ModelArgs&, std::string_view) const {
  return std::nullopt;
}

bool Architecture::is_router(std::string_view) const { return false; }

std::string Architecture::linear_module(std::string_view weight) const {
  constexpr std::string_view suffix = ".weight";
  if (weight.ends_with(suffix)) weight.remove_suffix(suffix.size());
  return std::string(weight);
}

}  // namespace primecfg::train
