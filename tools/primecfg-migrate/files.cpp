// Reading a config file and rewriting it in place (files.hpp).
#include "files.hpp"

#include "test_seams.hpp"

#include <fcntl.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <climits>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace fs = std::filesystem;

namespace primecfg::migrate {

namespace {

std::string errno_text(int e) { return std::strerror(e); }

const char* kind_of(mode_t m) {
  if (S_ISDIR(m)) return "a directory";
  if (S_ISFIFO(m)) return "a FIFO (named pipe)";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISSOCK(m)) return "a socket";
  if (S_ISLNK(m)) return "a symbolic link";
  return "of an unknown file type";
}

std::string octal(mode_t m) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%04o", static_cast<unsigned>(m & 07777));
  return buf;
}

// Closes on every path out.
struct fd_guard {
  int fd = -1;
  fd_guard() = default;
  explicit fd_guard(int f) : fd(f) {}
  fd_guard(const fd_guard&) = delete;
  fd_guard& operator=(const fd_guard&) = delete;
  ~fd_guard() {
    if (fd >= 0) ::close(fd);
  }
};

bool same_file(const struct stat& a, const struct stat& b) {
  return a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

// Same file, same content and metadata as far as stat can tell.
bool unchanged(const struct stat& a, const struct stat& b) {
  return same_file(a, b) && a.st_size == b.st_size && a.st_mtim.tv_sec == b.st_mtim.tv_sec &&
         a.st_mtim.tv_nsec == b.st_mtim.tv_nsec && a.st_ctim.tv_sec == b.st_ctim.tv_sec &&
         a.st_ctim.tv_nsec == b.st_ctim.tv_nsec;
}

using xattr_map = std::map<std::string, std::string>;

// Every extended attribute of `fd` (a file system without them: none).
bool read_xattrs(int fd, xattr_map& out, std::string& err) {
  out.clear();
  std::string names;
  while (true) {
    ssize_t n = ::flistxattr(fd, nullptr, 0);
    if (n < 0 && (errno == ENOTSUP)) return true;
    if (n < 0) {
      err = "cannot list the extended attributes: " + errno_text(errno);
      return false;
    }
    names.assign(static_cast<std::size_t>(n), '\0');
    if (n == 0) break;
    ssize_t m = ::flistxattr(fd, names.data(), names.size());
    if (m < 0 && errno == ERANGE) continue;  // grew in between
    if (m < 0) {
      err = "cannot list the extended attributes: " + errno_text(errno);
      return false;
    }
    names.resize(static_cast<std::size_t>(m));
    break;
  }
  for (std::size_t at = 0; at < names.size();) {
    std::size_t end = names.find('\0', at);
    if (end == std::string::npos) end = names.size();
    std::string name = names.substr(at, end - at);
    at = end + 1;
    if (name.empty()) continue;
    std::string value;
    while (true) {
      ssize_t n = ::fgetxattr(fd, name.c_str(), nullptr, 0);
      if (n < 0 && errno == ENODATA) break;  // removed in between
      if (n < 0) {
        err = "cannot read the extended attribute " + name + ": " + errno_text(errno);
        return false;
      }
      value.assign(static_cast<std::size_t>(n), '\0');
      if (n == 0) break;
      ssize_t m = ::fgetxattr(fd, name.c_str(), value.data(), value.size());
      if (m < 0 && errno == ERANGE) continue;
      if (m < 0) {
        err = "cannot read the extended attribute " + name + ": " + errno_text(errno);
        return false;
      }
      value.resize(static_cast<std::size_t>(m));
      break;
    }
    out.emplace(std::move(name), std::move(value));
  }
  return true;
}

// The temporary file's name: "." + the file's name + a suffix, the file's name
// shortened (at a UTF-8 character boundary) so the whole fits in the folder's
// limit on name length.
std::string temp_name(const fs::path& dir, const std::string& name) {
  const std::string suffix = ".primecfg-migrate-XXXXXX";
  long name_max = ::pathconf(dir.c_str(), _PC_NAME_MAX);
  if (name_max <= 0) name_max = NAME_MAX;
  const long room = std::max(1L, name_max - 1 - static_cast<long>(suffix.size()));
  std::size_t keep = name.size();
  if (keep > static_cast<std::size_t>(room)) {
    keep = static_cast<std::size_t>(room);
    while (keep > 0 && (static_cast<unsigned char>(name[keep]) & 0xC0) == 0x80) --keep;
  }
  std::string leaf = ".";
  leaf.append(name, 0, keep);
  leaf += suffix;
  return (dir / leaf).string();
}

// The part of temp_name() before the random characters: every temporary this
// tool makes for `name` in `dir` starts with it and has six characters more.
std::string temp_prefix(const fs::path& dir, const std::string& name) {
  std::string t = temp_name(dir, name);
  return fs::path(t.substr(0, t.size() - 6)).filename().string();
}

// The file `path` resolves to (a symbolic link: the file it points to).
bool resolve(const std::string& path, fs::path& target, std::string& err) {
  std::error_code ec;
  target = path;
  if (fs::is_symlink(target, ec)) {
    target = fs::canonical(target, ec);
    if (ec) {
      err = "cannot resolve the symbolic link: " + ec.message();
      return false;
    }
  }
  return true;
}

// Gives the unnamed temporary file `fd` (O_TMPFILE) a name like temp_name()'s
// in `dir`, for the rename; false with errno set when it cannot.
bool link_unnamed(int fd, const fs::path& dir, const std::string& name, std::string& linked) {
  const std::string pattern = temp_name(dir, name);
  const std::string proc = "/proc/self/fd/" + std::to_string(fd);
  static constexpr char letters[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  std::uint64_t seed =
      static_cast<std::uint64_t>(::getpid()) * 0x9E3779B97F4A7C15ull ^
      static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  for (int attempt = 0; attempt < 100; ++attempt) {
    std::string candidate = pattern;
    for (std::size_t i = candidate.size() - 6; i < candidate.size(); ++i) {
      seed = seed * 6364136223846793005ull + 1442695040888963407ull;
      candidate[i] = letters[(seed >> 33) % (sizeof letters - 1)];
    }
    // Through /proc (any user); without /proc mounted, AT_EMPTY_PATH (which needs
    // CAP_DAC_READ_SEARCH).
    int r = ::linkat(AT_FDCWD, proc.c_str(), AT_FDCWD, candidate.c_str(), AT_SYMLINK_FOLLOW);
    if (r != 0 && errno == ENOENT) r = ::linkat(fd, "", AT_FDCWD, candidate.c_str(), AT_EMPTY_PATH);
    if (r == 0) {
      linked = candidate;
      return true;
    }
    if (errno != EEXIST) return false;
  }
  errno = EEXIST;
  return false;
}

}  // namespace

std::vector<std::string> remove_stale_temporaries(const std::string& path) {
  std::vector<std::string> removed;
  fs::path target;
  std::string err;
  if (!resolve(path, target, err)) return removed;
  fs::path dir = target.parent_path().empty() ? fs::path(".") : target.parent_path();
  const std::string prefix = temp_prefix(dir, target.filename().string());
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string leaf = it->path().filename().string();
    if (leaf.size() != prefix.size() + 6 || leaf.compare(0, prefix.size(), prefix) != 0) continue;
    if (!std::all_of(leaf.begin() + static_cast<std::ptrdiff_t>(prefix.size()), leaf.end(),
                     [](char c) { return std::isalnum(static_cast<unsigned char>(c)) != 0; }))
      continue;
    std::error_code type_ec;
    if (!it->is_regular_file(type_ec) || it->is_symlink(type_ec)) continue;
    if (::unlink(it->path().c_str()) == 0)
      removed.push_back(target.parent_path().empty() ? leaf : it->path().string());
  }
  return removed;
}

