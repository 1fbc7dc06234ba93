// Definitions of validate.hpp.
#pragma once

#include <primecfg/validate.hpp>

namespace primecfg {

inline std::string validation::find_path(const void* address, std::type_index type,
                                         detail::call_site rule) const {
  auto it = paths_.find({address, type});
  if (it != paths_.end()) return it->second;
  if (unknown_reported_.insert({rule.file_name(), rule.line()}).second) {
    diagnostic d;
    d.kind = error_kind::value_error;
    d.path = "<unknown field>";
    d.message = fmt::format(
        "the rule at {}:{} ({}) names a value that is not a field of this config (a local variable or a "
        "copy?), so its path and source are unknown; pass the field itself, e.g. v.error(cfg.steps, ...)",
        rule.file_name(), rule.line(), rule.function_name());
    out_->push_back(std::move(d));
  }
  return "<unknown field>";
}

template <class F>
std::string validation::path_of(const F& field, detail::call_site rule) const {
  return find_path(static_cast<const void*>(&field), std::type_index(typeid(F)), rule);
}

template <class F>
provenance validation::source_of(const F& field, detail::call_site rule) const {
  auto it = sources_->find(path_of(field, rule));
  return it == sources_->end() ? provenance{} : it->second;
}

template <class F>
bool validation::is_set(const F& field, detail::call_site rule) const {
  return !source_of(field, rule).is_default();
}

// A temporary has no place in the config: refused where the rule is compiled.
#define PRIMECFG_REQUIRE_FIELD(F)                                                                     \
  static_assert(std::is_lvalue_reference_v<F>,                                                        \
                "primecfg: a validation rule names a field of the config (v.error(cfg.steps, ...)), " \
                "not a temporary or a computed value")

template <class F>
void validation::error(F&& field, std::string message, detail::call_site rule) {
  PRIMECFG_REQUIRE_FIELD(F);
  report(severity::error, field, std::move(message), rule);
}
template <class F>
void validation::warning(F&& field, std::string message, detail::call_site rule) {
  PRIMECFG_REQUIRE_FIELD(F);
  report(severity::warning, field, std::move(message), rule);
}
template <class F>
void validation::note(F&& field, std::string message, detail::call_site rule) {
  PRIMECFG_REQUIRE_FIELD(F);
  report(severity::note, field, std::move(message), rule);
}
#undef PRIMECFG_REQUIRE_FIELD

template <class F, class V>
bool validation::require_value(F& field, V&& value, std::string why, detail::call_site rule) {
  F wanted(std::forward<V>(value));
  if (detail::deep_equal(field, wanted)) return true;
  if (is_set(field, rule)) {
    error(field, why, rule);
    return false;
  }
  note(
      field,
      fmt::format("default {} changed to {}: {}", detail::value_text(field), detail::value_text(wanted), why),
      rule);
  field = std::move(wanted);
  return true;
}

template <class F, class V>
void validation::inherit(F& field, const V& value, detail::call_site rule) {
  F wanted(value);
  if (is_set(field, rule)) {
    if (!detail::deep_equal(field, wanted))
      error(field,
            fmt::format("conflicts with {} = {} set at {}", path_of(value, rule), detail::value_text(wanted),
                        source_of(value, rule).to_string()),
            rule);
    return;
  }
  field = std::move(wanted);
  (*sources_)[path_of(field, rule)] = source_of(value, rule);
}

template <class F, class V, class C>
void validation::inherit(F& field, const V& value, std::string_view what, const C& cause,
                         detail::call_site rule) {
  F wanted(value);
  if (is_set(field, rule)) {
    if (!detail::deep_equal(field, wanted))
      error(field,
            fmt::format("conflicts with {} = {} (from {} set at {})", what, detail::value_text(wanted),
                        path_of(cause, rule), source_of(cause, rule).to_string()),
            rule);
    return;
  }
  field = std::move(wanted);
  (*sources_)[path_of(field, rule)] = source_of(cause, rule);
}

template <class S, class C>
S* validation::engage(std::optional<S>& section, const C& cause, detail::call_site rule) {
  if (section) return &*section;
  if (is_set(section, rule)) {
    error(section,
          fmt::format("is \"None\", but {} (set at {}) applies to it; remove one of the two",
                      path_of(cause, rule), source_of(cause, rule).to_string()),
          rule);
    return nullptr;
  }
  section.emplace();
  (*sources_)[path_of(section, rule)] = source_of(cause, rule);
  if (reindex_) reindex_();
  return &*section;
}

template <class S>
void validation::inherit_fields(S& target, const S& shared, detail::call_site rule) {
  if constexpr (detail::is_struct_v<S>) {
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (inherit_fields(detail::get_field<I>(target), detail::get_field<I>(shared), rule), ...);
    }
    (std::make_index_sequence<detail::field_count_v<S>>{});
  } else if (is_set(shared, rule)) {
    inherit(target, shared, rule);
  }
}

inline provenance validation::source_of_path(std::string_view path) const {
  auto it = sources_->find(path);
  return it == sources_->end() ? provenance{} : it->second;
}

inline void validation::add_field(const void* address, std::type_index type, std::string path) {
  paths_.insert_or_assign({address, type}, std::move(path));
}

template <class F>
void validation::report(severity level, const F& field, std::string message, detail::call_site rule) {
  diagnostic d;
  d.level = level;
  d.kind = error_kind::value_error;
  d.path = path_of(field, rule);
  d.where = source_of(field, rule);
  d.message = std::move(message);
  d.input = detail::value_text(field);
  out_->push_back(std::move(d));
}

}  // namespace primecfg
