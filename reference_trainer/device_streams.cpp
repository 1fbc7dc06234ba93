#include "device_streams.hpp"

#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <cstdio>

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
    m.ev_ = std::make_shared<c10::Event>(s->device_type());
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
