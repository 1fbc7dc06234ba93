// safetensors files, read and written without LibTorch.
//
// Layout: 8-byte little-endian header length N, then N bytes of JSON
//   {"name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ...,
//    "__metadata__": {"key": "value"}}
// then the raw little-endian tensor bytes; offsets are relative to the byte after the header.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace primecfg::train::safetensors {

enum class dtype { F64, F32, F16, BF16, I64, I32, I16, I8, U8, BOOL };

std::string_view dtype_name(dtype d);
std::size_t dtype_size(dtype d);

struct error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct tensor_info {
  std::string name;
  dtype type = dtype::F32;
  std::vector<std::int64_t> shape;
  const std::byte* data = nullptr;  // points into the mapped file
  std::size_t nbytes = 0;

  std::int64_t numel() const;
};

// A read-only, memory-mapped safetensors file. Every header entry is checked
// (dtype, shape against byte size, offsets inside the file) when it is opened,
// so a truncated or corrupt file fails here with its name in the message.
class file {
 public:
  static file open(const std::filesystem::path& path);

  file(file&&) noexcept;
  file& operator=(file&&) noexcept;
  ~file();

  const std::vector<tensor_info>& tensors() const { return tensors_; }
  const tensor_info* find(std::string_view name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::filesystem::path& path() const { return path_; }

 private:
  file() = default;
  std::filesystem::path path_;
  void* map_ = nullptr;
  std::size_t map_size_ = 0;
  std::vector<tensor_info> tensors_;
  std::map<std::string, std::string> metadata_;
};

// One tensor to write; data must stay valid until write() returns.
struct entry {
  std::string name;
  dtype type = dtype::F32;
  std::vector<std::int64_t> shape;
  const void* data = nullptr;
  std::size_t nbytes = 0;
};

// Writes entries (sorted by name, as the reference implementation does) to path.
// The caller takes care of atomicity (the trainer writes into a temp dir).
void write(const std::filesystem::path& path, const std::vector<entry>& entries,
           const std::map<std::string, std::string>& metadata = {});

// The same file written one tensor at a time, in any order: for tensors that are never
// all in memory at once (a sharded model's checkpoint gathers one weight at a time).
// The layout (names, dtypes, shapes; `data` unused) fixes the header up front; put()
// writes one tensor's bytes at its place; finish() fails, naming the tensor, unless
// every tensor was put exactly once. The caller takes care of atomicity, as for write().
class writer {
 public:
  writer(const std::filesystem::path& path, const std::vector<entry>& layout,
         const std::map<std::string, std::string>& metadata = {});
  writer(const writer&) = delete;
  writer& operator=(const writer&) = delete;
  ~writer();

  void put(std::string_view name, const void* data, std::size_t nbytes);
  void finish();

 private:
  struct slot {
    std::uint64_t offset = 0;  // from the file's start
    std::size_t nbytes = 0;
    bool written = false;
  };
  void write_at(const void* data, std::size_t nbytes, std::uint64_t offset);
  std::filesystem::path path_;
  std::map<std::string, slot, std::less<>> slots_;
  int fd_ = -1;
};

}  // namespace primecfg::train::safetensors
