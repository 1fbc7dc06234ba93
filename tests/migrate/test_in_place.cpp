// primecfg-migrate --in-place: the rewritten file keeps its identity (owner,
// group, mode, extended attributes, ACLs), and what cannot be rewritten safely
// is refused with nothing changed (docs/migration.md, "How the tool works").
#include "helpers.hpp"

#include <array>
#include <cerrno>
#include <csignal>
#include <cstdint>
#include <cstring>
#include <map>

#include <fcntl.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

using namespace mt;

namespace {

const std::string legacy =
    "# keep me\n[model]\nname = \"m\"\noptim_cpu_offload = false\nfull_offload = true\n";
const std::string legacy_done = "# keep me\n[model]\nname = \"m\"\noffload = \"full\"\n";

struct stat stat_of(const fs::path& p) {
  struct stat st {};
  REQUIRE_MESSAGE(::lstat(p.c_str(), &st) == 0, "cannot stat " << p);
  return st;
}

std::map<std::string, std::string> xattrs_of(const fs::path& p) {
  std::map<std::string, std::string> out;
  std::string names(65536, '\0');
  ssize_t n = ::llistxattr(p.c_str(), names.data(), names.size());
  REQUIRE(n >= 0);
  names.resize(static_cast<std::size_t>(n));
  for (std::size_t at = 0; at < names.size();) {
    std::string name = names.c_str() + at;
    at += name.size() + 1;
    std::string value(65536, '\0');
    ssize_t m = ::lgetxattr(p.c_str(), name.c_str(), value.data(), value.size());
    REQUIRE(m >= 0);
    value.resize(static_cast<std::size_t>(m));
    out[name] = value;
  }
  return out;
}

// A POSIX ACL in the kernel's xattr format (what setfacl writes): version 2,
// then (tag, permissions, id) entries in tag order.
std::string acl(std::initializer_list<std::array<std::uint32_t, 3>> entries) {
  std::string s;
  auto put = [&](std::uint32_t v, int bytes) {
    for (int i = 0; i < bytes; ++i) s += static_cast<char>((v >> (8 * i)) & 0xff);
  };
  put(2, 4);
  for (const auto& e : entries) {
    put(e[0], 2);
    put(e[1], 2);
    put(e[2], 4);
  }
  return s;
}
constexpr std::uint32_t user_obj = 0x01, user = 0x02, group_obj = 0x04, group = 0x08, mask = 0x10,
                        other = 0x20, undefined_id = 0xffffffff;

bool set_xattr(const fs::path& p, const std::string& name, const std::string& value) {
  return ::setxattr(p.c_str(), name.c_str(), value.data(), value.size(), 0) == 0;
}

bool is_root() { return ::geteuid() == 0; }

// The file is what it was: same inode, same content.
void check_untouched(const fs::path& p, const struct stat& before, const std::string& content) {
  CHECK(read(p) == content);
  struct stat now = stat_of(p);
  CHECK(now.st_ino == before.st_ino);
  CHECK(now.st_mtim.tv_nsec == before.st_mtim.tv_nsec);
  CHECK(now.st_mtim.tv_sec == before.st_mtim.tv_sec);
}

}  // namespace

TEST_CASE("in-place: owner, group and every mode bit (setuid, setgid, sticky) survive") {
  fs::path d = scratch("modes");
  const uid_t uid = is_root() ? 4242 : ::geteuid();
  const gid_t gid = is_root() ? 4343 : ::getegid();
  if (!is_root()) MESSAGE("not root: the owner stays the caller's; only the modes are checked");
  for (mode_t mode : {0600, 0640, 0604, 0664, 0755, 04755, 02755, 06755, 01644, 07777, 04644, 02644, 0622}) {
    CAPTURE(mode);
    fs::path f = d / "a.toml";
    write(f, legacy);
    REQUIRE(::chown(f.c_str(), uid, gid) == 0);
    REQUIRE(::chmod(f.c_str(), mode) == 0);
    REQUIRE((stat_of(f).st_mode & 07777) == mode);
    auto o = tool(d, "-i --no-validate a.toml");
    INFO(o.err);
    CHECK(o.status == 0);
    CHECK(read(f) == legacy_done);
    struct stat st = stat_of(f);
    CHECK(st.st_uid == uid);
    CHECK(st.st_gid == gid);
    CHECK((st.st_mode & 07777) == mode);
    CHECK(entries(d) == 1);
    fs::remove(f);
  }
  fs::remove_all(d);
}

