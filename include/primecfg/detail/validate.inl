// Definitions of validate.hpp.
#pragma once

#include <primecfg/validate.hpp>

namespace primecfg {

template <class F>
std::string validation::path_of(const F& field) const {
  auto it = paths_.find({static_cast<const void*>(&field), std::type_index(typeid(F))});
  return it == paths_.end() ? std::string("<unknown field>") : it->second;
}

template <class F>
provenance validation::source_of(const F& field) const {
  auto it = sources_->find(path_of(field));
  return it == sources_->end() ? provenance{} : it->second;
}

template <class F>
bool validation::is_set(const F& field) const {
  return !source_of(field).is_default();
}

template <class F>
void validation::error(const F& field, std::string message) {
  report(severity::error, field, std::move(message));
}
template <class F>
void validation::warning(const F& field, std::string message) {
  report(severity::warning, field, std::move(message));
}
template <class F>
void validation::note(const F& field, std::string message) {
  report(severity::note, field, std::move(message));
}

template <class F, class V>
bool validation::require_value(F& field, V&& value, std::string why) {
  F wanted(std::forward<V>(value));
  if (detail::deep_equal(field, wanted)) return true;
  if (is_set(field)) {
    error(field, why);
    return false;
  }
  note(field, fmt::format("default {} changed to {}: {}", detail::value_text(field),
                          detail::value_text(wanted), why));
  field = std::move(wanted);
  return true;
}

template <class F, class V>
void validation::inherit(F& field, const V& value) {
  F wanted(value);
  if (is_set(field)) {
    if (!detail::deep_equal(field, wanted))
      error(field, fmt::format("conflicts with {} = {} set at {}", path_of(value), detail::value_text(wanted),
                               source_of(value).to_string()));
    return;
  }
  field = std::move(wanted);
  (*sources_)[path_of(field)] = source_of(value);
}

template <class F, class V, class C>
void validation::inherit(F& field, const V& value, std::string_view what, const C& cause) {
  F wanted(value);
  if (is_set(field)) {
    if (!detail::deep_equal(field, wanted))
      error(field, fmt::format("conflicts with {} = {} (from {} set at {})", what, detail::value_text(wanted),
                               path_of(cause), source_of(cause).to_string()));
    return;
  }
  field = std::move(wanted);
  (*sources_)[path_of(field)] = source_of(cause);
}

template <class S, class C>
S* validation::engage(std::optional<S>& section, const C& cause) {
  if (section) return &*section;
  if (is_set(section)) {
    error(section, fmt::format("is \"None\", but {} (set at {}) applies to it; remove one of the two",
                               path_of(cause), source_of(cause).to_string()));
    return nullptr;
  }
  section.emplace();
  (*sources_)[path_of(section)] = source_of(cause);
  if (reindex_) reindex_();
  return &*section;
}

template <class S>
void validation::inherit_fields(S& target, const S& shared) {
  if constexpr (detail::is_struct_v<S>) {
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (inherit_fields(detail::get_field<I>(target), detail::get_field<I>(shared)), ...);
    }
    (std::make_index_sequence<detail::field_count_v<S>>{});
  } else if (is_set(shared)) {
    inherit(target, shared);
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
void validation::report(severity level, const F& field, std::string message) {
  diagnostic d;
  d.level = level;
  d.kind = error_kind::value_error;
  d.path = path_of(field);
  d.where = source_of(field);
  d.message = std::move(message);
  d.input = detail::value_text(field);
  out_->push_back(std::move(d));
}

}  // namespace primecfg
