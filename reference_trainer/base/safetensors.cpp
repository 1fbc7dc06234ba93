#include "base/safetensors.hpp"

#include "base/strict_json.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <utility>

namespace primecfg::train::safetensors {

namespace {

namespace json = strict_json;

struct dtype_row {
  dtype d;
  std::string_view name;
  std::size_t size;
};
constexpr dtype_row kDtypes[] = {
    {dtype::F64, "F64", 8}, {dtype::F32, "F32", 4},   {dtype::F16, "F16", 2}, {dtype::BF16, "BF16", 2},
    {dtype::I64, "I64", 8}, {dtype::I32, "I32", 4},   {dtype::I16, "I16", 2}, {dtype::I8, "I8", 1},
    {dtype::U8, "U8", 1},   {dtype::BOOL, "BOOL", 1},
};

[[noreturn]] void fail(const std::filesystem::path& p, const std::string& what) {
  throw error(p.string() + ": " + what);
}

}  // namespace

std::string_view dtype_name(dtype d) {
  for (const auto& r : kDtypes)
    if (r.d == d) return r.name;
  return "?";
}

std::size_t dtype_size(dtype d) {
  for (const auto& r : kDtypes)
    if (r.d == d) return r.size;
  return 0;
}

std::int64_t tensor_info::numel() const {
  std::int64_t n = 1;
  for (auto s : shape) n *= s;
  return n;
}

file file::open(const std::filesystem::path& path) {
  file f;
  f.path_ = path;
  // O_NONBLOCK: a FIFO would otherwise block the open until a writer came.
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) fail(path, std::string("cannot open: ") + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    fail(path, "cannot stat");
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    fail(path, "not a regular file (a FIFO, a device or a folder cannot hold tensors)");
  }
  f.map_size_ = static_cast<std::size_t>(st.st_size);
  if (f.map_size_ < 8) {
    ::close(fd);
    fail(path, "truncated (shorter than the 8-byte header length)");
  }
  f.map_ = ::mmap(nullptr, f.map_size_, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (f.map_ == MAP_FAILED) {
    f.map_ = nullptr;
    fail(path, "mmap failed");
  }
  const auto* bytes = static_cast<const std::byte*>(f.map_);
  std::uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | std::to_integer<std::uint64_t>(bytes[i]);
  if (header_len > f.map_size_ - 8) fail(path, "truncated (header length exceeds the file size)");
  std::string_view header(reinterpret_cast<const char*>(bytes + 8), header_len);
  json::value root;
  try {
    root = json::parse(header);
  } catch (const json::error& e) {
    fail(path, std::string("bad header: ") + e.what());
  }
  if (!root.is_object()) fail(path, "header is not a JSON object");
  const std::byte* data_begin = bytes + 8 + header_len;
  const std::size_t data_size = f.map_size_ - 8 - header_len;
  for (const auto& [name, desc] : root.items()) {
    if (name == "__metadata__") {
      if (!desc.is_object()) fail(path, "__metadata__ must be an object of strings");
      for (const auto& [k, v] : desc.items()) {
        if (!v.is_string()) fail(path, "__metadata__ value \"" + k + "\" must be a string");
        f.metadata_[k] = v.get<std::string>();
      }
      continue;
    }
    tensor_info t;
    t.name = name;
    const auto* dt = json::find(desc, "dtype");
    const auto* shape = json::find(desc, "shape");
    const auto* offs = json::find(desc, "data_offsets");
    if (!dt || !shape || !offs) fail(path, "tensor " + name + " lacks dtype, shape or data_offsets");
    if (!dt->is_string()) fail(path, "tensor " + name + ": dtype must be a string");
    auto row = std::find_if(std::begin(kDtypes), std::end(kDtypes),
                            [&](const dtype_row& r) { return r.name == dt->get_ref<const std::string&>(); });
    if (row == std::end(kDtypes))
      fail(path, "tensor " + name + " has unsupported dtype " + dt->get<std::string>());
    t.type = row->d;
    // The element count and byte size are checked for overflow: a shape like
    // [2^62] of F32 would otherwise wrap to 0 bytes and match data_offsets [0, 0].
    if (!shape->is_array()) fail(path, "tensor " + name + ": shape must be an array of integers");
    std::uint64_t numel = 1;
    for (const auto& s : *shape) {
      const auto dim = json::integer(s);
      if (!dim) fail(path, "tensor " + name + ": shape must be an array of integers");
      if (*dim < 0) fail(path, "tensor " + name + " has a negative dimension");
      t.shape.push_back(*dim);
      if (__builtin_mul_overflow(numel, static_cast<std::uint64_t>(*dim), &numel) ||
          numel > static_cast<std::uint64_t>(INT64_MAX))
        fail(path, "tensor " + name + ": the shape has more elements than fit in 64 bits");
    }
    std::uint64_t need = 0;
    if (__builtin_mul_overflow(numel, static_cast<std::uint64_t>(row->size), &need))
      fail(path, "tensor " + name + ": the shape needs more bytes than fit in 64 bits");
    std::int64_t b = -1, e = -1;
    if (offs->is_array() && offs->size() == 2) {
      b = json::integer((*offs)[0]).value_or(-1);
      e = json::integer((*offs)[1]).value_or(-1);
    }
    if (b < 0 || e < 0) fail(path, "tensor " + name + ": data_offsets needs two integers >= 0");
    if (e < b || static_cast<std::uint64_t>(e) > data_size)
      fail(path, "truncated or corrupt: tensor " + name + " data_offsets [" + std::to_string(b) + ", " +
                     std::to_string(e) + "] outside the " + std::to_string(data_size) + " data bytes");
    t.nbytes = static_cast<std::size_t>(e - b);
    if (need != t.nbytes)
      fail(path, "tensor " + name + ": shape and dtype need " + std::to_string(need) +
                     " bytes but data_offsets span " + std::to_string(t.nbytes));
    t.data = data_begin + b;
    f.tensors_.push_back(std::move(t));
  }
  return f;
}

file::file(file&& o) noexcept { *this = std::move(o); }

file& file::operator=(file&& o) noexcept {
  if (this != &o) {
    if (map_) ::munmap(map_, map_size_);
    path_ = std::move(o.path_);
    map_ = std::exchange(o.map_, nullptr);
    map_size_ = std::exchange(o.map_size_, 0);
    tensors_ = std::move(o.tensors_);
    metadata_ = std::move(o.metadata_);
  }
  return *this;
}

file::~file() {
  if (map_) ::munmap(map_, map_size_);
}

const tensor_info* file::find(std::string_view name) const {
  for (const auto& t : tensors_)
    if (t.name == name) return &t;
  return nullptr;
}

writer::writer(const std::filesystem::path& path, const std::vector<entry>& layout,
               const std::map<std::string, std::string>& metadata)
    : path_(path) {
  std::vector<const entry*> order;
  for (const auto& e : layout) order.push_back(&e);
  std::sort(order.begin(), order.end(), [](const entry* a, const entry* b) { return a->name < b->name; });

  // Keys in order: __metadata__, then the tensors sorted by name, as they lie in the file.
  json::ordered root = json::ordered::object();
  if (!metadata.empty()) root["__metadata__"] = metadata;
  std::size_t offset = 0;
  for (std::size_t i = 0; i < order.size(); ++i) {
    const entry* e = order[i];
    std::int64_t numel = 1;
    for (auto s : e->shape) numel *= s;
    if (static_cast<std::size_t>(numel) * dtype_size(e->type) != e->nbytes)
      fail(path, "tensor " + e->name + " byte size does not match its shape");
    if (i > 0 && order[i - 1]->name == e->name) fail(path, "tensor " + e->name + " given twice");
    root[e->name] = {
        {"dtype", dtype_name(e->type)}, {"shape", e->shape}, {"data_offsets", {offset, offset + e->nbytes}}};
    slots_[e->name] = {offset, e->nbytes, false};
    offset += e->nbytes;
  }
  std::string header;
  try {
    header = json::dump(root);
  } catch (const json::error& e) {
    fail(path, e.what());
  }
  while (header.size() % 8) header += ' ';  // keep the data 8-byte aligned
  for (auto& [name, s] : slots_) s.offset += 8 + header.size();

  std::string head(8, '\0');
  const std::uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) head[static_cast<std::size_t>(i)] = static_cast<char>(n >> (8 * i));
  head += header;
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) fail(path, std::string("cannot open for writing: ") + std::strerror(errno));
  write_at(head.data(), head.size(), 0);
}

