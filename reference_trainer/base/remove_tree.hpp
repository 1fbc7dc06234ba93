// Removing a file or a folder tree: what std::filesystem::remove_all does, without it.
//
// The CUDA wheels of LibTorch export their own std::filesystem::remove_all(const path&)
// from libtorch.so, and the dynamic linker binds the trainer's call to that copy (it is
// loaded before libstdc++). On the GPU machine (torch 2.11.0+cu130) that copy jumps to
// address 0: `--calibrate` died of SIGSEGV with libtorch.so's remove_all as the caller.
// nftw is libc's, which nothing interposes.
#pragma once

#include <ftw.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <system_error>

namespace primecfg::train {

namespace detail {
inline int remove_entry(const char* path, const struct stat*, int, struct FTW*) {
  return std::remove(path) == 0 ? 0 : errno;
}
}  // namespace detail

// Removes `p` and, if it is a folder, everything below it; symbolic links are removed,
// never followed. A path that does not exist is not an error. On failure `ec` holds
// the first error and what could be removed is gone.
inline void remove_tree(const std::filesystem::path& p, std::error_code& ec) noexcept {
  ec.clear();
  struct stat st;
  if (::lstat(p.c_str(), &st) != 0) {
    if (errno != ENOENT) ec.assign(errno, std::generic_category());
    return;
  }
  const int rc = ::nftw(p.c_str(), detail::remove_entry, 32, FTW_DEPTH | FTW_PHYS);
  if (rc > 0)
    ec.assign(rc, std::generic_category());
  else if (rc < 0)
    ec.assign(errno, std::generic_category());
}

// The same, throwing std::filesystem::filesystem_error naming the path.
inline void remove_tree(const std::filesystem::path& p) {
  std::error_code ec;
  remove_tree(p, ec);
  if (ec) throw std::filesystem::filesystem_error("cannot remove", p, ec);
}

}  // namespace primecfg::train