TEST_CASE("in-place: extended attributes and POSIX ACLs survive") {
  fs::path d = scratch("xattrs");
  fs::path f = d / "a.toml";
  write(f, legacy);
  if (!set_xattr(f, "user.primecfg.test", "v")) {
    MESSAGE("skipped: this file system has no user.* extended attributes (" << std::strerror(errno) << ")");
    fs::remove_all(d);
    return;
  }
  REQUIRE(::chmod(f.c_str(), 0664) == 0);
  REQUIRE(set_xattr(f, "user.empty", ""));
  REQUIRE(set_xattr(f, "user.binary", std::string("a\0b\xff", 4)));
  REQUIRE(set_xattr(f, "user.big", std::string(3000, 'x')));
  // user 4242 may read and write, the owning group only read (mask rw-): as
  // `setfacl -m u:4242:rw,g::r,m::rw,o::r` leaves it.
  const std::string access = acl({{user_obj, 6, undefined_id},
                                  {user, 6, 4242},
                                  {group_obj, 4, undefined_id},
                                  {mask, 6, undefined_id},
                                  {other, 4, undefined_id}});
  REQUIRE_MESSAGE(set_xattr(f, "system.posix_acl_access", access), std::strerror(errno));
  const auto before = xattrs_of(f);
  const mode_t mode = stat_of(f).st_mode & 07777;
  REQUIRE(before.count("system.posix_acl_access") == 1);

  auto o = tool(d, "-i --no-validate a.toml");
  INFO(o.err);
  CHECK(o.status == 0);
  CHECK(read(f) == legacy_done);
  CHECK(xattrs_of(f) == before);
  CHECK((stat_of(f).st_mode & 07777) == mode);
  CHECK(entries(d) == 1);
  fs::remove_all(d);
}

TEST_CASE("in-place: a folder's default ACL does not end up on a file that had none") {
  fs::path d = scratch("default-acl");
  const std::string dflt = acl({{user_obj, 7, undefined_id},
                                {group_obj, 5, undefined_id},
                                {group, 7, 4343},
                                {mask, 7, undefined_id},
                                {other, 0, undefined_id}});
  fs::path f = d / "a.toml";
  write(f, legacy);  // before the default ACL: the file has no ACL
  REQUIRE(::chmod(f.c_str(), 0644) == 0);
  if (!set_xattr(d, "system.posix_acl_default", dflt)) {
    MESSAGE("skipped: no POSIX ACLs on this file system (" << std::strerror(errno) << ")");
    fs::remove_all(d);
    return;
  }
  const auto before = xattrs_of(f);
  REQUIRE(before.count("system.posix_acl_access") == 0);
  auto o = tool(d, "-i --no-validate a.toml");
  INFO(o.err);
  CHECK(o.status == 0);
  CHECK(read(f) == legacy_done);
  CHECK(xattrs_of(f) == before);
  CHECK((stat_of(f).st_mode & 07777) == 0644);
  fs::remove_all(d);
}

TEST_CASE("in-place: a file without write permission is refused, even for root") {
  fs::path d = scratch("readonly-file");
  fs::path f = d / "a.toml";
  for (mode_t mode : {0444, 0400, 0555, 0000}) {
    CAPTURE(mode);
    write(f, legacy);
    REQUIRE(::chmod(f.c_str(), mode) == 0);
    struct stat before = stat_of(f);
    if (!is_root() && mode == 0000) break;  // unreadable then: a different error
    auto o = tool(d, "-i --no-validate a.toml");
    CHECK(o.status == 2);
    CHECK(
        o.err.find("a.toml: error: not written (the original is unchanged): the file is read-only (mode ") !=
        std::string::npos);
    check_untouched(f, before, legacy);
    CHECK((stat_of(f).st_mode & 07777) == mode);
    CHECK(entries(d) == 1);
    // The diff and --check still work on it.
    CHECK(tool(d, "--check --no-validate a.toml").status == 1);
    REQUIRE(::chmod(f.c_str(), 0644) == 0);
    fs::remove(f);
  }
  fs::remove_all(d);
}

