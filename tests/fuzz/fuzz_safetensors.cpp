// Fuzz target: the trainer's safetensors reader (safetensors::file::open,
// reference_trainer/base/safetensors.hpp) on arbitrary files, through an in-memory
// file so that the real open/mmap path runs.
//
// Properties checked, beyond "no crash, no sanitizer report":
//  - it either opens the file or throws safetensors::error naming the file;
//  - every tensor it accepts lies inside the file's data section, with a size
//    of numel * dtype size and no negative dimension;
//  - writing the tensors and metadata again (safetensors::write, what the
//    trainer's checkpoints use) and reading that back gives the same names,
//    dtypes, shapes, bytes and metadata.
#include "base/safetensors.hpp"
#include "fuzz_check.hpp"
#include "memfile.hpp"

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace {

namespace st = primecfg::train::safetensors;
using primecfg::fuzz::check;
using primecfg::fuzz::memfile;

std::string describe(const st::tensor_info& t) {
  std::string s = t.name + " " + std::string(st::dtype_name(t.type)) + " [";
  for (auto d : t.shape) s += std::to_string(d) + ",";
  return s + "] " + std::to_string(t.nbytes) + " bytes";
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static memfile in("fuzz-safetensors-in"), out("fuzz-safetensors-out");
  in.set(data, size);
  const std::string input(reinterpret_cast<const char*>(data), size);
  std::vector<st::entry> entries;
  std::map<std::string, std::string> metadata;
  std::vector<std::string> described;
  std::vector<std::string> bytes;
  {
    std::optional<st::file> f;
    try {
      f.emplace(st::file::open(in.path()));
    } catch (const st::error& e) {
      check(std::string(e.what()).rfind(in.path() + ": ", 0) == 0, "the error names the file", e.what());
      return 0;
    }
    check(size >= 8, "a file shorter than the header length is refused", input);
    std::uint64_t header_len = 0;
    for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | data[i];
    check(header_len <= size - 8, "the header fits in the file", input);
    const std::string_view data_section = std::string_view(input).substr(8 + header_len);
    for (const auto& t : f->tensors()) {
      check(st::dtype_size(t.type) > 0, "a known dtype", describe(t));
      // Exact arithmetic: an accepted shape's element and byte counts fit in 64 bits.
      std::int64_t numel = 1;
      for (auto d : t.shape) {
        check(d >= 0, "no negative dimension", describe(t));
        check(!__builtin_mul_overflow(numel, d, &numel), "the element count fits in int64", describe(t));
      }
      check(numel == t.numel(), "numel is the product of the shape", describe(t));
      std::uint64_t need = 0;
      check(!__builtin_mul_overflow(static_cast<std::uint64_t>(numel), std::uint64_t{st::dtype_size(t.type)},
                                    &need) &&
                need == t.nbytes,
            "nbytes = numel * dtype size", describe(t));
      // Its bytes are bytes of the data section (the mapping is not `data`,
      // so compare content; reading them also checks they are mapped).
      const std::string_view content(reinterpret_cast<const char*>(t.data), t.nbytes);
      check(content.size() <= data_section.size() && data_section.find(content) != std::string_view::npos,
            "a tensor's bytes lie in the data section", describe(t));
      check(f->find(t.name) == &t, "find() returns the tensor", describe(t));
      bytes.emplace_back(reinterpret_cast<const char*>(t.data), t.nbytes);
      described.push_back(describe(t));
      entries.push_back({t.name, t.type, t.shape, nullptr, t.nbytes});
    }
    metadata = f->metadata();
  }
  for (std::size_t i = 0; i < entries.size(); ++i) entries[i].data = bytes[i].data();

  // Round trip through the writer.
  try {
    st::write(out.path(), entries, metadata);
  } catch (const st::error& e) {
    check(false, "what was read can be written", e.what());
  }
  try {
    st::file g = st::file::open(out.path());
    check(g.metadata() == metadata, "metadata survives a write and a read", input);
    check(g.tensors().size() == entries.size(), "every tensor survives a write and a read", input);
    for (const auto& e : entries) {
      const st::tensor_info* t = g.find(e.name);
      check(t != nullptr, "a tensor survives a write and a read", e.name);
      check(t->type == e.type && t->shape == e.shape && t->nbytes == e.nbytes &&
                (e.nbytes == 0 || std::memcmp(t->data, e.data, e.nbytes) == 0),
            "a tensor reads back the same after a write", describe(*t));
    }
  } catch (const st::error& e) {
    check(false, "what the writer wrote reads back", e.what());
  }
  return 0;
}
