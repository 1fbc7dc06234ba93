// Which optimizer a config names, and the FP32 state it keeps per parameter. Shared
// by the trainer (which allocates that state) and the memory planner (which counts it),
// so that the two cannot disagree.
#pragma once

#include <primecfg/sft.hpp>

#include <string_view>
#include <type_traits>
#include <variant>

namespace primecfg::train {

enum class OptKind { adamw, sign_sgd, sgd, muon };

// The kind of the config's optimizer (its tagged union).
inline OptKind optimizer_kind(const OptimizerConfig& cfg) {
  return std::visit(
      [](const auto& o) {
        using O = std::decay_t<decltype(o)>;
        if constexpr (std::is_same_v<O, AdamWConfig>) return OptKind::adamw;
        if constexpr (std::is_same_v<O, SignSGDConfig>) return OptKind::sign_sgd;
        if constexpr (std::is_same_v<O, SGDConfig>) return OptKind::sgd;
        return OptKind::muon;
      },
      cfg);
}

// Muon orthogonalises the momentum of the hidden matrices (2-D weights inside the
// blocks); embeddings, the LM head and vectors take AdamW.
constexpr bool muon_matrix(bool two_dimensional, int block) { return two_dimensional && block >= 0; }

// FP32 moment buffers of one parameter: AdamW two, SignSGD none, SGD one with
// momentum, Muon one on its matrices and AdamW's two elsewhere.
constexpr int moment_buffers(OptKind kind, bool momentum, bool muon_matrix) {
  switch (kind) {
    case OptKind::adamw:
      return 2;
    case OptKind::sign_sgd:
      return 0;
    case OptKind::sgd:
      return momentum ? 1 : 0;
    case OptKind::muon:
      return muon_matrix ? 1 : 2;
  }
  return 0;
}

}  // namespace primecfg::train
