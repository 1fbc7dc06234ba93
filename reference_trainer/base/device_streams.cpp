#include "base/device_streams.hpp"

#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string_view>
#include <utility>
#include <vector>

#if defined(PRIMECFG_WITH_CUDA)
#include <cuda_runtime_api.h>
// Declared in ATen/cuda/CUDAContextLight.h, which also pulls in the cuBLAS,
// cuSPARSE and cuSOLVER headers; this file needs only the device properties.
namespace at::cuda {
cudaDeviceProp* getDeviceProperties(c10::DeviceIndex device);
}
#endif

namespace primecfg::train::dev {

namespace {

const c10::impl::DeviceGuardImplInterface* impl_for(torch::Device d) {
  if (d.is_cpu()) return nullptr;
  return c10::impl::getDeviceGuardImpl(d.type());
}

torch::Device concrete(torch::Device d, const c10::impl::DeviceGuardImplInterface* impl) {
  if (d.has_index()) return d;
  return torch::Device(d.type(), impl->getDevice().index());
}

// Events whose last Marker is gone, kept for the next record(): the offload pipelines
// record several hundred markers per step, and creating and destroying a CUDA event
// each time is driver work on threads that also launch kernels. Re-recording an event
// nobody refers to any more is safe: a wait queued earlier captured the recording it
// saw. The pool is never destroyed (events may come back during exit).
class EventPool {
 public:
  static EventPool& get() {
    static auto* pool = new EventPool();
    return *pool;
  }
  // An event for recording on `s` (an event keeps the device it was first recorded on).
  std::shared_ptr<c10::Event> take(const c10::Stream& s) {
    const c10::Device key = s.device();
    std::unique_ptr<c10::Event> ev;
    {
      std::lock_guard lk(mu_);
      for (auto& [device, events] : free_)
        if (device == key && !events.empty()) {
          ev = std::move(events.back());
          events.pop_back();
          break;
        }
    }
    if (!ev) ev = std::make_unique<c10::Event>(s.device_type());
    return std::shared_ptr<c10::Event>(ev.release(), [this, key](c10::Event* e) {
      std::lock_guard lk(mu_);
      for (auto& [device, events] : free_)
        if (device == key) {
          events.emplace_back(e);
          return;
        }
      free_.emplace_back(key, std::vector<std::unique_ptr<c10::Event>>{});
      free_.back().second.emplace_back(e);
    });
  }

 private:
  EventPool() = default;
  std::mutex mu_;
  std::vector<std::pair<c10::Device, std::vector<std::unique_ptr<c10::Event>>>> free_;  // per device
};

}  // namespace

MaybeStream current_stream(torch::Device d) {
  const auto* impl = impl_for(d);
  if (!impl) return std::nullopt;
  return impl->getStream(concrete(d, impl));
}

MaybeStream side_stream(torch::Device d) {
  const auto* impl = impl_for(d);
  if (!impl) return std::nullopt;
  return impl->getStreamFromGlobalPool(concrete(d, impl), /*isHighPriority=*/false);
}

void synchronize(const MaybeStream& s) {
  if (s) s->synchronize();
}

Marker Marker::record(const MaybeStream& s) {
  Marker m;
  if (s) {
    m.ev_ = EventPool::get().take(*s);
    m.ev_->record(*s);
  }
  return m;
}

void Marker::wait_on(const MaybeStream& s) const {
  if (ev_ && s) ev_->block(*s);
}

void Marker::synchronize() const {
  if (ev_) ev_->synchronize();
}

bool Marker::reached() const { return !ev_ || ev_->query(); }

torch::Tensor exact_pinned(std::int64_t bytes, torch::Device d) {
  const auto u8 = torch::TensorOptions().dtype(torch::kUInt8);
#if defined(PRIMECFG_WITH_CUDA)
  if (d.is_cuda()) {
    void* p = nullptr;
    if (const cudaError_t rc = cudaHostAlloc(&p, static_cast<std::size_t>(std::max<std::int64_t>(bytes, 1)),
                                             cudaHostAllocDefault);
        rc != cudaSuccess) {
      (void)cudaGetLastError();  // clear it: the error is reported here, not by the next kernel
      throw std::runtime_error(std::string("cudaHostAlloc: ") + cudaGetErrorString(rc));
    }
    return torch::from_blob(
        p, {bytes}, [](void* q) { cudaFreeHost(q); }, u8);
  }
#endif
  (void)d;
  return torch::empty({bytes}, u8);
}

std::string pci_bus_id(torch::Device d) {
#if defined(PRIMECFG_WITH_CUDA)
  if (d.is_cuda()) {
    const auto* impl = impl_for(d);
    const auto* p = at::cuda::getDeviceProperties(concrete(d, impl).index());
    char buf[32];
    std::snprintf(buf, sizeof buf, "%04x:%02x:%02x.0", static_cast<unsigned>(p->pciDomainID),
                  static_cast<unsigned>(p->pciBusID), static_cast<unsigned>(p->pciDeviceID));
    return buf;
  }
#endif
  (void)d;
  return {};
}

std::string device_name(torch::Device d) {
#if defined(PRIMECFG_WITH_CUDA)
  if (d.is_cuda()) {
    const auto* impl = impl_for(d);
    return at::cuda::getDeviceProperties(concrete(d, impl).index())->name;
  }
#endif
  (void)d;
  return {};
}

}  // namespace primecfg::train::dev
