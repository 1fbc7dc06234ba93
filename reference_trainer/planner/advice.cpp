// What --plan recommends: the mode to use when one fits, else the changes that make
// one fit, each found by planning the changed config (never guessed).
#include "planner/planner.hpp"

#include "planner/step_model.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <variant>

namespace primecfg::train::plan {

namespace {

using i64 = std::int64_t;

std::string gib(i64 bytes) { return fmt::format("{:.2f} GiB", static_cast<double>(bytes) / (1 << 30)); }

// The modes from the fastest to the slowest. With a machine profile the step-time
// model orders them; without one, the strategies' own order (the most kept on the GPU
// first), which is the order the measurements give (docs/performance.md: none, then
// optimizer, which streams the moments over PCIe, then full, whose CPU update sets the
// step time).
constexpr const auto& kBySpeed = offload_modes;

std::vector<const ModePlan*> by_speed(const std::vector<ModePlan>& modes) {
  std::vector<const ModePlan*> out;
  for (Offload o : kBySpeed)
    for (const auto& m : modes)
      if (m.mode == o) out.push_back(&m);
  if (std::all_of(out.begin(), out.end(), [](const ModePlan* m) { return m->time.has_value(); }))
    std::stable_sort(out.begin(), out.end(),
                     [](const ModePlan* x, const ModePlan* y) { return x->time->step < y->time->step; });
  return out;
}

// The fastest mode that fits; a mode predicted within 2% of it (inside the model's
// error) is preferred when it comes first in kBySpeed: it keeps more on the GPU and
// needs less of the host.
const ModePlan* fastest_fit(const std::vector<ModePlan>& modes) {
  const ModePlan* best = nullptr;
  for (const ModePlan* m : by_speed(modes))
    if (m->fits()) {
      best = m;
      break;
    }
  if (!best || !best->time) return best;
  for (Offload o : kBySpeed)
    for (const auto& m : modes)
      if (m.mode == o && m.fits() && m.time->step <= 1.02 * best->time->step) return &m;
  return best;
}

std::string step_of(const ModePlan& m) {
  if (!m.time) return "";
  return fmt::format(", predicted step {:.3f} s ({})", m.time->step, m.time->bound);
}

std::string cost_of(Offload mode, const Plan& p) {
  return detail::step_model_of(mode).cost(static_cast<double>(p.params) / 1e9);
}

i64 micro_of(const SFTConfig& c) {
  return std::visit([](const auto& d) -> i64 { return d.micro_batch_size; }, c.data);
}
i64 batch_of(const SFTConfig& c) {
  return std::visit([](const auto& d) -> i64 { return d.batch_size; }, c.data);
}
void set_seq_len(SFTConfig& c, i64 t) {
  std::visit([&](auto& d) { d.seq_len = t; }, c.data);
}
void set_micro(SFTConfig& c, i64 b) {
  std::visit([&](auto& d) { d.micro_batch_size = b; }, c.data);
}

const ModePlan* fits_with(const SFTConfig& c, const Plan& p, const Assumptions& a) {
  static thread_local Plan keep;  // the pointer stays valid until the next call
  keep = make_plan(c, p.shape, a);
  return fastest_fit(keep.modes);
}

// The plan over `more`'s ranks; nullopt where the config cannot be spread over them
// (nodes not all full, HSDP's dp_replicate not dividing them): not a suggestion.
std::optional<Plan> plan_over(const SFTConfig& c, const Plan& p, const Assumptions& more) {
  try {
    return make_plan(c, p.shape, more);
  } catch (const plan_error&) {
    return std::nullopt;
  }
}

// The largest value in [lo, hi] (in steps of `step`) for which ok() holds, assuming
// that it holds for every smaller one; nullopt when not even lo does.
template <class Ok>
std::optional<i64> largest(i64 lo, i64 hi, i64 step, Ok ok) {
  if (!ok(lo)) return std::nullopt;
  i64 good = lo, bad = hi + step;
  while (bad - good > step) {
    const i64 mid = good + (bad - good) / step / 2 * step;
    (ok(mid) ? good : bad) = mid;
  }
  return good;
}

// One combination of changes that makes a mode fit, as planned in full.
struct Combination {
  std::string flags;
  Offload mode = Offload::none;
  i64 world = 1, per_node = 1, gpu_total = 0, host_node = 0, batch_multiple = 1;
  std::optional<double> step, tokens_per_s;  // with a machine profile; tokens/s of one GPU
  int changes = 0;
};

// Where no single change makes a mode fit: every combination of activation
// checkpointing, activation offloading, micro-batch 1 and more ranks (powers of two up to
// 1024, kRanksPerNode a node unless told) at one of `lengths`, each planned in full. For
// each set of the other changes only the fewest ranks that fit are kept (more cost GPUs,
// not memory). The cheapest first: the most tokens per second of one GPU (what a rented
// hour buys), else the fewest GPUs and changes.
std::vector<Combination> combinations(const SFTConfig& cfg, const Plan& p, const Assumptions& a,
                                      const std::vector<i64>& lengths) {
  std::vector<Combination> found;
  const i64 T = cfg.seq_len(), micro = micro_of(cfg), per_node_cap = a.ranks_per_node.value_or(kRanksPerNode);
  // Each setting as configured, then changed (where it can change).
  const auto as_is_then = [](auto now, auto changed) {
    return now == changed ? std::vector{now} : std::vector{now, changed};
  };
  for (bool ac : as_is_then(cfg.model.ac.has_value(), true)) {
    for (bool ac_off : as_is_then(cfg.model.ac_offloading.has_value(), true)) {
      if (ac_off && !ac) continue;  // activation offloading offloads checkpointed inputs
      for (i64 m : as_is_then(micro, i64{1})) {
        for (i64 t : lengths) {
          SFTConfig x = cfg;
          std::vector<std::string> flags;
          if (ac && !cfg.model.ac) {
            x.model.ac = ActivationCheckpointConfig{};
            flags.push_back("--model.ac");
          }
          if (ac_off && !cfg.model.ac_offloading) {
            if (x.model.ac->freq != 1) flags.push_back("--model.ac.freq=1");
            x.model.ac->freq = 1;
            x.model.ac_offloading = ActivationOffloadConfig{};
            flags.push_back("--model.ac-offloading");
          }
          if (m != micro) {
            if (batch_of(cfg) % m) continue;
            set_micro(x, m);
            flags.push_back(fmt::format("--data.micro-batch-size={}", m));
          }
          if (t != T) {
            set_seq_len(x, t);
            flags.push_back(fmt::format("--data.seq-len={}", t));
          }
          const int changes = static_cast<int>(flags.size());
          for (i64 w = a.world; w <= 1024; w = w == a.world ? std::max<i64>(2, w * 2) : w * 2) {
            if (changes == 0 && w == a.world) continue;  // the config as it is: nothing fits
            Assumptions more = a;
            more.world = w;
            more.ranks_per_node =
                w == a.world ? a.ranks_per_node : std::optional<i64>(std::min(w, per_node_cap));
            const auto q = plan_over(x, p, more);
            const ModePlan* best = q ? fastest_fit(q->modes) : nullptr;
            if (!best) continue;
            Combination c{.flags = fmt::format("{}", fmt::join(flags, " ")),
                          .mode = best->mode,
                          .world = w,
                          .per_node = more.per_node(),
                          .gpu_total = best->gpu_total,
                          .host_node = best->host_node,
                          .batch_multiple = micro_of(x) * w,
                          .step = std::nullopt,
                          .tokens_per_s = std::nullopt,
                          .changes = changes + (w != a.world)};
            if (best->time) {
              c.step = best->time->step;
              c.tokens_per_s = best->time->tokens_per_s;
            }
            found.push_back(std::move(c));
            break;  // the fewest ranks for these changes
          }
        }
      }
    }
  }
  std::stable_sort(found.begin(), found.end(), [](const Combination& x, const Combination& y) {
    if (x.tokens_per_s && y.tokens_per_s && *x.tokens_per_s != *y.tokens_per_s)
      return *x.tokens_per_s > *y.tokens_per_s;
    return std::pair(x.world, x.changes) < std::pair(y.world, y.changes);
  });
  return found;
}

}  // namespace

Advice advise(const SFTConfig& cfg, const Plan& p) {
  Advice out;
  const Assumptions& a = p.assumptions;
  if (!a.gpu_capacity || !a.host_capacity) {
    out.summary = "The machine's capacity is unknown for part of it, so no mode is recommended.";
    return out;
  }
  if (const ModePlan* m = fastest_fit(p.modes)) {
    out.mode = m->mode;
    std::string why = fmt::format("the fastest mode that fits ({} of {} on the GPU{}); {}", gib(m->gpu_total),
                                  gib(*a.gpu_capacity), step_of(*m), cost_of(m->mode, p));
    for (const ModePlan* f : by_speed(p.modes)) {
      if (f == m) continue;
      if (!f->fits()) {
        // Only the modes that would have come first are worth saying they do not fit.
        if (f->time ? f->time->step < m->time->step
                    : std::find(std::begin(kBySpeed), std::end(kBySpeed), f->mode) <
                          std::find(std::begin(kBySpeed), std::end(kBySpeed), m->mode))
          why += fmt::format(". {} does not fit: {}", mode_name(f->mode),
                             !f->gpu_fits.value_or(true)
                                 ? fmt::format("{} on the GPU", gib(f->gpu_total))
                                 : fmt::format("{} of host memory per node", gib(f->host_node)));
      } else if (f->time && m->time) {
        // What another mode that fits would cost: the trade a user weighs.
        const double saved = static_cast<double>(m->gpu_total - f->gpu_total) / (1 << 30);
        why += fmt::format(". {}: {} {:.2f} GiB of GPU memory for {:+.0f}% step time ({:.3f} s)",
                           mode_name(f->mode), saved >= 0 ? "saves" : "takes", std::abs(saved),
                           100 * (f->time->step / m->time->step - 1), f->time->step);
      }
    }
    out.summary = fmt::format("Recommended: model.offload = \"{}\": {}.", mode_name(m->mode), why);
    if (cfg.model.offload != m->mode)
      out.summary += fmt::format(
          " This config asks for \"{}\"{}.", mode_name(cfg.model.offload),
          p.mode(cfg.model.offload).fits() ? ", which fits but is slower" : ", which does not fit");
    return out;
  }

  // Nothing fits as configured: each change on its own, planned.
  out.summary = "No offload mode fits this machine with this config. What would make one fit (each planned):";
  const bool ac = cfg.model.ac.has_value();
  SFTConfig with_ac = cfg;
  if (!ac) with_ac.model.ac = ActivationCheckpointConfig{};
  if (!ac)
    if (const ModePlan* m = fastest_fit(p.modes_other))
      out.changes.push_back(
          fmt::format("--model.ac (activation checkpointing: each block's forward runs again in "
                      "backward): then model.offload = \"{}\" fits, {} on the GPU{}",
                      mode_name(m->mode), gib(m->gpu_total), step_of(*m)));
  // Activation offloading trades GPU memory for host memory: where host memory is what
  // runs out (full offload keeps the FP32 state there too), the inputs on the GPU fit.
  if (cfg.model.ac_offloading) {
    SFTConfig x = cfg;
    x.model.ac_offloading = std::nullopt;
    if (const ModePlan* m = fits_with(x, p, a))
      out.changes.push_back(fmt::format(
          "--no-model.ac-offloading (the checkpointed block inputs stay on the GPU instead of taking host "
          "memory): then model.offload = \"{}\" fits, {} on the GPU, {} of host memory per node{}",
          mode_name(m->mode), gib(m->gpu_total), gib(m->host_node), step_of(*m)));
  }
  // Activation offloading: the checkpointed block inputs wait in host memory, all but
  // a window (it checkpoints every block).
  if (!cfg.model.ac_offloading) {
    SFTConfig x = cfg;
    const bool freq_changes = x.model.ac && x.model.ac->freq != 1;
    if (!x.model.ac) x.model.ac = ActivationCheckpointConfig{};
    x.model.ac->freq = 1;
    x.model.ac_offloading = ActivationOffloadConfig{};
    if (const ModePlan* m = fits_with(x, p, a))
      out.changes.push_back(fmt::format(
          "{}--model.ac-offloading (activation offloading: the checkpointed block inputs wait in host "
          "memory, "
          "all but {}): then model.offload = \"{}\" fits, {} on the GPU, {} of host memory per node{}",
          freq_changes ? "--model.ac.freq=1 " : "", ActivationOffloadConfig{}.max_inflight_activations,
          mode_name(m->mode), gib(m->gpu_total), gib(m->host_node), step_of(*m)));
  }
  // A shorter sequence, a smaller micro-batch: with the config's model.ac, and (when it
  // is off) with it on, which allows longer ones.
  const i64 T = cfg.seq_len();
  const bool ac_alone = !ac && fastest_fit(p.modes_other);  // then nothing needs it with model.ac
  for (const SFTConfig* c : {&cfg, ac || ac_alone ? static_cast<const SFTConfig*>(nullptr) : &with_ac}) {
    if (!c) continue;
    const std::string prefix = c == &with_ac ? "--model.ac " : "";
    Offload mode = Offload::none;
    auto ok = [&](i64 t) {
      SFTConfig x = *c;
      set_seq_len(x, t);
      const ModePlan* m = fits_with(x, p, a);
      if (m) mode = m->mode;
      return m != nullptr;
    };
    if (T > 256)
      if (auto t = largest(256, T - 256, 256, ok)) {
        ok(*t);
        out.changes.push_back(
            fmt::format("{}--data.seq-len={} (the longest that fits, in steps of 256): then "
                        "model.offload = \"{}\" fits",
                        prefix, *t, mode_name(mode)));
      }
    for (i64 b = micro_of(cfg) - 1; b >= 1; --b) {
      if (batch_of(cfg) % b) continue;
      SFTConfig x = *c;
      set_micro(x, b);
      if (const ModePlan* m = fits_with(x, p, a)) {
        out.changes.push_back(
            fmt::format("{}--data.micro-batch-size={} (the largest that fits and divides "
                        "data.batch_size): then model.offload = \"{}\" fits",
                        prefix, b, mode_name(m->mode)));
        break;
      }
    }
  }
  // More ranks: the weights and the FP32 state are sharded over them (FSDP; over the
  // shard groups' ranks with HSDP, whose replica count stays).
  const i64 per_node_cap = a.ranks_per_node.value_or(kRanksPerNode);
  for (i64 w = std::max<i64>(2, a.world * 2); w <= 1024; w *= 2) {
    Assumptions more = a;
    more.world = w;
    more.ranks_per_node = std::min(w, per_node_cap);
    const auto q = plan_over(cfg, p, more);
    if (const ModePlan* m = q ? fastest_fit(q->modes) : nullptr) {
      out.changes.push_back(fmt::format(
          "{} ranks ({} per node, one GPU each; the weights and the FP32 state are sharded over them): then "
          "model.offload = "
          "\"{}\" fits, {} per GPU (data.batch_size must give each rank whole micro-batches)",
          w, *more.ranks_per_node, mode_name(m->mode), gib(m->gpu_total)));
      break;
    }
  }
  if (!out.changes.empty()) return out;
  // No change on its own: combinations of them, the cheapest few.
  // At the config's length; only where nothing fits there, at 1/2 or 1/4 of it (a
  // shorter sequence trains something else).
  std::vector<Combination> found;
  for (i64 t : {T, T / 2 / 256 * 256, T / 4 / 256 * 256})
    if (found.empty() && (t == T || t >= 256)) found = combinations(cfg, p, a, {t});
  for (std::size_t k = 0; k < found.size() && k < kCombinationsShown; ++k) {
    const Combination& c = found[k];
    std::string ranks;
    if (c.world != a.world)
      ranks = fmt::format(" with {} ranks ({} per node; data.batch_size a multiple of {})", c.world,
                          c.per_node, c.batch_multiple);
    out.combined.push_back(fmt::format(
        "{}{}: then model.offload = \"{}\" fits, {} per GPU, {} of host memory per node{}{}", c.flags, ranks,
        mode_name(c.mode), gib(c.gpu_total), gib(c.host_node),
        c.step ? fmt::format(", predicted step {:.3f} s", *c.step) : std::string(),
        c.tokens_per_s ? fmt::format(", {:.0f} tokens/s a GPU", *c.tokens_per_s) : std::string()));
  }
  if (out.combined.empty())
    out.changes.push_back(
        "none of --model.ac, --model.ac-offloading, a shorter data.seq_len, a smaller micro-batch or up to "
        "1024 ranks makes a mode fit, alone or combined");
  return out;
}

std::string format_advice(const Advice& advice) {
  std::string out = advice.summary + "\n";
  for (const auto& c : advice.changes) out += "  - " + c + "\n";
  if (!advice.combined.empty()) {
    out +=
        "  No change makes a mode fit alone. Combined (each planned in full; the most tokens per second of "
        "one "
        "GPU first):\n";
    for (const auto& c : advice.combined) out += "  - " + c + "\n";
  }
  return out;
}

}  // namespace primecfg::train::plan
