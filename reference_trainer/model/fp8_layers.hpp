// Which layers prime-rl's model.quantization = {type = "fp8"} runs in FP8, without
// LibTorch: what the config check, the model build (Transformer::use_fp8) and the routed
// experts (nn/moe.hpp) decide by. The FP8 arithmetic is nn/fp8.hpp's.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace primecfg::train::fp8 {

inline constexpr std::int64_t group = 128;  // elements a scale covers along a dimension

// Whether a linear layer runs in FP8, as prime-rl decides it: no pattern of
// ignore_patterns is found in its qualified module name (std::regex_search, ECMAScript,
// like Python's re.search on these patterns), and both its dimensions are multiples of 128.
// The reason when it stays in bf16, nothing when it is FP8. A pattern that is not a valid
// regex is an error naming it (std::invalid_argument).
std::optional<std::string> stays_bf16(std::string_view module, std::int64_t out_features,
                                      std::int64_t in_features,
                                      const std::vector<std::string>& ignore_patterns);

// Why a pattern of ignore_patterns is not a regular expression; nothing when it is one.
std::optional<std::string> invalid_pattern(const std::string& pattern);

// Why routed experts of hidden size `hidden` and intermediate size `intermediate` cannot
// run in FP8 (model.quantization.enable_grouped_gemm); nothing when they can: both
// multiples of 128, so that every projection's groups and blocks are whole.
std::optional<std::string> experts_stay_bf16(std::int64_t hidden, std::int64_t intermediate);

}  // namespace primecfg::train::fp8