TEST_CASE("in-place: a file with several hard links is refused, every name unchanged") {
  fs::path d = scratch("hardlink");
  write(d / "a.toml", legacy);
  fs::create_directories(d / "sub");
  fs::create_hard_link(d / "a.toml", d / "sub" / "b.toml");
  struct stat before = stat_of(d / "a.toml");
  REQUIRE(before.st_nlink == 2);
  for (const char* name : {"a.toml", "sub/b.toml"}) {
    CAPTURE(name);
    auto o = tool(d, std::string("-i --no-validate ") + name);
    CHECK(o.status == 2);
    CHECK(o.err.find(
              "the file has 2 hard links; replacing it would leave the other names with the old content") !=
          std::string::npos);
    check_untouched(d / "a.toml", before, legacy);
    check_untouched(d / "sub" / "b.toml", before, legacy);
  }
  CHECK(stat_of(d / "a.toml").st_nlink == 2);
  CHECK(entries(d) == 2);
  CHECK(entries(d / "sub") == 1);
  // Once the other link is gone, it is migrated.
  fs::remove(d / "sub" / "b.toml");
  CHECK(tool(d, "-i --no-validate a.toml").status == 0);
  CHECK(read(d / "a.toml") == legacy_done);
  fs::remove_all(d);
}

TEST_CASE("in-place: a symbolic link stays a link and the file it points to is rewritten") {
  fs::path d = scratch("symlink");
  write(d / "real" / "a.toml", legacy);
  REQUIRE(::chmod((d / "real" / "a.toml").c_str(), 0640) == 0);
  fs::create_directories(d / "links");
  fs::create_symlink("../real/a.toml", d / "links" / "rel.toml");  // relative
  fs::create_symlink(d / "links" / "rel.toml", d / "chain.toml");  // a link to a link, absolute
  for (const char* name : {"links/rel.toml", "chain.toml"}) {
    CAPTURE(name);
    write(d / "real" / "a.toml", legacy);
    auto o = tool(d, std::string("-i --no-validate ") + name);
    INFO(o.err);
    CHECK(o.status == 0);
    CHECK(read(d / "real" / "a.toml") == legacy_done);
    CHECK((stat_of(d / "real" / "a.toml").st_mode & 07777) == 0640);
    CHECK(fs::is_symlink(d / "links" / "rel.toml"));
    CHECK(fs::read_symlink(d / "links" / "rel.toml") == "../real/a.toml");
    CHECK(fs::is_symlink(d / "chain.toml"));
    CHECK(fs::read_symlink(d / "chain.toml") == d / "links" / "rel.toml");
    CHECK(entries(d / "real") == 1);
    CHECK(entries(d / "links") == 1);
  }
  fs::create_symlink("nowhere.toml", d / "dangling.toml");
  auto dangling = tool(d, "-i dangling.toml");
  CHECK(dangling.status == 2);
  CHECK(dangling.err.find("dangling.toml: error: cannot read the file: No such file or directory") !=
        std::string::npos);
  CHECK(fs::is_symlink(d / "dangling.toml"));
  fs::remove_all(d);
}

TEST_CASE("in-place: file names of 255 bytes (NAME_MAX), ASCII and UTF-8") {
  fs::path d = scratch("long-name");
  std::string e_acute = "\xc3\xa9";  // é, 2 bytes
  std::string utf8 = "x";            // then é at odd offsets: the temporary name's cut falls inside one
  for (int i = 0; i < 124; ++i) utf8 += e_acute;
  utf8 += "x.toml";
  for (const std::string& name : {std::string(250, 'a') + ".toml", utf8}) {
    CAPTURE(name.size());
    REQUIRE(name.size() == 255);
    write(d / name, legacy);
    auto o = tool(d, "-i --no-validate " + quote(name));
    INFO(o.err);
    CHECK(o.status == 0);
    CHECK(read(d / name) == legacy_done);
    CHECK(entries(d) == 1);
    fs::remove(d / name);
  }
  fs::remove_all(d);
}

TEST_CASE("cli: FIFOs, devices, sockets and folders are refused at once, in every mode") {
  fs::path d = scratch("special");
  REQUIRE(::mkfifo((d / "fifo.toml").c_str(), 0644) == 0);
  fs::create_directories(d / "dir.toml");
  fs::create_symlink(d / "fifo.toml", d / "to-fifo.toml");
  struct case_ {
    std::string arg, says;
  };
  for (const case_& c : {case_{"fifo.toml", "is a FIFO (named pipe), not a regular file"},
                         case_{"to-fifo.toml", "is a FIFO (named pipe), not a regular file"},
                         case_{"/dev/null", "is a character device, not a regular file"},
                         case_{"/dev/zero", "is a character device, not a regular file"},
                         case_{"dir.toml", "is a directory, not a regular file"}}) {
    for (const char* mode : {"", "--check ", "-i "}) {
      CAPTURE(c.arg);
      CAPTURE(mode);
      // A FIFO nobody writes to would block open() forever: `timeout` turns a
      // hang into exit status 124.
      auto o = tool(d, mode + quote(c.arg), "timeout 20");
      CHECK(o.status == 2);
      CHECK(o.err == c.arg + ": error: cannot read the file: " + c.says + "\n");
    }
  }
  CHECK(fs::is_fifo(d / "fifo.toml"));
  CHECK(entries(d) == 3);
  fs::remove_all(d);
}

