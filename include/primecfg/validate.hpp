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
//
// The definitions are in detail/validate.inl.
#pragma once

#include <primecfg/detail/cxx_version.hpp>  // first: C++20 or later

#include <primecfg/detail/equal.hpp>
#include <primecfg/detail/value_text.hpp>
#include <primecfg/error.hpp>

#include <primecfg/detail/fields.hpp>

#include <boost/pfr/core.hpp>

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <primecfg/detail/call_site.hpp>
#include <set>
#include <string>
#include <typeindex>
#include <utility>
#include <vector>

namespace primecfg {

// Dotted path -> where the value there came from (absent: its default).
using provenance_map = std::map<std::string, provenance, std::less<>>;

// What validate() and share() are handed: paths, sources and diagnostics of the config being loaded.
class validation {
 public:
  validation(std::vector<diagnostic>& out, provenance_map& sources) : out_(&out), sources_(&sources) {}

  // Every function below takes a field of the config being loaded, by
  // reference (`v.error(cfg.steps, ...)`). A value that is not one (a local
  // variable, a copy) has no path: the rule's call site (`rule`, filled in by
  // the compiler) is then reported as an error, never a silent "<unknown
  // field>". A temporary (`v.error(steps + 1, ...)`) does not compile.

  // Dotted path of a field of the config being validated.
  template <class F>
  std::string path_of(const F& field, detail::call_site rule = detail::call_site::current()) const;

  // Where the field's value came from.
  template <class F>
  provenance source_of(const F& field, detail::call_site rule = detail::call_site::current()) const;

  // True when a file or the command line set the field.
  template <class F>
  bool is_set(const F& field, detail::call_site rule = detail::call_site::current()) const;

  // A diagnostic at the field's path and source (with its value as the input).
  template <class F>
  void error(F&& field, std::string message, detail::call_site rule = detail::call_site::current());
  template <class F>
  void warning(F&& field, std::string message, detail::call_site rule = detail::call_site::current());
  template <class F>
  void note(F&& field, std::string message, detail::call_site rule = detail::call_site::current());

  // A rule that needs `field` to hold `value`: a default is replaced (with a
  // note saying why); a value the user set is never silently overridden, it
  // is an error. Returns true when the field now holds `value`.
  template <class F, class V>
  bool require_value(F& field, V&& value, std::string why,
                     detail::call_site rule = detail::call_site::current());

  // A value shared from another section (RL's top-level max_steps into
  // [trainer]): taken when `field` was not set, an error when it was set to
  // something else. Provenance follows the value.
  template <class F, class V>
  void inherit(F& field, const V& value, detail::call_site rule = detail::call_site::current());

  // inherit() of a value computed from `cause` (RL's output_dir / run.name into
  // trainer.output_dir); `what` names the computation in the conflict message.
  template <class F, class V, class C>
  void inherit(F& field, const V& value, std::string_view what, const C& cause,
               detail::call_site rule = detail::call_site::current());

  // Turns an optional section on with its defaults because `cause` (a shared
  // section) asks for it; its fields get their paths at once. A section the
  // user switched off ("None") stays off: that is an error naming `cause`.
  // Returns the section, or null when it stays off.
  template <class S, class C>
  S* engage(std::optional<S>& section, const C& cause, detail::call_site rule = detail::call_site::current());

  // inherit() for every field of a struct that the shared section set.
  template <class S>
  void inherit_fields(S& target, const S& shared, detail::call_site rule = detail::call_site::current());

  // Where the value at a dotted path came from (e.g. a union's "optim.type").
  provenance source_of_path(std::string_view path) const;

  // Used by the loader: registers the address of every field before rules run.
  void add_field(const void* address, std::type_index type, std::string path);
  // Used by the loader: how to register the fields again after engage().
  void on_reindex(std::function<void()> reindex) { reindex_ = std::move(reindex); }
  void clear_fields() { paths_.clear(); }

 private:
  template <class F>
  void report(severity level, const F& field, std::string message, detail::call_site rule);

  // The path of the value at `address`, or an error naming the rule that
  // passed something that is not a field (once per call site).
  std::string find_path(const void* address, std::type_index type, detail::call_site rule) const;

  // Keyed by address and type: a struct and its first member share an address.
  std::map<std::pair<const void*, std::type_index>, std::string> paths_;
  std::vector<diagnostic>* out_;
  provenance_map* sources_;
  std::function<void()> reindex_;
  mutable std::set<std::pair<std::string, std::uint_least32_t>> unknown_reported_;
};

}  // namespace primecfg

#include <primecfg/detail/validate.inl>