writer::~writer() {
  if (fd_ >= 0) ::close(fd_);
}

void writer::write_at(const void* data, std::size_t nbytes, std::uint64_t offset) {
  const auto* p = static_cast<const char*>(data);
  while (nbytes > 0) {
    const ::ssize_t k = ::pwrite(fd_, p, nbytes, static_cast<::off_t>(offset));
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) fail(path_, std::string("write failed: ") + (k < 0 ? std::strerror(errno) : "no progress"));
    p += k;
    nbytes -= static_cast<std::size_t>(k);
    offset += static_cast<std::uint64_t>(k);
  }
}

void writer::put(std::string_view name, const void* data, std::size_t nbytes) {
  auto it = slots_.find(name);
  if (it == slots_.end()) fail(path_, "tensor " + std::string(name) + " is not in the file's layout");
  slot& s = it->second;
  if (s.written) fail(path_, "tensor " + std::string(name) + " written twice");
  if (nbytes != s.nbytes)
    fail(path_, "tensor " + std::string(name) + ": " + std::to_string(nbytes) +
                    " bytes given, its shape needs " + std::to_string(s.nbytes));
  write_at(data, nbytes, s.offset);
  s.written = true;
}

void writer::finish() {
  for (const auto& [name, s] : slots_)
    if (!s.written) fail(path_, "tensor " + name + " was never written");
  if (::close(std::exchange(fd_, -1)) != 0) fail(path_, std::string("write failed: ") + std::strerror(errno));
}

void write(const std::filesystem::path& path, const std::vector<entry>& entries,
           const std::map<std::string, std::string>& metadata) {
  writer w(path, entries, metadata);
  for (const auto& e : entries) w.put(e.name, e.data, e.nbytes);
  w.finish();
}

}  // namespace primecfg::train::safetensors