TEST_CASE("in-place: a full disk is an error; the original stays, no temporary file") {
  if (!is_root()) {
    MESSAGE("skipped: mounting a small tmpfs needs root");
    return;
  }
  fs::path d = scratch("full-disk");
  fs::path mnt = d / "mnt";
  fs::create_directories(mnt);
  if (::mount("tmpfs", mnt.c_str(), "tmpfs", 0, "size=64k") != 0) {
    MESSAGE("skipped: cannot mount a tmpfs here (" << std::strerror(errno) << ")");
    fs::remove_all(d);
    return;
  }
  // 40 KB: there is room for the file, not for a second copy of it.
  const std::string big = legacy + "# " + std::string(40000, 'p') + "\n";
  write(mnt / "a.toml", big);
  struct stat before = stat_of(mnt / "a.toml");
  auto o = tool(mnt, "-i --no-validate a.toml");
  CHECK(o.status == 2);
  CHECK(o.err.find("a.toml: error: not written (the original is unchanged): cannot write ") !=
        std::string::npos);
  CHECK(o.err.find("No space left on device") != std::string::npos);
  check_untouched(mnt / "a.toml", before, big);
  CHECK(entries(mnt) == 1);
  CHECK(::umount(mnt.c_str()) == 0);
  fs::remove_all(d);
}

TEST_CASE("in-place: past the file size limit (ulimit -f) is an error, not a silent SIGXFSZ") {
  fs::path d = scratch("fsize");
  const std::string big = legacy + "# " + std::string(40000, 'p') + "\n";
  write(d / "a.toml", big);
  struct stat before = stat_of(d / "a.toml");
  // 16 blocks: 8 KiB (dash counts 512 bytes a block) or 16 KiB (bash), both
  // less than the file and more than the messages.
  auto o = tool(d, "-i --no-validate a.toml", "ulimit -f 16;");
  CHECK(o.status == 2);
  CHECK(o.err.find("a.toml: error: not written (the original is unchanged): cannot write ") !=
        std::string::npos);
  CHECK(o.err.find("(the file size limit, ulimit -f): File too large") != std::string::npos);
  check_untouched(d / "a.toml", before, big);
  CHECK(entries(d) == 1);
  fs::remove_all(d);
}

TEST_CASE("in-place: a file that changes while it is migrated is left alone") {
  fs::path d = scratch("changed");
  write(d / "a.toml", legacy);
  auto o = faulty_tool(d, "-i --no-validate a.toml", "change-original");
  CHECK(o.status == 2);
  CHECK(o.err.find(
            "a.toml: error: not written (the original is unchanged): the file changed since it was read") !=
        std::string::npos);
  CHECK(read(d / "a.toml") == legacy + "#\n");  // the other program's write is kept
  CHECK(entries(d) == 1);
  fs::remove_all(d);
}

TEST_CASE("cli: a file larger than the loader's limit is refused") {
  fs::path d = scratch("too-large");
  const std::uintmax_t limit = loader_max_bytes();
  std::string text = legacy + "#" + std::string(limit - legacy.size() - 1, 'p') + "\n";
  write(d / "a.toml", text);
  auto o = tool(d, "-i --no-validate a.toml");
  CHECK(o.status == 2);
  CHECK(o.err == "a.toml: error: cannot read the file: is " + std::to_string(text.size()) +
                     " bytes; config files are limited to 16 MiB (what the primecfg loader reads)\n");
  CHECK(read(d / "a.toml") == text);
  fs::remove_all(d);
}

