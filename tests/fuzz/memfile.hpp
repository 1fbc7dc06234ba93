// An in-memory file with a path (/proc/self/fd/N), for fuzz targets whose
// code under test opens a path: no disk traffic, nothing left behind.
#pragma once

#include "fuzz_check.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <string>

namespace primecfg::fuzz {

class memfile {
 public:
  explicit memfile(const char* name) : fd_(::memfd_create(name, MFD_CLOEXEC)) {
    check(fd_ >= 0, "memfd_create");
    path_ = "/proc/self/fd/" + std::to_string(fd_);
  }
  memfile(const memfile&) = delete;
  memfile& operator=(const memfile&) = delete;
  ~memfile() { ::close(fd_); }

  // Replaces the content.
  void set(const void* data, std::size_t size) {
    check(::ftruncate(fd_, 0) == 0, "ftruncate");
    const char* p = static_cast<const char*>(data);
    std::size_t done = 0;
    while (done < size) {
      ssize_t n = ::pwrite(fd_, p + done, size - done, static_cast<off_t>(done));
      check(n > 0, "pwrite to a memfd");
      done += static_cast<std::size_t>(n);
    }
  }
  const std::string& path() const { return path_; }

 private:
  int fd_;
  std::string path_;
};

}  // namespace primecfg::fuzz
