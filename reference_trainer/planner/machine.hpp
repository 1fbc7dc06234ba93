// Machine facts the planner's capacities come from (primecfg-train --plan and the
// check before a run fill plan::Assumptions from them): total memory of CUDA device
// `index` and its name through the driver API (dlopen of libcuda; nullopt without a driver or
// device), and host memory from /proc/meminfo (MemTotal, MemAvailable).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace primecfg::train::plan {

std::optional<std::int64_t> cuda_device_memory(int index);
// Its name as CUDA reports it ("NVIDIA H200"): what a machine profile was measured on.
std::optional<std::string> cuda_device_name(int index);
struct HostMemory {
  std::int64_t total = 0, available = 0;
};
std::optional<HostMemory> host_memory();

}  // namespace primecfg::train::plan
