#include "offload/full/numa/numa_binding.hpp"

#include <sched.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>
#include <system_error>

#if PRIMECFG_HAVE_HWLOC
#include <hwloc.h>
#endif

namespace primecfg::train::numa {
namespace {

namespace fs = std::filesystem;

bool read_first_line(const fs::path& file, std::string& line) {
  std::ifstream in(file);
  if (!in) return false;
  std::getline(in, line);
  return !in.bad();
}

std::string trim(std::string_view s) {
  std::size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return std::string(s.substr(b, e - b));
}

bool parse_hex(std::string_view s, unsigned long max, unsigned long& out) {
  if (s.empty() || s.size() > 8) return false;
  unsigned long v = 0;
  for (char ch : s) {
    const int c = std::tolower(static_cast<unsigned char>(ch));
    int d;
    if (c >= '0' && c <= '9')
      d = c - '0';
    else if (c >= 'a' && c <= 'f')
      d = c - 'a' + 10;
    else
      return false;
    v = v * 16 + static_cast<unsigned long>(d);
  }
  if (v > max) return false;
  out = v;
  return true;
}

std::vector<int> process_affinity() {
  std::vector<int> cpus;
  for (int ncpus = 1024; ncpus <= (1 << 20); ncpus *= 2) {
    cpu_set_t* set = CPU_ALLOC(ncpus);
    if (set == nullptr) break;
    const std::size_t size = CPU_ALLOC_SIZE(ncpus);
    CPU_ZERO_S(size, set);
    const int rc = sched_getaffinity(0, size, set);
    const int err = errno;
    if (rc == 0) {
      for (int cpu = 0; cpu < ncpus; ++cpu) {
        if (CPU_ISSET_S(static_cast<std::size_t>(cpu), size, set)) cpus.push_back(cpu);
      }
    }
    CPU_FREE(set);
    if (rc == 0 || err != EINVAL) break;
  }
  return cpus;
}

#if PRIMECFG_HAVE_HWLOC
struct Topology {
  hwloc_topology_t topo = nullptr;
  bool loaded = false;
  explicit Topology(bool with_io) {
    if (hwloc_topology_init(&topo) != 0) {
      topo = nullptr;
      return;
    }
    if (with_io) hwloc_topology_set_io_types_filter(topo, HWLOC_TYPE_FILTER_KEEP_ALL);
    loaded = hwloc_topology_load(topo) == 0;
  }
  ~Topology() {
    if (topo != nullptr) hwloc_topology_destroy(topo);
  }
  Topology(const Topology&) = delete;
  Topology& operator=(const Topology&) = delete;
};

std::vector<int> bitmap_to_vector(hwloc_const_bitmap_t set) {
  std::vector<int> cpus;
  for (int i = hwloc_bitmap_first(set); i != -1; i = hwloc_bitmap_next(set, i)) cpus.push_back(i);
  return cpus;
}

// The CPUs near the PCI device according to hwloc: its nearest non-I/O ancestor, narrowed to the NUMA
// node when hwloc knows that node. Empty when hwloc cannot tell.
std::vector<int> hwloc_cpus_for(const std::string& bus_id, int node, std::string& note) {
  Topology t(true);
  if (!t.loaded) {
    note = "hwloc could not load the topology";
    return {};
  }
  hwloc_obj_t dev = hwloc_get_pcidev_by_busidstring(t.topo, bus_id.c_str());
  hwloc_bitmap_t set = hwloc_bitmap_alloc();
  if (dev != nullptr) {
    hwloc_obj_t anc = hwloc_get_non_io_ancestor_obj(t.topo, dev);
    if (anc != nullptr && anc->cpuset != nullptr) hwloc_bitmap_copy(set, anc->cpuset);
  } else {
    note = "hwloc does not list PCI device " + bus_id;
  }
  hwloc_obj_t numa =
      node >= 0 ? hwloc_get_numanode_obj_by_os_index(t.topo, static_cast<unsigned>(node)) : nullptr;
  if (numa != nullptr && numa->cpuset != nullptr) {
    if (hwloc_bitmap_iszero(set)) {
      hwloc_bitmap_copy(set, numa->cpuset);
    } else if (hwloc_bitmap_intersects(set, numa->cpuset)) {
      hwloc_bitmap_and(set, set, numa->cpuset);
    }
  }
  std::vector<int> cpus = bitmap_to_vector(set);
  hwloc_bitmap_free(set);
  return cpus;
}
#endif

std::vector<int> sysfs_cpus_for(const fs::path& root, const std::string& bus_id, int node) {
  std::string line;
  std::vector<int> cpus;
  const fs::path node_list =
      root / "devices" / "system" / "node" / ("node" + std::to_string(node)) / "cpulist";
  if (read_first_line(node_list, line) && parse_cpulist(line, cpus) && !cpus.empty()) return cpus;
  const fs::path local = root / "bus" / "pci" / "devices" / bus_id / "local_cpulist";
  cpus.clear();
  if (read_first_line(local, line) && parse_cpulist(line, cpus)) return cpus;
  return {};
}

}  // namespace

std::string normalize_pci_bus_id(std::string_view text) {
  const std::string s = trim(text);
  // [domain:]bus:device.function
  const std::size_t dot = s.rfind('.');
  if (dot == std::string::npos) return {};
  const std::size_t c2 = s.rfind(':', dot);
  if (c2 == std::string::npos) return {};
  const std::size_t c1 = c2 == 0 ? std::string::npos : s.rfind(':', c2 - 1);
  unsigned long domain = 0, bus = 0, device = 0, function = 0;
  std::string_view view(s);
  if (c1 != std::string::npos) {
    if (!parse_hex(view.substr(0, c1), 0xFFFFFFFFul, domain)) return {};
    if (!parse_hex(view.substr(c1 + 1, c2 - c1 - 1), 0xFF, bus)) return {};
  } else {
    if (!parse_hex(view.substr(0, c2), 0xFF, bus)) return {};
  }
  if (!parse_hex(view.substr(c2 + 1, dot - c2 - 1), 0x1F, device)) return {};
  if (!parse_hex(view.substr(dot + 1), 0x7, function)) return {};
  char buf[32];
  std::snprintf(buf, sizeof buf, "%04lx:%02lx:%02lx.%lx", domain, bus, device, function);
  return buf;
}

bool parse_cpulist(std::string_view text, std::vector<int>& out) {
  out.clear();
  const std::string s = trim(text);
  if (s.empty()) return true;  // a node without CPUs
  std::stringstream in(s);
  std::string part;
  while (std::getline(in, part, ',')) {
    part = trim(part);
    if (part.empty()) return false;
    const std::size_t dash = part.find('-');
    auto to_int = [](const std::string& t, int& v) {
      if (t.empty() || t.size() > 7) return false;
      for (char ch : t) {
        if (ch < '0' || ch > '9') return false;
      }
      v = std::stoi(t);
      return true;
    };
    int lo, hi;
    if (dash == std::string::npos) {
      if (!to_int(part, lo)) return false;
      hi = lo;
    } else {
      if (!to_int(part.substr(0, dash), lo) || !to_int(part.substr(dash + 1), hi) || hi < lo) return false;
    }
    if (hi - lo > (1 << 20)) return false;
    for (int c = lo; c <= hi; ++c) out.push_back(c);
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return true;
}

std::string format_cpulist(const std::vector<int>& cpus) {
  std::vector<int> v(cpus);
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
  std::string s;
  for (std::size_t i = 0; i < v.size();) {
    std::size_t j = i;
    while (j + 1 < v.size() && v[j + 1] == v[j] + 1) ++j;
    if (!s.empty()) s += ',';
    s += std::to_string(v[i]);
    if (j > i) {
      s += '-';
      s += std::to_string(v[j]);
    }
    i = j + 1;
  }
  return s;
}

BindingResult find_gpu_binding(std::string_view pci_bus_id, const BindingOptions& options) {
  BindingResult r;
  r.bus_id = normalize_pci_bus_id(pci_bus_id);
  if (r.bus_id.empty()) {
    r.message = "CPU optimizer binding: '" + std::string(pci_bus_id) +
                "' is not a PCI bus id (expected domain:bus:device.function, e.g. 0000:00:06.0)";
    return r;
  }
  const fs::path dev = options.sysfs_root / "bus" / "pci" / "devices" / r.bus_id;
  std::error_code ec;
  if (!fs::exists(dev, ec)) {
    r.message = "CPU optimizer binding: no sysfs topology for GPU " + r.bus_id + " (" + dev.string() +
                " does not exist); cannot find the GPU's NUMA node to bind the optimizer threads";
    return r;
  }
  std::string line;
  const fs::path node_file = dev / "numa_node";
  if (!read_first_line(node_file, line)) {
    // The device exists but the kernel has no NUMA support: there is nothing to bind to.
    r.ok = true;
    r.message = "CPU optimizer binding: " + node_file.string() +
                " is missing (kernel without NUMA?); optimizer threads are not bound";
    return r;
  }
  const std::string value = trim(line);
  char* end = nullptr;
  errno = 0;
  const long node = std::strtol(value.c_str(), &end, 10);
  if (value.empty() || end == nullptr || *end != '\0' || errno != 0 || node < -1 || node > 1 << 20) {
    r.message =
        "CPU optimizer binding: " + node_file.string() + " holds '" + value + "', not a NUMA node number";
    return r;
  }
  r.numa_node = static_cast<int>(node);
  if (node < 0) {
    r.ok = true;
    r.message = "CPU optimizer binding: GPU " + r.bus_id +
                " reports no NUMA node (numa_node = -1); optimizer threads are not bound";
    return r;
  }

  std::vector<int> cpus;
  std::string note;
#if PRIMECFG_HAVE_HWLOC
  if (options.use_hwloc && options.sysfs_root == fs::path("/sys")) {
    cpus = hwloc_cpus_for(r.bus_id, r.numa_node, note);
    if (!cpus.empty()) r.source = "hwloc";
  }
#endif
  if (cpus.empty()) {
    cpus = sysfs_cpus_for(options.sysfs_root, r.bus_id, r.numa_node);
    if (!cpus.empty()) r.source = "sysfs";
  }
  if (cpus.empty()) {
    r.ok = true;
    r.message = "CPU optimizer binding: cannot find the CPUs of NUMA node " + std::to_string(node) +
                " (GPU " + r.bus_id + ")" + (note.empty() ? "" : ": " + note) +
                "; optimizer threads are not bound";
    return r;
  }
  if (options.restrict_to_affinity) {
    const std::vector<int> allowed = process_affinity();
    if (!allowed.empty()) {
      std::vector<int> both;
      std::set_intersection(cpus.begin(), cpus.end(), allowed.begin(), allowed.end(),
                            std::back_inserter(both));
      if (both.empty()) {
        r.ok = true;
        r.message = "CPU optimizer binding: this process may not run on the CPUs of NUMA node " +
                    std::to_string(node) + " (" + format_cpulist(cpus) + "; allowed " +
                    format_cpulist(allowed) + "); optimizer threads are not bound";
        return r;
      }
      cpus = std::move(both);
    }
  }
  r.ok = true;
  r.bind = true;
  r.cpus = std::move(cpus);
  return r;
}

std::string bind_current_thread(const std::vector<int>& cpus) {
  if (cpus.empty()) return "bind_current_thread: empty CPU list";
#if PRIMECFG_HAVE_HWLOC
  Topology t(false);
  if (t.loaded) {
    hwloc_bitmap_t set = hwloc_bitmap_alloc();
    for (int c : cpus) hwloc_bitmap_set(set, static_cast<unsigned>(c));
    const int rc = hwloc_set_cpubind(t.topo, set, HWLOC_CPUBIND_THREAD);
    const int err = errno;
    hwloc_bitmap_free(set);
    if (rc == 0) return {};
    return std::string("hwloc_set_cpubind: ") + std::strerror(err);
  }
#endif
  const int max_cpu = *std::max_element(cpus.begin(), cpus.end());
  const int ncpus = std::max(1024, max_cpu + 1);
  cpu_set_t* set = CPU_ALLOC(ncpus);
  if (set == nullptr) return "bind_current_thread: out of memory";
  const std::size_t size = CPU_ALLOC_SIZE(ncpus);
  CPU_ZERO_S(size, set);
  for (int c : cpus) CPU_SET_S(static_cast<std::size_t>(c), size, set);
  const int rc = sched_setaffinity(0, size, set);
  const int err = errno;
  CPU_FREE(set);
  if (rc == 0) return {};
  return std::string("sched_setaffinity: ") + std::strerror(err);
}

}  // namespace primecfg::train::numa
