// The offload policy: one runtime setting, three compile-time strategies.
//
// A trainer writes one template over the strategy tag and lets
// visit_offload() instantiate it three times:
//
//   primecfg::visit_offload(cfg.model.offload, [&]<class Strategy>(Strategy) {
//     Trainer<Strategy>{cfg}.run();
//   });
#pragma once

#include <primecfg/detail/cxx_version.hpp>  // first: C++20 or later

#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

namespace primecfg {

// Where the FP32 training state lives between optimizer steps.
enum class Offload {
  none,       // masters, gradients and moments on the GPU
  optimizer,  // moments in pinned host memory, streamed through the GPU for the update
  full,       // masters, moments and gradient accumulators in host RAM; the CPU runs the update
};

// Strategy tags. Each states where the state lives, so code can ask
// `if constexpr (Strategy::moments_on_host)` instead of comparing enum values.
struct NoOffload {
  static constexpr Offload mode = Offload::none;
  static constexpr std::string_view name = "none";
  static constexpr bool moments_on_host = false;
  static constexpr bool masters_on_host = false;
  static constexpr bool grads_on_host = false;
  static constexpr bool supports_grad_clipping = true;
};
struct OptimizerOffload {
  static constexpr Offload mode = Offload::optimizer;
  static constexpr std::string_view name = "optimizer";
  static constexpr bool moments_on_host = true;
  static constexpr bool masters_on_host = false;
  static constexpr bool grads_on_host = false;
  static constexpr bool supports_grad_clipping = true;
};
struct FullOffload {
  static constexpr Offload mode = Offload::full;
  static constexpr std::string_view name = "full";
  static constexpr bool moments_on_host = true;
  static constexpr bool masters_on_host = true;
  static constexpr bool grads_on_host = true;
  // The update of a chunk runs while backward is still producing the
  // gradients of other chunks, so a global gradient norm is never known in time.
  static constexpr bool supports_grad_clipping = false;
};

// The strategies, listed once: the concept and the list of modes follow from it.
template <class... S>
struct strategy_list {
  static constexpr Offload modes[] = {S::mode...};
  template <class T>
  static constexpr bool contains = (std::is_same_v<T, S> || ...);
};
using offload_strategies = strategy_list<NoOffload, OptimizerOffload, FullOffload>;

// Every mode, one per strategy, from the one that keeps the most on the GPU to the one
// that keeps the least: what a planner compares and a test runs through.
inline constexpr const auto& offload_modes = offload_strategies::modes;

template <class T>
concept offload_strategy = offload_strategies::contains<T>;

// Calls f(NoOffload{}), f(OptimizerOffload{}) or f(FullOffload{}) according
// to the runtime value. All three calls must return the same type. A value of
// Offload that no strategy handles is never run as another mode: the switch names
// every value (a new one without a case is a -Wswitch warning), and a value outside
// the enumeration (a cast) throws std::invalid_argument.
template <class F>
decltype(auto) visit_offload(Offload mode, F&& f) {
  switch (mode) {
    case Offload::none:
      return std::forward<F>(f)(NoOffload{});
    case Offload::optimizer:
      return std::forward<F>(f)(OptimizerOffload{});
    case Offload::full:
      return std::forward<F>(f)(FullOffload{});
  }
  throw std::invalid_argument("primecfg::visit_offload: " + std::to_string(static_cast<int>(mode)) +
                              " is not a value of primecfg::Offload");
}

}  // namespace primecfg
