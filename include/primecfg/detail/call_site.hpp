// Where a rule called the validation API: file, line and function, filled in by
// the compiler as a default argument. std::source_location where the standard
// library offers it; libstdc++ 12 declares it only for compilers with
// __builtin_source_location, which clang 14 (Debian 12's) lacks, so there
// __builtin_FILE/LINE/FUNCTION stand in (the function without its class).
#pragma once

#include <version>

#if defined(__cpp_lib_source_location)
#include <source_location>

namespace primecfg::detail {
using call_site = std::source_location;
}  // namespace primecfg::detail

#else

namespace primecfg::detail {

class call_site {
 public:
  static constexpr call_site current(const char* file = __builtin_FILE(), unsigned line = __builtin_LINE(),
                                     const char* function = __builtin_FUNCTION()) noexcept {
    return call_site(file, line, function);
  }
  constexpr const char* file_name() const noexcept { return file_; }
  constexpr unsigned line() const noexcept { return line_; }
  constexpr const char* function_name() const noexcept { return function_; }

 private:
  constexpr call_site(const char* file, unsigned line, const char* function) noexcept
      : file_(file), line_(line), function_(function) {}
  const char* file_;
  unsigned line_;
  const char* function_;
};

}  // namespace primecfg::detail

#endif
