// NUMA binding tests (no LibTorch). They fake a sysfs tree in a temporary directory: a GPU on node 1,
// a GPU with numa_node = -1, a missing device, a malformed file; and ask the real /sys once.
#include <doctest/doctest.h>
#include <sched.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "offload/full/numa/numa_binding.hpp"
#include "optim/cpu/thread_pool.hpp"

namespace cpu = primecfg::train::cpu;
namespace numa = primecfg::train::numa;
namespace fs = std::filesystem;

namespace {

struct FakeSysfs {
  fs::path root;
  FakeSysfs() {
    root = fs::temp_directory_path() /
           ("primecfg-sysfs-" + std::to_string(::getpid()) + "-" + std::to_string(std::random_device{}()));
    fs::create_directories(root);
  }
  ~FakeSysfs() {
    std::error_code ec;
    fs::remove_all(root, ec);
  }
  void write(const fs::path& rel, const std::string& text) const {
    fs::create_directories((root / rel).parent_path());
    std::ofstream(root / rel) << text;
  }
  void gpu(const std::string& bus, const std::string& node) const {
    write(fs::path("bus/pci/devices") / bus / "numa_node", node + "\n");
  }
};

}  // namespace

TEST_CASE("PCI bus ids are normalized") {
  CHECK(numa::normalize_pci_bus_id("0000:00:06.0") == "0000:00:06.0");
  CHECK(numa::normalize_pci_bus_id("00000000:0A:00.0") == "0000:0a:00.0");  // NVML style
  CHECK(numa::normalize_pci_bus_id(" 0a:00.1\n") == "0000:0a:00.1");
  CHECK(numa::normalize_pci_bus_id("0001:c1:1f.7") == "0001:c1:1f.7");
  CHECK(numa::normalize_pci_bus_id("gpu0") == "");
  CHECK(numa::normalize_pci_bus_id("0000:00:20.0") == "");  // device > 0x1f
  CHECK(numa::normalize_pci_bus_id("0000:100:00.0") == "");
  CHECK(numa::normalize_pci_bus_id("") == "");
}

TEST_CASE("cpulists parse and format") {
  std::vector<int> v;
  CHECK(numa::parse_cpulist("0-3,8,10-11\n", v));
  CHECK(v == std::vector<int>{0, 1, 2, 3, 8, 10, 11});
  CHECK(numa::format_cpulist(v) == "0-3,8,10-11");
  CHECK(numa::parse_cpulist("", v));
  CHECK(v.empty());
  CHECK_FALSE(numa::parse_cpulist("3-1", v));
  CHECK_FALSE(numa::parse_cpulist("a", v));
  CHECK_FALSE(numa::parse_cpulist("1,,2", v));
}

TEST_CASE("GPU on a NUMA node: bind to the node's CPUs (faked sysfs)") {
  FakeSysfs sys;
  sys.gpu("0000:3b:00.0", "1");
  sys.write("devices/system/node/node0/cpulist", "0-7\n");
  sys.write("devices/system/node/node1/cpulist", "8-15,24-31\n");
  numa::BindingOptions opt;
  opt.sysfs_root = sys.root;
  opt.restrict_to_affinity = false;
  const auto r = numa::find_gpu_binding("00000000:3B:00.0", opt);
  CHECK(r.ok);
  CHECK(r.bind);
  CHECK(r.message.empty());
  CHECK(r.bus_id == "0000:3b:00.0");
  CHECK(r.numa_node == 1);
  CHECK(r.source == "sysfs");
  CHECK(numa::format_cpulist(r.cpus) == "8-15,24-31");

  // Restricted to this process's CPUs: node 0 here holds every allowed CPU.
  const std::vector<int> allowed = cpu::allowed_cpus();
  sys.gpu("0000:3c:00.0", "0");
  sys.write("devices/system/node/node0/cpulist", numa::format_cpulist(allowed) + "\n");
  opt.restrict_to_affinity = true;
  const auto own = numa::find_gpu_binding("0000:3c:00.0", opt);
  CHECK(own.ok);
  CHECK(own.bind);
  CHECK(own.cpus == allowed);
  // A node whose CPUs this process may not use: warning, no binding.
  sys.write("devices/system/node/node1/cpulist", "100000-100003\n");
  const auto other = numa::find_gpu_binding("0000:3b:00.0", opt);
  CHECK(other.ok);
  CHECK_FALSE(other.bind);
  CHECK(other.message.find("may not run") != std::string::npos);
}

