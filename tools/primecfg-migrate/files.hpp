// Reading a config file and rewriting it in place, for the command line tool.
// What is kept and what is refused is listed in docs/migration.md ("How the
// tool works") and checked by tests/migrate/test_in_place.cpp.
#pragma once

#include <sys/stat.h>

#include <cstdint>
#include <string>
#include <vector>

namespace primecfg::migrate {

// A file as it was read: its text and the identity of the file it came from
// (the one a symbolic link points to).
struct read_result {
  std::string text;
  struct stat st {};
};

// Reads a regular file of at most `max_bytes`. Anything else (a directory, a
// FIFO, a device, a socket) is refused without opening it for reading, so a
// FIFO with no writer does not hang the tool. On failure `err` says why.
bool read_config(const std::string& path, std::uintmax_t max_bytes, read_result& out, std::string& err);

// Replaces the content of the file `path` (a symbolic link: the file it
// points to) with `data`, through a temporary file in the same folder and a
// rename, so readers see the old or the new content, never a mix. The new file
// gets the owner, group, mode (setuid, setgid and sticky bits included) and
// every extended attribute (POSIX ACLs, user.*, security.*) and the inode
// flags a user may set (chattr: nodump, noatime, ...) of the old one, and is
// checked to have them before it replaces it. Refused, with nothing
// changed: a file that is not a regular file, has more than one hard link, has
// no write permission bit, is not writable by the caller, is immutable or
// append-only (chattr +i, +a), or changed since
// `was` was taken; any failure to keep its metadata or to write the data.
bool write_in_place(const std::string& path, const struct stat& was, const std::string& data,
                    std::string& err);

// Removes the temporary files that write_in_place left beside `path` (the file
// a symbolic link points to) in a run that was killed before its rename
// (`.NAME.primecfg-migrate-XXXXXX`; only where the file system has no
// O_TMPFILE, or in the instant between naming the new file and the rename).
// Returns the paths removed.
std::vector<std::string> remove_stale_temporaries(const std::string& path);

}  // namespace primecfg::migrate
