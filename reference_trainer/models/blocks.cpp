// Each architecture's block (nn/block.hpp's make_block): one line per architecture in
// the product, beside models/registry.cpp's line for its description.
#include "model/architecture.hpp"
#include "models/llama/block.hpp"
#include "models/qwen3_moe/block.hpp"

#include <fmt/format.h>

#include <mutex>
#include <stdexcept>
#include <utility>
#include <vector>

namespace primecfg::train {

namespace {

template <class B>
std::unique_ptr<Block> make(const ModelArgs&, int layer, const ParamLookup& find) {
  return std::make_unique<B>(layer, find);
}

std::unique_ptr<Block> make_qwen3_moe(const ModelArgs& args, int layer, const ParamLookup& find) {
  return std::make_unique<Qwen3MoeBlock>(args, layer, find);
}

std::vector<std::pair<std::string_view, BlockMaker>> product() {
  return {{"llama", &make<LlamaBlock>}, {"qwen3_moe", &make_qwen3_moe}};
}

std::mutex& added_mutex() {
  static std::mutex m;
  return m;
}
std::vector<std::pair<std::string, BlockMaker>>& added() {
  static std::vector<std::pair<std::string, BlockMaker>> a;
  return a;
}

BlockMaker find_maker(std::string_view architecture) {
  for (const auto& [name, maker] : product())
    if (name == architecture) return maker;
  const std::lock_guard lock(added_mutex());
  for (const auto& [name, maker] : added())
    if (name == architecture) return maker;
  return nullptr;
}

}  // namespace

bool has_block(std::string_view architecture) { return find_maker(architecture) != nullptr; }

void add_block(std::string_view architecture, BlockMaker maker) {
  if (has_block(architecture))
    throw std::logic_error(fmt::format("add_block: \"{}\" has a block already", architecture));
  const std::lock_guard lock(added_mutex());
  added().emplace_back(std::string(architecture), maker);
}

std::unique_ptr<Block> make_block(const ModelArgs& args, int layer, const ParamLookup& find) {
  const std::string_view name = args.architecture().name();
  if (BlockMaker maker = find_maker(name)) return maker(args, layer, find);
  throw std::logic_error(
      fmt::format("make_block: architecture \"{}\" has no block (models/blocks.cpp)", name));
}

}  // namespace primecfg::train