bool read_config(const std::string& path, std::uintmax_t max_bytes, read_result& out, std::string& err) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    err = errno_text(errno);
    return false;
  }
  auto refuse_type = [&](mode_t m) {
    err = std::string("is ") + kind_of(m) + ", not a regular file";
    return false;
  };
  if (!S_ISREG(st.st_mode)) return refuse_type(st.st_mode);
  auto too_large = [&](std::uintmax_t size, bool at_least) {
    err = std::string("is ") + (at_least ? "more than " : "") + std::to_string(size) +
          " bytes; config files are limited to " + std::to_string(max_bytes >> 20) +
          " MiB (what the primecfg loader reads)";
    return false;
  };
  if (static_cast<std::uintmax_t>(st.st_size) > max_bytes) return too_large(st.st_size, false);
  // O_NONBLOCK: should the name now be a FIFO, opening it does not wait for a writer.
  fd_guard fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY));
  if (fd.fd < 0) {
    err = errno_text(errno);
    return false;
  }
  if (::fstat(fd.fd, &st) != 0) {
    err = "cannot stat: " + errno_text(errno);
    return false;
  }
  if (!S_ISREG(st.st_mode)) return refuse_type(st.st_mode);
  std::string data;
  char chunk[65536];
  while (true) {
    ssize_t n = ::read(fd.fd, chunk, sizeof chunk);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      err = "read failed: " + errno_text(errno);
      return false;
    }
    if (n == 0) break;
    data.append(chunk, static_cast<std::size_t>(n));
    if (data.size() > max_bytes) return too_large(max_bytes, true);
  }
  out.text = std::move(data);
  out.st = st;
  return true;
}

