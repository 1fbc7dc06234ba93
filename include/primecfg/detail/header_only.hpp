// Header-only, or the loader compiled once.
//
// By default primecfg is header-only: every translation unit that loads a
// config compiles the loader (reading files, decoding, the command-line
// parser, the error report), a few seconds of compile time each. A program
// that would rather compile it once builds every translation unit with
// -DPRIMECFG_HEADER_ONLY=0 and links the compiled part (meson:
// dependency('primecfg-compiled'); by hand: tools/libprimecfg/primecfg.cpp,
// which also holds toml++'s parser, so TOML_HEADER_ONLY=0 goes with it).
// Templates (the config types, load<T>, dump, schema) stay in the headers
// either way; only the functions that do not depend on a config type move.
#pragma once

#ifndef PRIMECFG_HEADER_ONLY
#define PRIMECFG_HEADER_ONLY 1
#endif

// Whether this translation unit compiles the loader's definitions: always
// when header-only, else only in the one that defines PRIMECFG_IMPLEMENTATION.
#if PRIMECFG_HEADER_ONLY || defined(PRIMECFG_IMPLEMENTATION)
#define PRIMECFG_DEFINES_LOADER 1
#else
#define PRIMECFG_DEFINES_LOADER 0
#endif

// How the loader's entry points are declared: inline when header-only.
#if PRIMECFG_HEADER_ONLY
#define PRIMECFG_LOADER_API inline
#else
#define PRIMECFG_LOADER_API
#endif
