// Each architecture's block (nn/block.hpp's make_block): one line per architecture.
#include "models/llama/block.hpp"

#include <fmt/format.h>

namespace primecfg::train {

std::unique_ptr<Block> make_block(const ModelArgs& args, int layer, const ParamLookup& find) {
  switch (args.arch) {
    case Arch::llama:
    case Arch::qwen2:
    case Arch::qwen3:
      return std::make_unique<LlamaBlock>(layer, find);
  }
  throw std::logic_error(fmt::format("make_block: no block for architecture {}", arch_name(args.arch)));
}

}  // namespace primecfg::train
