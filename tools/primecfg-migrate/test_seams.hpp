// Failures only tests cause, in write_in_place (files.cpp). A link-time seam:
// primecfg-migrate links test_seams.cpp (nothing is ever injected); the tests'
// build of the tool, primecfg-migrate-faulty, links tests/migrate/faulty_seams.cpp
// instead, which the tests control. The shipped tool has no way to turn them.
#pragma once

#include <string_view>

namespace primecfg::migrate::test_seams {

// Whether the in-place write is to fail at `where`: "write" (writing the temporary
// file), "change-original" (another program appends to the original before the
// rename), "rename" (replacing the original), "no-tmpfile" (the file system has
// no O_TMPFILE: a named temporary file is used), "kill" (the process is killed
// between writing the temporary file and the rename).
bool inject_failure(std::string_view where);

}  // namespace primecfg::migrate::test_seams
