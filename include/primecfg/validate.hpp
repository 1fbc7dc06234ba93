// Cross-field rules. A config struct declares them next to its fields:
//
//   struct SFTConfig {
//     ...
//     void validate(primecfg::validation& v) {
//       if (data.batch_size % data.micro_batch_size != 0)
//         v.error(data.batch_size, "must be a multiple of data.micro_batch_size");
//     }
//   };
//
// validate() runs after every source has been decoded, children before
// parents. Fields are named by reference: the validation knows each field's
// dotted path and where its value came from, so a rule can tell a value the
// user wrote from a default.
//
// A struct that hands settings down to its sections (RLConfig's shared
// max_steps into [trainer]) does that in `void share(primecfg::validation&)`:
// every share() runs before any validate(), parents first, so the rules of a
// section already see the values it was given.
#pragma once

#include <primecfg/detail/equal.hpp>
#include <primecfg/detail/value_text.hpp>
#include <primecfg/error.hpp>

#include <primecfg/detail/fields.hpp>

#include <boost/pfr/core.hpp>

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <typeindex>
#include <utility>
#include <vector>

namespace primecfg {

using provenance_map = std::map<std::string, provenance, std::less<>>;

class validation {
 public:
  validation(std::vector<diagnostic>& out, provenance_map& sources) : out_(&out), sources_(&sources) {}

  // Dotted path of a field of the config being validated.
  template <class F>
  std::string path_of(const F& field) const {
    auto it = paths_.find({static_cast<const void*>(&field), std::type_index(typeid(F))});
    return it == paths_.end() ? std::string("<unknown field>") : it->second;
  }

  // Where the field's value came from.
  template <class F>
  provenance source_of(const F& field) const {
    auto it = sources_->find(path_of(field));
    return it == sources_->end() ? provenance{} : it->second;
  }

  // True when a file or the command line set the field.
  template <class F>
  bool is_set(const F& field) const {
    return !source_of(field).is_default();
  }

  template <class F>
  void error(const F& field, std::string message) {
    report(severity::error, field, std::move(message));
  }
  template <class F>
  void warning(const F& field, std::string message) {
    report(severity::warning, field, std::move(message));
  }
  template <class F>
  void note(const F& field, std::string message) {
    report(severity::note, field, std::move(message));
  }

  // A rule that needs `field` to hold `value`: a default is replaced (with a
  // note saying why); a value the user set is never silently overridden, it
  // is an error. Returns true when the field now holds `value`.
  template <class F, class V>
  bool require_value(F& field, V&& value, std::string why) {
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

  // A value shared from another section (RL's top-level max_steps into
  // [trainer]): taken when `field` was not set, an error when it was set to
  // something else. Provenance follows the value.
  template <class F, class V>
  void inherit(F& field, const V& value) {
    F wanted(value);
    if (is_set(field)) {
      if (!detail::deep_equal(field, wanted))
        error(field, fmt::format("conflicts with {} = {} set at {}", path_of(value),
                                 detail::value_text(wanted), source_of(value).to_string()));
      return;
    }
    field = std::move(wanted);
    (*sources_)[path_of(field)] = source_of(value);
  }

  // inherit() of a value computed from `cause` (RL's output_dir / run.name into
  // trainer.output_dir); `what` names the computation in the conflict message.
  template <class F, class V, class C>
  void inherit(F& field, const V& value, std::string_view what, const C& cause) {
    F wanted(value);
    if (is_set(field)) {
      if (!detail::deep_equal(field, wanted))
        error(field, fmt::format("conflicts with {} = {} (from {} set at {})", what,
                                 detail::value_text(wanted), path_of(cause), source_of(cause).to_string()));
      return;
    }
    field = std::move(wanted);
    (*sources_)[path_of(field)] = source_of(cause);
  }

  // Turns an optional section on with its defaults because `cause` (a shared
  // section) asks for it; its fields get their paths at once. A section the
  // user switched off ("None") stays off: that is an error naming `cause`.
  // Returns the section, or null when it stays off.
  template <class S, class C>
  S* engage(std::optional<S>& section, const C& cause) {
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

  // inherit() for every field of a struct that the shared section set.
  template <class S>
  void inherit_fields(S& target, const S& shared) {
    if constexpr (detail::is_struct_v<S>) {
      [&]<std::size_t... I>(std::index_sequence<I...>) {
        (inherit_fields(detail::get_field<I>(target), detail::get_field<I>(shared)), ...);
      }
      (std::make_index_sequence<detail::field_count_v<S>>{});
    } else if (is_set(shared)) {
      inherit(target, shared);
    }
  }

  // Where the value at a dotted path came from (e.g. a union's "optim.type").
  provenance source_of_path(std::string_view path) const {
    auto it = sources_->find(path);
    return it == sources_->end() ? provenance{} : it->second;
  }

  // Used by the loader: registers the address of every field before rules run.
  void add_field(const void* address, std::type_index type, std::string path) {
    paths_.insert_or_assign({address, type}, std::move(path));
  }
  // Used by the loader: how to register the fields again after engage().
  void on_reindex(std::function<void()> reindex) { reindex_ = std::move(reindex); }
  void clear_fields() { paths_.clear(); }

 private:
  template <class F>
  void report(severity level, const F& field, std::string message) {
    diagnostic d;
    d.level = level;
    d.kind = error_kind::value_error;
    d.path = path_of(field);
    d.where = source_of(field);
    d.message = std::move(message);
    d.input = detail::value_text(field);
    out_->push_back(std::move(d));
  }

  // Keyed by address and type: a struct and its first member share an address.
  std::map<std::pair<const void*, std::type_index>, std::string> paths_;
  std::vector<diagnostic>* out_;
  provenance_map* sources_;
  std::function<void()> reindex_;
};

}  // namespace primecfg