TEST_CASE("node without a cpulist falls back to the device's local_cpulist (faked sysfs)") {
  FakeSysfs sys;
  sys.gpu("0000:01:00.0", "2");
  sys.write("bus/pci/devices/0000:01:00.0/local_cpulist", "4-5\n");
  numa::BindingOptions opt;
  opt.sysfs_root = sys.root;
  opt.restrict_to_affinity = false;
  const auto r = numa::find_gpu_binding("0000:01:00.0", opt);
  CHECK(r.ok);
  CHECK(r.bind);
  CHECK(r.cpus == std::vector<int>{4, 5});
}

TEST_CASE("numa_node = -1: no binding, a warning (faked sysfs)") {
  FakeSysfs sys;
  sys.gpu("0000:00:06.0", "-1");
  numa::BindingOptions opt;
  opt.sysfs_root = sys.root;
  const auto r = numa::find_gpu_binding("0000:00:06.0", opt);
  CHECK(r.ok);
  CHECK_FALSE(r.bind);
  CHECK(r.numa_node == -1);
  CHECK(r.cpus.empty());
  CHECK(r.message.find("no NUMA node") != std::string::npos);
  CHECK(r.message.find("0000:00:06.0") != std::string::npos);
}

TEST_CASE("missing sysfs topology is an error (faked sysfs)") {
  FakeSysfs sys;  // empty tree: a host without GPU sysfs topology
  numa::BindingOptions opt;
  opt.sysfs_root = sys.root;
  const auto r = numa::find_gpu_binding("0000:00:06.0", opt);
  CHECK_FALSE(r.ok);
  CHECK_FALSE(r.bind);
  CHECK(r.message.find("no sysfs topology") != std::string::npos);

  const auto not_an_id = numa::find_gpu_binding("cuda:0", opt);
  CHECK_FALSE(not_an_id.ok);
  CHECK(not_an_id.message.find("not a PCI bus id") != std::string::npos);

  sys.gpu("0000:00:07.0", "banana");
  const auto garbage = numa::find_gpu_binding("0000:00:07.0", opt);
  CHECK_FALSE(garbage.ok);
  CHECK(garbage.message.find("not a NUMA node number") != std::string::npos);

  // The device is there but the kernel has no numa_node file: nothing to bind, a warning.
  fs::create_directories(sys.root / "bus/pci/devices/0000:00:08.0");
  const auto no_file = numa::find_gpu_binding("0000:00:08.0", opt);
  CHECK(no_file.ok);
  CHECK_FALSE(no_file.bind);
  CHECK_FALSE(no_file.message.empty());
}

TEST_CASE("the real /sys of this host answers without crashing") {
  // Whatever PCI device exists here stands in for a GPU: ok (bound or with a warning), never a crash.
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator("/sys/bus/pci/devices", ec)) {
    const auto r = numa::find_gpu_binding(entry.path().filename().string());
    CHECK(r.ok);
    MESSAGE(entry.path().filename().string()
            << ": node " << r.numa_node << " bind " << r.bind << " cpus " << numa::format_cpulist(r.cpus)
            << " " << r.source << " " << r.message);
    break;
  }
  const auto missing = numa::find_gpu_binding("ffff:ff:1f.7");
  CHECK_FALSE(missing.ok);
}

TEST_CASE("bind_current_thread pins a thread") {
  const std::vector<int> allowed = cpu::allowed_cpus();
  std::string err = "not run";
  int cpu_seen = -1;
  std::thread t([&] {
    err = numa::bind_current_thread({allowed.back()});
    sched_yield();
    cpu_seen = sched_getcpu();
  });
  t.join();
  CHECK(err.empty());
  CHECK(cpu_seen == allowed.back());
  CHECK_FALSE(numa::bind_current_thread({}).empty());
}
