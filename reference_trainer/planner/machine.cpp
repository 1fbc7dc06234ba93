// Machine facts the planner's capacities come from (machine.hpp).
#include "planner/machine.hpp"

#include <dlfcn.h>

#include <cstddef>
#include <fstream>
#include <string>

namespace primecfg::train::plan {

using i64 = std::int64_t;

namespace {

// The driver API, so no CUDA runtime or LibTorch is needed; it honours
// CUDA_VISIBLE_DEVICES like the runtime does. The library stays loaded: LibTorch may
// use it later in this process.
void* driver_symbol(const char* name) {
  static void* lib = [] {
    void* l = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    using init_fn = int (*)(unsigned);
    auto init = l ? reinterpret_cast<init_fn>(::dlsym(l, "cuInit")) : nullptr;
    return init && init(0) == 0 ? l : nullptr;
  }();
  return lib ? ::dlsym(lib, name) : nullptr;
}

// CUDA device `index`'s handle, when there is one.
std::optional<int> device_handle(int index) {
  using count_fn = int (*)(int*);
  using get_fn = int (*)(int*, int);
  auto count = reinterpret_cast<count_fn>(driver_symbol("cuDeviceGetCount"));
  auto get = reinterpret_cast<get_fn>(driver_symbol("cuDeviceGet"));
  int n = 0, dev = 0;
  if (!count || !get || count(&n) != 0 || index < 0 || index >= n || get(&dev, index) != 0)
    return std::nullopt;
  return dev;
}

}  // namespace

std::optional<i64> cuda_device_memory(int index) {
  using mem_fn = int (*)(std::size_t*, int);
  auto mem = reinterpret_cast<mem_fn>(driver_symbol("cuDeviceTotalMem_v2"));
  const auto dev = device_handle(index);
  std::size_t bytes = 0;
  if (!mem || !dev || mem(&bytes, *dev) != 0) return std::nullopt;
  return static_cast<i64>(bytes);
}

std::optional<std::string> cuda_device_name(int index) {
  using name_fn = int (*)(char*, int, int);
  auto name = reinterpret_cast<name_fn>(driver_symbol("cuDeviceGetName"));
  const auto dev = device_handle(index);
  char buf[256] = {};
  if (!name || !dev || name(buf, sizeof buf - 1, *dev) != 0) return std::nullopt;
  return std::string(buf);
}

std::optional<HostMemory> host_memory() {
  std::ifstream in("/proc/meminfo");
  if (!in) return std::nullopt;
  HostMemory h;
  std::string key;
  i64 kb = 0;
  std::string unit;
  bool total = false, avail = false;
  while (in >> key >> kb) {
    std::getline(in, unit);
    if (key == "MemTotal:") h.total = kb * 1024, total = true;
    if (key == "MemAvailable:") h.available = kb * 1024, avail = true;
  }
  if (!total) return std::nullopt;
  if (!avail) h.available = h.total;
  return h;
}

}  // namespace primecfg::train::plan
