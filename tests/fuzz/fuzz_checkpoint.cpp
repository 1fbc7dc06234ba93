// Fuzz target: what resume reads before any tensor (reference_trainer/checkpoint/dir.hpp):
// manifest.json, verified against a fixed checkpoint folder, and the metadata of
// trainer_state.safetensors, read through the real safetensors reader.
//
// The input's first half is the manifest, the second a safetensors file. Properties,
// beyond "no crash, no sanitizer report":
//  - verify_checkpoint either accepts, and then every file it lists exists with the
//    listed size and the step is the folder's, or throws checkpoint_error naming a path
//    inside the folder;
//  - parse_trainer_state either gives a position with the folder's step and
//    scheduler_step <= step, all non-negative, or throws checkpoint_error naming the file.
#include "base/safetensors.hpp"
#include "checkpoint/dir.hpp"
#include "fuzz_check.hpp"
#include "memfile.hpp"

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>

namespace {

namespace fs = std::filesystem;
namespace train = primecfg::train;
using primecfg::fuzz::check;

constexpr std::int64_t kStep = 3;

// A checkpoint folder with small real files; the manifest is the fuzzer's.
const fs::path& folder() {
  static const fs::path dir = [] {
    fs::path d = fs::temp_directory_path() / ("fuzz-checkpoint-" + std::to_string(::getpid())) / "step_3";
    fs::create_directories(d);
    for (const char* name :
         {"model.safetensors", "config.json", "trainer_state.safetensors", "optimizer.safetensors"})
      std::ofstream(d / name) << name;
    return d;
  }();
  return dir;
}

bool names_inside(const std::string& what, const fs::path& dir) { return what.rfind(dir.string(), 0) == 0; }

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  const std::string manifest = input.substr(0, size / 2), tensors = input.substr(size / 2);
  const fs::path& dir = folder();
  {
    std::ofstream(dir / "manifest.json", std::ios::binary | std::ios::trunc) << manifest;
    try {
      const train::Manifest m = train::verify_checkpoint(dir, kStep);
      check(m.step == kStep, "an accepted manifest has the folder's step", manifest);
      for (const auto& [name, f] : m.files)
        check(fs::file_size(dir / name) == f.bytes, "an accepted manifest's sizes are the files'", manifest);
    } catch (const train::checkpoint_error& e) {
      check(names_inside(e.what(), dir), "a manifest error names a path in the folder", e.what());
    }
  }
  static primecfg::fuzz::memfile state("fuzz-checkpoint-state");
  state.set(tensors.data(), tensors.size());
  std::optional<train::safetensors::file> f;
  try {
    f.emplace(train::safetensors::file::open(state.path()));
  } catch (const train::safetensors::error&) {
    return 0;  // fuzz_safetensors covers the reader itself
  }
  try {
    const train::TrainPosition p =
        train::parse_trainer_state(f->metadata(), "trainer_state.safetensors", kStep);
    check(p.step == kStep && p.data_position >= 0 && p.scheduler_step >= 0 && p.scheduler_step <= p.step,
          "an accepted position is consistent", tensors);
  } catch (const train::checkpoint_error& e) {
    check(std::string(e.what()).rfind("trainer_state.safetensors: ", 0) == 0,
          "a metadata error names the file", e.what());
  }
  return 0;
}