bool write_in_place(const std::string& path, const struct stat& was, const std::string& data,
                    std::string& err) {
  // A symbolic link stays a link: the file it points to is rewritten.
  fs::path target;
  if (!resolve(path, target, err)) return false;
  fd_guard old(::open(target.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY | O_NOFOLLOW));
  if (old.fd < 0) {
    err = "cannot open " + target.string() + ": " + errno_text(errno);
    return false;
  }
  struct stat st {};
  if (::fstat(old.fd, &st) != 0) {
    err = "cannot stat " + target.string() + ": " + errno_text(errno);
    return false;
  }
  if (!S_ISREG(st.st_mode)) {
    err = std::string("is ") + kind_of(st.st_mode) + ", not a regular file";
    return false;
  }
  if (!unchanged(st, was)) {
    err = "the file changed since it was read (another program wrote it?); run the tool again";
    return false;
  }
  if (st.st_nlink > 1) {
    err = "the file has " + std::to_string(st.st_nlink) +
          " hard links; replacing it would leave the other names with the old content. Migrate a "
          "copy and write it back (primecfg-migrate -i copy.toml && cat copy.toml > FILE), or remove the "
          "other links";
    return false;
  }
  // Inode flags (chattr): a file that may not be replaced or rewritten says so
  // (the rename would fail, or append-only would be lost); the others are
  // copied. A file system without them has none.
  int flags = 0;
  const bool have_flags = ::ioctl(old.fd, FS_IOC_GETFLAGS, &flags) == 0;
  if (have_flags && (flags & (FS_IMMUTABLE_FL | FS_APPEND_FL)) != 0) {
    err = std::string("the file is ") +
          ((flags & FS_IMMUTABLE_FL) != 0 ? "immutable (chattr +i)" : "append-only (chattr +a)");
    return false;
  }
  if ((st.st_mode & 0222) == 0) {
    err = "the file is read-only (mode " + octal(st.st_mode) +
          "); make it writable first (chmod u+w) if it should be migrated";
    return false;
  }
  if (::faccessat(AT_FDCWD, target.c_str(), W_OK, AT_EACCESS) != 0) {
    err = "the file is not writable by you: " + errno_text(errno);
    return false;
  }
  xattr_map attrs;
  if (!read_xattrs(old.fd, attrs, err)) return false;

  // The new content goes to an unnamed file (O_TMPFILE) where the file system
  // allows it: a run killed before the rename leaves nothing behind. It gets a
  // name only just before the rename. Elsewhere (EOPNOTSUPP, or EISDIR from an
  // old kernel) a named temporary file is used from the start; one left by a
  // killed run is removed by the next (remove_stale_temporaries).
  fs::path dir = target.parent_path().empty() ? fs::path(".") : target.parent_path();
  const std::string leaf = target.filename().string();
  std::string tmp;  // the temporary file's name, once it has one
  fd_guard fd;
  if (!test_seams::inject_failure("no-tmpfile"))
    fd.fd = ::open(dir.c_str(), O_TMPFILE | O_WRONLY | O_CLOEXEC, 0600);
  const bool named = fd.fd < 0;
  if (named) {
    tmp = temp_name(dir, leaf);
    fd.fd = ::mkostemp(tmp.data(), O_CLOEXEC);
    if (fd.fd < 0) {
      err = "cannot create a temporary file in " + dir.string() + ": " + errno_text(errno);
      return false;
    }
  }
  // How messages name it.
  const std::string tmp_desc = named ? tmp : "the new file (unnamed, in " + dir.string() + ")";
  auto fail = [&](const std::string& what, int e) {
    err = what + (e != 0 ? ": " + errno_text(e) : std::string());
    if (fd.fd >= 0) ::close(fd.fd);
    fd.fd = -1;
    if (!tmp.empty()) ::unlink(tmp.c_str());
    return false;
  };

  std::size_t done = 0;
  while (done < data.size()) {
    if (test_seams::inject_failure("write")) return fail("cannot write " + tmp_desc, EIO);
    ssize_t n = ::write(fd.fd, data.data() + done, data.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int e = errno;
      return fail("cannot write " + tmp_desc + (e == EFBIG ? " (the file size limit, ulimit -f)" : ""), e);
    }
    done += static_cast<std::size_t>(n);
  }

  // Owner first: changing it clears setuid/setgid and file capabilities, which
  // are set again below.
  if (::fchown(fd.fd, st.st_uid, st.st_gid) != 0) {
    const int e = errno;
    struct stat now {};
    if (::fstat(fd.fd, &now) != 0 || now.st_uid != st.st_uid || now.st_gid != st.st_gid)
      return fail("cannot give the new file the owner and group of the old one (uid " +
                      std::to_string(st.st_uid) + ", gid " + std::to_string(st.st_gid) +
                      "; run as the file's owner or as root)",
                  e);
  }
  // Extended attributes: exactly the old file's, none inherited from the folder
  // (a default ACL, say) that the old file does not have.
  xattr_map inherited;
  if (!read_xattrs(fd.fd, inherited, err)) return fail("the new file: " + err, 0);
  for (const auto& [name, value] : inherited)
    if (attrs.count(name) == 0 && ::fremovexattr(fd.fd, name.c_str()) != 0 && errno != ENODATA) {
      const int e = errno;
      return fail("cannot remove the extended attribute " + name + " from the new file", e);
    }
  for (const auto& [name, value] : attrs)
    if (::fsetxattr(fd.fd, name.c_str(), value.data(), value.size(), 0) != 0) {
      const int e = errno;
      return fail("cannot copy the extended attribute " + name, e);
    }
  if (have_flags) {
    int tmp_flags = 0;
    if (::ioctl(fd.fd, FS_IOC_GETFLAGS, &tmp_flags) != 0) {
      const int e = errno;
      return fail("cannot read the inode flags of " + tmp_desc, e);
    }
    const int want = (tmp_flags & ~FS_FL_USER_MODIFIABLE) | (flags & FS_FL_USER_MODIFIABLE);
    if (want != tmp_flags && ::ioctl(fd.fd, FS_IOC_SETFLAGS, &want) != 0) {
      const int e = errno;
      return fail("cannot copy the file's inode flags (chattr) to the new file", e);
    }
  }
  if (::fchmod(fd.fd, st.st_mode & 07777) != 0) {
    const int e = errno;
    return fail("cannot set the mode of " + tmp_desc, e);
  }

  // Check that it all took (the kernel may drop a setgid bit, say) before the
  // new file replaces the old one.
  struct stat now {};
  if (::fstat(fd.fd, &now) != 0) {
    const int e = errno;
    return fail("cannot stat " + tmp_desc, e);
  }
  if (now.st_uid != st.st_uid || now.st_gid != st.st_gid)
    return fail("the new file would not keep the owner and group of the old one", 0);
  if ((now.st_mode & 07777) != (st.st_mode & 07777))
    return fail(
        "the new file would not keep the mode " + octal(st.st_mode) + " (it got " + octal(now.st_mode) + ")",
        0);
  xattr_map copied;
  if (!read_xattrs(fd.fd, copied, err)) return fail("the new file: " + err, 0);
  if (copied != attrs) return fail("the new file would not keep the extended attributes of the old one", 0);
  int copied_flags = 0;
  if (have_flags && (::ioctl(fd.fd, FS_IOC_GETFLAGS, &copied_flags) != 0 ||
                     (copied_flags & FS_FL_USER_MODIFIABLE) != (flags & FS_FL_USER_MODIFIABLE)))
    return fail("the new file would not keep the inode flags (chattr) of the old one", 0);

  if (::fsync(fd.fd) != 0) {
    const int e = errno;
    return fail("cannot flush " + tmp_desc, e);
  }
  if (test_seams::inject_failure("kill")) ::raise(SIGKILL);  // killed between the write and the rename
  if (!named && !link_unnamed(fd.fd, dir, leaf, tmp)) {
    const int e = errno;
    return fail("cannot give the new file a name in " + dir.string(), e);
  }
  const int closed = ::close(fd.fd);
  fd.fd = -1;
  if (closed != 0) {
    const int e = errno;
    return fail("cannot close " + tmp_desc, e);
  }

  if (test_seams::inject_failure("change-original")) {  // another program writes the file meanwhile
    int w = ::open(target.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
    if (w >= 0) {
      if (::write(w, "#\n", 2) != 2) { /* the check below then passes; the test says so */
      }
      ::close(w);
    }
  }
  struct stat last {
  }, at_path{};
  if (::fstat(old.fd, &last) != 0 || !unchanged(last, was) || ::stat(target.c_str(), &at_path) != 0 ||
      !same_file(at_path, was))
    return fail("the file changed since it was read (another program wrote it?); run the tool again", 0);
  if (test_seams::inject_failure("rename")) return fail("cannot rename " + tmp, EIO);
  if (::rename(tmp.c_str(), target.c_str()) != 0) {
    const int e = errno;
    return fail("cannot replace the file", e);
  }

  // The rename itself, on disk.
  fd_guard d(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (d.fd >= 0 && ::fsync(d.fd) != 0 && errno != EINVAL)
    err = "written, but flushing the folder failed: " + errno_text(errno);
  return true;
}

}  // namespace primecfg::migrate
