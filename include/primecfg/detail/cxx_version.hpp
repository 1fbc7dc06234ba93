// C++20 or later, checked before anything else in every public header. The
// standard is the including program's choice (the .pc files set none); below
// C++20 this stops at once with a message saying so, instead of hundreds of
// errors from deep inside the headers.
#pragma once

#if !defined(__cplusplus) || (__cplusplus < 202002L && !(defined(_MSVC_LANG) && _MSVC_LANG >= 202002L))
#error "primecfg needs C++20 or later: compile with -std=c++20 (or -std=c++23, ...)"
#endif
