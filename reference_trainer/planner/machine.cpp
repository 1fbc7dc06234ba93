// Machine facts the planner's capacities come from (machine.hpp).
#include "planner/machine.hpp"

#include <dlfcn.h>

#include <cstddef>
#include <fstream>
#include <string>

namespace primecfg::train::plan {

using i64 = std::int64_t;

std::optional<i64> cuda_device_memory(int index) {
  // The driver API, so no CUDA runtime or LibTorch is needed; it honours
  // CUDA_VISIBLE_DEVICES like the runtime does.
  void* lib = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) return std::nullopt;
  using init_fn = int (*)(unsigned);
  using count_fn = int (*)(int*);
  using get_fn = int (*)(int*, int);
  using mem_fn = int (*)(std::size_t*, int);
  auto init = reinterpret_cast<init_fn>(::dlsym(lib, "cuInit"));
  auto count = reinterpret_cast<count_fn>(::dlsym(lib, "cuDeviceGetCount"));
  auto get = reinterpret_cast<get_fn>(::dlsym(lib, "cuDeviceGet"));
  auto mem = reinterpret_cast<mem_fn>(::dlsym(lib, "cuDeviceTotalMem_v2"));
  // The library stays loaded: LibTorch may use it later in this process.
  if (!init || !count || !get || !mem || init(0) != 0) return std::nullopt;
  int n = 0, dev = 0;
  std::size_t bytes = 0;
  if (count(&n) != 0 || index < 0 || index >= n || get(&dev, index) != 0 || mem(&bytes, dev) != 0)
    return std::nullopt;
  return static_cast<i64>(bytes);
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
