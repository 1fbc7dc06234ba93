// [optim]: the optimizer, a tagged union on `type` (AdamW when absent).
#pragma once

#include <primecfg/detail/cxx_version.hpp>  // first: C++20 or later

#include <primecfg/describe.hpp>
#include <primecfg/detail/value_text.hpp>
#include <primecfg/validate.hpp>

#include <fmt/format.h>

#include <optional>
#include <string_view>
#include <variant>

namespace primecfg {

struct AdamWConfig {
  static constexpr std::string_view type = "adamw";
  double lr = 1e-6;
  double weight_decay = 0.01;
  std::optional<double> max_norm = 1.0;
  double betas1 = 0.9;
  double betas2 = 0.999;

  static constexpr auto fields() {
    using S = AdamWConfig;
    return describe(
        field(&S::lr, "Peak learning rate.", ge(0)),
        field(&S::weight_decay, "Decoupled weight decay.", ge(0)),
        field(&S::max_norm, "Clip the global gradient norm to this; \"None\" disables clipping.", gt(0)),
        field(&S::betas1, "First-moment decay (beta1).", ge(0), lt(1)),
        field(&S::betas2, "Second-moment decay (beta2).", ge(0), lt(1)));
  }
};

struct SignSGDConfig {
  static constexpr std::string_view type = "sign_sgd";
  double lr = 1e-6;
  double weight_decay = 0.01;
  std::optional<double> max_norm = 1.0;

  static constexpr auto fields() {
    using S = SignSGDConfig;
    return describe(
        field(&S::lr, "Step size applied to the sign of each gradient.", ge(0)),
        field(&S::weight_decay, "Decoupled weight decay.", ge(0)),
        field(&S::max_norm, "Clip the global gradient norm to this; \"None\" disables clipping.", gt(0)));
  }
};

struct SGDConfig {
  static constexpr std::string_view type = "sgd";
  double lr = 1e-6;
  double weight_decay = 0.01;
  std::optional<double> max_norm = 1.0;
  double momentum = 0.9;
  bool nesterov = true;

  static constexpr auto fields() {
    using S = SGDConfig;
    return describe(
        field(&S::lr, "Learning rate.", ge(0)), field(&S::weight_decay, "Decoupled weight decay.", ge(0)),
        field(&S::max_norm, "Clip the global gradient norm to this; \"None\" disables clipping.", gt(0)),
        field(&S::momentum, "Momentum factor.", ge(0), lt(1)), field(&S::nesterov, "Use Nesterov momentum."));
  }
};

struct MuonConfig {
  static constexpr std::string_view type = "muon";
  double lr = 1e-6;
  double weight_decay = 0.01;
  std::optional<double> max_norm = 1.0;
  double mu = 0.95;
  double betas1 = 0.9;
  double betas2 = 0.95;
  std::optional<double> momentum = std::nullopt;  // the old name of mu

  static constexpr auto fields() {
    using S = MuonConfig;
    return describe(
        field(&S::lr, "Learning rate.", ge(0)), field(&S::weight_decay, "Decoupled weight decay.", ge(0)),
        field(&S::max_norm, "Clip the global gradient norm to this; \"None\" disables clipping.", gt(0)),
        field(&S::mu, "Momentum of the orthogonalised update (prime-rl's name).", ge(0), lt(1)),
        field(&S::betas1, "AdamW beta1 for parameters Muon does not handle.", ge(0), lt(1)),
        field(&S::betas2, "AdamW beta2 for parameters Muon does not handle.", ge(0), lt(1)),
        field(&S::momentum, "Retired: the old name of mu, still read with a warning.", ge(0), lt(1)));
  }

  // `momentum` was primecfg's name for prime-rl's `mu`. It is still read (a
  // warning, and mu takes its value) until primecfg-migrate can rename it:
  // SGD's momentum keeps its name, so the step must look at the type.
  void validate(validation& v) {
    if (!momentum) return;
    v.warning(momentum, fmt::format("Muon's momentum is called mu (as in prime-rl); write mu = {} instead",
                                    detail::value_text(*momentum)));
    v.inherit(mu, *momentum);
  }
};

using OptimizerConfig = std::variant<AdamWConfig, SignSGDConfig, SGDConfig, MuonConfig>;

// Every alternative has lr, weight_decay and max_norm.
template <class F>
decltype(auto) visit_optimizer(OptimizerConfig& optim, F&& f) {
  return std::visit(std::forward<F>(f), optim);
}

}  // namespace primecfg
