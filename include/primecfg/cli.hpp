// Command-line overrides, resolved against the config's type:
//
//   prog @ base.toml @ overlay.toml --model.offload=full --data.seq-len 4096 --no-model.reshard-after-forward
//
// `@ FILE` (or `@FILE`) adds a file; `--a.b=v` and `--a.b v` set a value;
// kebab-case and snake_case both work; a boolean alone (`--flag`) is true and
// `--no-flag` false; an optional section alone (`--model.ac`) is turned on
// with its defaults and `--no-model.ac` turns it off. `true`, `false` and
// `None` after any flag are its value (`--model.ac None`), never a file. A
// key a migration retired (`--model.optim-cpu-offload`) is an error that
// names its replacement.
//
// The definitions are in detail/cli.inl.
#pragma once

#include <primecfg/detail/cxx_version.hpp>  // first: C++20 or later

#include <primecfg/detail/did_you_mean.hpp>
#include <primecfg/detail/field_names.hpp>
#include <primecfg/detail/header_only.hpp>
#include <primecfg/detail/struct_shape.hpp>
#include <primecfg/detail/type_ops.hpp>
#include <primecfg/error.hpp>
#include <primecfg/load.hpp>

#include <fmt/format.h>

#include <span>
#include <string>
#include <vector>

namespace primecfg {

// Adds the files in `args` to `src` in order, then the overrides in order:
// an override beats every file wherever it stands on the line. Problems with
// the flags themselves go to `errors`. Bare arguments are files too when
// `bare_arguments_are_files`; otherwise they are returned to the caller.
// `--help` (unless T has a field named help) and `-h` are always returned,
// never taken for a flag or a file: the caller decides what they mean.
template <class T>
std::vector<std::string> parse_command_line(std::span<const std::string> args, sources& src,
                                            std::vector<diagnostic>& errors,
                                            bool bare_arguments_are_files = false);

// Files and overrides from the command line on top of `base`; anything else
// in `args` is an error. `--help` or `-h` (unless T has a field named help)
// sets help_requested, and is an error too, so a program that does not offer
// help never runs as if it had not been asked:
//
//   auto cfg = primecfg::load_command_line<RunConfig>(args);
//   if (cfg.help_requested) {  // primecfg/help.hpp
//     std::cout << "usage: run [@ FILE...] [--key=value...]\n\n" << primecfg::help_text<RunConfig>();
//     return 0;
//   }
template <class T>
loaded<T> load_command_line(std::span<const std::string> args, sources base = {});

}  // namespace primecfg

#include <primecfg/detail/cli.inl>