TEST_CASE("a migration whose result would exceed the loader's limit is refused") {
  // No shipped step makes a file longer (each replaces keys by a shorter
  // one); a rename to a longer name does.
  const std::vector<step> grow = {rename_step(1, "0001_grow", "attn -> attention_implementation",
                                              {{model_tables(), "attn", "attention_implementation", ""}})};
  const std::string head = "[model]\nattn = \"sdpa\"\n";
  const std::uintmax_t limit = loader_max_bytes();
  std::string text = head + "#" + std::string(limit - head.size() - 2, 'p') + "\n";
  REQUIRE(text.size() == limit);
  file_result r = migrate_text(text, {}, grow);
  CHECK(r.failed());
  CHECK(has(r, level::error,
            "the migrated config would be " + std::to_string(limit + 20) +
                " bytes, more than the 16 MiB the primecfg loader reads; nothing was changed"));
  CHECK(r.migrated == text);
  // 20 bytes less padding: exactly the limit, accepted.
  text = head + "#" + std::string(limit - head.size() - 2 - 20, 'p') + "\n";
  r = migrate_text(text, {}, grow);
  CHECK_FALSE(r.failed());
  CHECK(r.migrated.size() == limit);
}

TEST_CASE("in-place: as another user, a file that cannot keep its owner, or is not writable, is refused") {
  if (!is_root() || std::system("setpriv --version >/dev/null 2>&1") != 0) {
    MESSAGE("skipped: needs root and setpriv (util-linux) to run the tool as another user");
    return;
  }
  fs::path d = scratch("other-user");
  REQUIRE(::chmod(d.c_str(), 0777) == 0);  // anyone may create the temporary file
  // The tool itself must be reachable by uid 65534 (the build folder may not be).
  const fs::path exe = d / "tool";
  fs::copy_file(env("PRIMECFG_MIGRATE"), exe);
  REQUIRE(::chmod(exe.c_str(), 0755) == 0);
  auto run_as_nobody = [&](const std::string& args) {
    // tool() runs $PRIMECFG_MIGRATE; point it at the copy for this call.
    std::string saved = env("PRIMECFG_MIGRATE");
    ::setenv("PRIMECFG_MIGRATE", exe.c_str(), 1);
    outcome o = tool(d, args, "setpriv --reuid=65534 --regid=65534 --clear-groups");
    ::setenv("PRIMECFG_MIGRATE", saved.c_str(), 1);
    return o;
  };
  fs::path f = d / "a.toml";

  // Writable by everyone, owned by 4242: nobody could rewrite it, but the new
  // file would belong to nobody. Refused (the old tool changed the owner silently).
  write(f, legacy);
  REQUIRE(::chown(f.c_str(), 4242, 4343) == 0);
  REQUIRE(::chmod(f.c_str(), 0666) == 0);
  struct stat before = stat_of(f);
  auto o = run_as_nobody("-i --no-validate a.toml");
  CHECK(o.status == 2);
  CHECK(o.err.find("cannot give the new file the owner and group of the old one (uid 4242, gid 4343") !=
        std::string::npos);
  check_untouched(f, before, legacy);
  CHECK(stat_of(f).st_uid == 4242);
  CHECK(entries(d) == 2);  // a.toml and the tool

  // Not writable by nobody (0644, owned by 4242), in a folder everyone may write into:
  // the rename alone would have replaced it (the old tool did).
  REQUIRE(::chmod(f.c_str(), 0644) == 0);
  before = stat_of(f);
  o = run_as_nobody("-i --no-validate a.toml");
  CHECK(o.status == 2);
  CHECK(o.err.find("the file is not writable by you: Permission denied") != std::string::npos);
  check_untouched(f, before, legacy);
  CHECK(entries(d) == 2);

  // A file of its own is migrated, owner kept.
  REQUIRE(::chown(f.c_str(), 65534, 65534) == 0);
  o = run_as_nobody("-i --no-validate a.toml");
  INFO(o.err);
  CHECK(o.status == 0);
  CHECK(read(f) == legacy_done);
  CHECK(stat_of(f).st_uid == 65534);
  fs::remove_all(d);
}

