// Definitions of describe.hpp.
#pragma once

#include <primecfg/describe.hpp>

namespace primecfg {

namespace detail {

// One entry of S::fields(), the member already turned into its index, or a
// retired key. Entries of every field type have this one type, so a
// struct's description is a plain array (a std::tuple of 40 entry types made
// every config header slow to compile).
template <class S>
struct description_entry {
  bool is_retired = false;
  std::size_t index = 0;
  field_doc doc{};
  retired_key old{};
};

template <class E>
struct entry_owner {
  using type = void;
};
template <class S>
struct entry_owner<description_entry<S>> {
  using type = S;
};

// The struct the field entries of a description belong to.
template <class... E>
struct owner_of {
  using type = void;
};
template <class E, class... Rest>
struct owner_of<E, Rest...> {
  using type = std::conditional_t<std::is_void_v<typename entry_owner<E>::type>,
                                  typename owner_of<Rest...>::type, typename entry_owner<E>::type>;
};

}  // namespace detail

template <class S, class M, class... Extra>
constexpr detail::description_entry<S> field(M S::*member, std::string_view description, Extra... extra) {
  static_assert(((std::is_same_v<Extra, bound> || std::is_same_v<Extra, required_t>)&&...),
                "primecfg::field takes bounds (ge, gt, le, lt) and primecfg::required");
  constexpr std::size_t nbounds = (std::size_t{0} + ... + (std::is_same_v<Extra, bound> ? 1u : 0u));
  static_assert(nbounds <= 4, "primecfg::field takes at most four bounds");
  if constexpr (nbounds > 0) {
    static_assert(detail::is_numeric_v<detail::innermost_t<M>>,
                  "primecfg: bounds apply to numbers (or optionals / vectors of numbers)");
  }
  detail::description_entry<S> entry;
  entry.index = detail::field_index_of(member);
  entry.doc.description = description;
  (
      [&](auto e) {
        if constexpr (std::is_same_v<decltype(e), bound>)
          entry.doc.bounds[entry.doc.bound_count++] = e;
        else
          entry.doc.required = true;
      }(extra),
      ...);
  return entry;
}

template <class... Entries>
constexpr auto describe(Entries... entries) {
  using S = typename detail::owner_of<Entries...>::type;
  static_assert(
      ((std::is_same_v<Entries, retired_key> || std::is_same_v<Entries, detail::description_entry<S>>)&&...),
      "primecfg::describe takes primecfg::field(...) entries of one struct and primecfg::retired(...)");
  [[maybe_unused]] auto as_entry = [](auto e) {
    if constexpr (std::is_same_v<decltype(e), retired_key>) {
      detail::description_entry<S> r;
      r.is_retired = true;
      r.old = e;
      return r;
    } else {
      return e;
    }
  };
  return description<S, sizeof...(Entries)>{{as_entry(entries)...}};
}

namespace detail {

template <class T>
struct struct_doc {
  static constexpr std::size_t size = detail::field_count_v<T>;
  std::array<field_doc, size> fields{};
  std::array<int, size> times_described{};
  std::array<retired_key, 16> retired{};
  std::size_t retired_count = 0;
  bool foreign_entry = false;  // an entry whose member is not one of T's fields
};

template <class S, std::size_t N>
constexpr S* owner_pointer(const description<S, N>&) {
  return nullptr;
}

template <class T>
constexpr struct_doc<T> build_doc() {
  struct_doc<T> out;
  if constexpr (described<T>) {
    constexpr auto desc = T::fields();
    using owner = std::remove_pointer_t<decltype(owner_pointer(desc))>;
    static_assert(std::is_void_v<owner> || std::is_same_v<owner, T>,
                  "primecfg: fields() of a struct describes the members of another struct");
    for (const auto& e : desc.entries) {
      if (e.is_retired) {
        out.retired[out.retired_count++] = e.old;
      } else if (e.index < out.size) {
        out.times_described[e.index] += 1;
        out.fields[e.index] = e.doc;
      } else {
        out.foreign_entry = true;
      }
    }
  }
  return out;
}

}  // namespace detail

}  // namespace primecfg
