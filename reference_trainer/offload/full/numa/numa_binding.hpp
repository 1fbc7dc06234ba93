// Where should the CPU optimizer threads of a GPU run? From the GPU's PCI bus id (as CUDA reports it,
// which follows CUDA_VISIBLE_DEVICES, unlike an NVML index) to the CPUs of its NUMA node.
//
//   auto b = numa::find_gpu_binding(pci_bus_id);
//   if (!b.ok) fail(b.message);                       // no sysfs topology for this GPU
//   if (!b.message.empty()) warn(b.message);          // e.g. numa_node = -1: nothing to bind to
//   ThreadPoolOptions opt; opt.cpus = b.cpus;         // empty when not binding
//
// Sources: <sysfs>/bus/pci/devices/<bus id>/numa_node for the node; the node's CPUs from hwloc
// (hwloc_get_pcidev_by_busidstring, the nearest non-I/O ancestor, intersected with the node) when
// reading the real /sys, else from <sysfs>/devices/system/node/node<N>/cpulist. The sysfs root is a
// parameter so tests can fake a topology in a temporary directory.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace primecfg::train::numa {

struct BindingOptions {
  // Root of the sysfs tree ("/sys" on a real host; a temp dir in tests).
  std::filesystem::path sysfs_root = "/sys";
  // Use hwloc for the CPU set (only ever when sysfs_root is "/sys": hwloc reads the real machine).
  bool use_hwloc = true;
  // Drop CPUs this process may not run on (sched_getaffinity).
  bool restrict_to_affinity = true;
};

struct BindingResult {
  bool ok = false;        // false: error, `message` says why; the caller should stop
  bool bind = false;      // true: bind the workers to `cpus`
  std::string message;    // error text when !ok; a warning (or empty) when ok
  std::string bus_id;     // normalized PCI bus id ("0000:00:06.0")
  int numa_node = -1;     // the GPU's node, -1 when it reports none
  std::vector<int> cpus;  // OS CPU indices of the node (empty when !bind)
  std::string source;     // "hwloc" or "sysfs": where `cpus` came from
};

// "00000000:0A:00.0", "0a:00.0", " 0000:0a:00.0\n" -> "0000:0a:00.0". Returns "" when `text` is not a
// PCI address.
std::string normalize_pci_bus_id(std::string_view text);

// Parses a Linux cpulist ("0-3,8,10-11") into sorted CPU indices; false on malformed input.
bool parse_cpulist(std::string_view text, std::vector<int>& out);

// Formats CPU indices as a cpulist ("0-3,8").
std::string format_cpulist(const std::vector<int>& cpus);

BindingResult find_gpu_binding(std::string_view pci_bus_id, const BindingOptions& options = {});

// Binds the calling thread to `cpus` (hwloc_set_cpubind with HWLOC_CPUBIND_THREAD when hwloc is
// available, sched_setaffinity otherwise). Returns an empty string on success, else the error.
std::string bind_current_thread(const std::vector<int>& cpus);

}  // namespace primecfg::train::numa