TEST_CASE("in-place: inode flags (chattr) are kept; an immutable or append-only file is refused") {
  fs::path d = scratch("chattr");
  fs::path f = d / "a.toml";
  write(f, legacy);
  auto flags_of = [](const fs::path& p) {
    int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
    REQUIRE(fd >= 0);
    int flags = 0;
    const int rc = ::ioctl(fd, FS_IOC_GETFLAGS, &flags);
    ::close(fd);
    return rc == 0 ? flags : -1;
  };
  auto set_flags = [](const fs::path& p, int flags) {
    int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
    REQUIRE(fd >= 0);
    const int rc = ::ioctl(fd, FS_IOC_SETFLAGS, &flags);
    ::close(fd);
    return rc == 0;
  };
  const int plain = flags_of(f);
  if (plain < 0 || !set_flags(f, plain | FS_NODUMP_FL | FS_NOATIME_FL)) {
    MESSAGE("skipped: this file system has no settable inode flags (" << std::strerror(errno) << ")");
    fs::remove_all(d);
    return;
  }
  auto o = tool(d, "-i --no-validate a.toml");
  INFO(o.err);
  CHECK(o.status == 0);
  CHECK(read(f) == legacy_done);
  CHECK((flags_of(f) & (FS_NODUMP_FL | FS_NOATIME_FL)) == (FS_NODUMP_FL | FS_NOATIME_FL));

  if (!is_root()) {
    MESSAGE("chattr +i/+a needs root (CAP_LINUX_IMMUTABLE): not checked");
    fs::remove_all(d);
    return;
  }
  for (const auto& [flag, says] : {std::pair{FS_IMMUTABLE_FL, "the file is immutable (chattr +i)"},
                                   std::pair{FS_APPEND_FL, "the file is append-only (chattr +a)"}}) {
    CAPTURE(says);
    write(f, legacy);
    REQUIRE(set_flags(f, plain | flag));
    struct stat before = stat_of(f);
    o = tool(d, "-i --no-validate a.toml");
    CHECK(o.status == 2);
    CHECK(o.err.find(std::string("a.toml: error: not written (the original is unchanged): ") + says) !=
          std::string::npos);
    check_untouched(f, before, legacy);
    CHECK(entries(d) == 1);
    REQUIRE(set_flags(f, plain));
  }
  fs::remove_all(d);
}

// Issue 25: `-i` killed between writing its temporary file and the rename left
// `.FILE.primecfg-migrate-XXXXXX` beside the file forever.
TEST_CASE("in-place: a run killed before the rename leaves no temporary file (O_TMPFILE)") {
  fs::path d = scratch("killed");
  write(d / "a.toml", legacy);
  auto o = faulty_tool(d, "-i --no-validate a.toml", "kill");
  CHECK((o.status == -1 || o.status == 128 + SIGKILL));  // killed (the shell may report it)
  CHECK(read(d / "a.toml") == legacy);
  CHECK(entries(d) == 1);
  // without O_TMPFILE the result is the same, and no temporary file stays either
  CHECK(faulty_tool(d, "-i --no-validate a.toml", "no-tmpfile").status == 0);
  CHECK(read(d / "a.toml") == legacy_done);
  CHECK(entries(d) == 1);
  fs::remove_all(d);
}

TEST_CASE("in-place: a temporary file left by a killed run is removed by the next run, with a note") {
  fs::path d = scratch("stale");
  write(d / "a.toml", legacy);
  // where the file system has no O_TMPFILE, a killed run leaves its named temporary file
  auto killed = faulty_tool(d, "-i --no-validate a.toml", "no-tmpfile,kill");
  CHECK((killed.status == -1 || killed.status == 128 + SIGKILL));
  CHECK(read(d / "a.toml") == legacy);
  REQUIRE(entries(d) == 2);
  std::string stale;
  for (const auto& e : fs::directory_iterator(d))
    if (e.path().filename() != "a.toml") stale = e.path().filename().string();
  CHECK(stale.rfind(".a.toml.primecfg-migrate-", 0) == 0);
  // another file's temporary, and names that only look alike, are left alone
  write(d / ".b.toml.primecfg-migrate-Ab3xYz", "b");
  write(d / ".a.toml.primecfg-migrate-keep", "k");
  write(d / "a.toml.primecfg-migrate-Ab3xYz", "c");
  auto next = tool(d, "-i --no-validate a.toml");
  CHECK(next.status == 0);
  CHECK(next.err.find("a.toml: note: removed " + stale +
                      ", a temporary file left by an earlier run that was interrupted\n") !=
        std::string::npos);
  CHECK(read(d / "a.toml") == legacy_done);
  CHECK_FALSE(fs::exists(d / stale));
  CHECK(fs::exists(d / ".b.toml.primecfg-migrate-Ab3xYz"));
  CHECK(fs::exists(d / ".a.toml.primecfg-migrate-keep"));
  CHECK(fs::exists(d / "a.toml.primecfg-migrate-Ab3xYz"));
  CHECK(entries(d) == 4);
  // a file that needs nothing is cleaned up too
  write(d / ".a.toml.primecfg-migrate-Zz9999", "z");
  auto clean = tool(d, "-i --no-validate a.toml");
  CHECK(clean.status == 0);
  CHECK(clean.err.find("note: removed") != std::string::npos);
  CHECK(entries(d) == 4);
  fs::remove_all(d);
}
