// Compile-time reflection: field names (with the fallback for Boost < 1.84),
// enumerator names, field metadata and the offload dispatch.
#include "sample_config.hpp"

#include <primecfg/describe.hpp>
#include <primecfg/detail/enum_names.hpp>
#include <primecfg/detail/field_names.hpp>
#include <primecfg/model.hpp>
#include <primecfg/offload.hpp>

#include <doctest/doctest.h>

#include <string_view>
#include <vector>

#include <string_view>

using namespace std::string_view_literals;

TEST_CASE("field names come from the fallback reader and match the members") {
  constexpr auto names = primecfg::detail::field_names_fallback<sample::Sample>();
  static_assert(names.size() == 14);
  CHECK(names[0] == "flag");
  CHECK(names[6] == "color");
  CHECK(names[12] == "choice");
  CHECK(names[13] == "token");
  // Whatever backend is active gives the same answer.
  CHECK(primecfg::detail::field_names<sample::Sample>() == names);
}

TEST_CASE("member names are read from both compilers' signatures") {
  using primecfg::detail::member_names_from_signature;
  constexpr auto gcc = member_names_from_signature<2>(
      "constexpr std::string_view f() [with auto ...Ptrs = {(& holder<S>.fake_holder<S>::value.S::lr), "
      "(& holder<S>.fake_holder<S>::value.S::betas)}; std::string_view = std::basic_string_view<char>]");
  CHECK(gcc[0] == "lr");
  CHECK(gcc[1] == "betas");
  constexpr auto clang = member_names_from_signature<2>(
      "std::string_view f() [Ptrs = <{&fake_object_holder.value.max_norm}, {&fake_object_holder.value.w}>]");
  CHECK(clang[0] == "max_norm");
  CHECK(clang[1] == "w");
  // Template arguments inside a member's expression do not split the list.
  constexpr auto nested = member_names_from_signature<2>(
      "[with auto ...Ptrs = {(& h<W<int, 3> >.v.W<int, 3>::a), (& h<W<int, 3> >.v.W<int, 3>::b)}]");
  CHECK(nested[0] == "a");
  CHECK(nested[1] == "b");
  CHECK(member_names_from_signature<1>("no pointer here")[0].empty());
}

TEST_CASE("a member pointer maps to its field index at compile time") {
  static_assert(primecfg::detail::field_index_of(&sample::Sample::flag) == 0);
  static_assert(primecfg::detail::field_index_of(&sample::Sample::token) == 13);
  static_assert(primecfg::detail::field_index_of(&primecfg::ModelConfig::offload) == 1);
}

TEST_CASE("enumerator names are the TOML spelling") {
  constexpr auto& colors = primecfg::detail::enum_entries<sample::Color>;
  static_assert(colors.size() == 3);
  CHECK(colors[0].name == "red");
  CHECK(colors[2].name == "blue");
  CHECK(colors[2].value == sample::Color::blue);
  constexpr auto& offload = primecfg::detail::enum_entries<primecfg::Offload>;
  CHECK(offload.size() == 3);
  CHECK(offload[1].name == "optimizer");
}

TEST_CASE("a trailing underscore lets a keyword be a spelling") {
  constexpr auto& impls = primecfg::detail::enum_entries<primecfg::ModelImpl>;
  CHECK(impls[0].name == "auto");
  CHECK(impls[0].value == primecfg::ModelImpl::auto_);
}

TEST_CASE("field metadata is indexed like the members") {
  constexpr auto& doc = primecfg::doc_of<sample::Sample>;
  CHECK(doc.fields[0].description == "A boolean.");
  CHECK(doc.fields[3].bound_count == 2);
  CHECK(doc.fields[3].bounds[0].kind == primecfg::bound::gt);
  CHECK(doc.fields[3].bounds[1].kind == primecfg::bound::le);
  CHECK(doc.fields[13].required);
  CHECK_FALSE(doc.fields[0].required);
  REQUIRE(doc.retired_count == 1);
  CHECK(doc.retired[0].key == "old_flag");
}

TEST_CASE("every field of the shipped tree has a description") {
  // doc_of static_asserts one entry per field; here we also want text in it.
  auto all_described = [](const auto& doc) {
    for (const auto& f : doc.fields)
      if (f.description.empty()) return false;
    return true;
  };
  CHECK(all_described(primecfg::doc_of<primecfg::ModelConfig>));
  CHECK(all_described(primecfg::doc_of<primecfg::LoraConfig>));
  CHECK(all_described(primecfg::doc_of<primecfg::ActivationCheckpointConfig>));
}

TEST_CASE("visit_offload instantiates the strategy named by the runtime value") {
  auto name_of = [](primecfg::Offload mode) {
    return primecfg::visit_offload(mode, []<class Strategy>(Strategy) { return Strategy::name; });
  };
  CHECK(name_of(primecfg::Offload::none) == "none");
  CHECK(name_of(primecfg::Offload::optimizer) == "optimizer");
  CHECK(name_of(primecfg::Offload::full) == "full");
  static_assert(primecfg::FullOffload::masters_on_host && !primecfg::FullOffload::supports_grad_clipping);
  static_assert(primecfg::OptimizerOffload::moments_on_host && !primecfg::OptimizerOffload::masters_on_host);
  static_assert(!primecfg::NoOffload::moments_on_host);
}

TEST_CASE("offload_modes lists every mode once, each visiting the strategy of that mode") {
  // Every value the config accepts (the enum's described names), and no other.
  std::vector<std::string_view> listed;
  for (primecfg::Offload m : primecfg::offload_modes) {
    listed.push_back(primecfg::visit_offload(m, []<class Strategy>(Strategy) { return Strategy::name; }));
    CHECK(primecfg::visit_offload(m, []<class Strategy>(Strategy) { return Strategy::mode; }) == m);
  }
  std::vector<std::string_view> accepted;
  for (const auto& e : primecfg::detail::enum_entries<primecfg::Offload>) accepted.push_back(e.name);
  CHECK(listed == accepted);
  static_assert(primecfg::offload_strategy<primecfg::FullOffload> && !primecfg::offload_strategy<int>);
}
