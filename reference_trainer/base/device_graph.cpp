#include "base/device_graph.hpp"

#include <c10/util/Exception.h>

#include <stdexcept>
#include <string_view>

#if defined(PRIMECFG_WITH_CUDA)
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/cuda.h>
#endif

namespace primecfg::train::dev {

struct DeviceGraph::Impl {
#if defined(PRIMECFG_WITH_CUDA)
  at::cuda::CUDAGraph graph;
#endif
  bool captured = false;
};

DeviceGraph::DeviceGraph() : impl_(std::make_unique<Impl>()) {}
DeviceGraph::~DeviceGraph() = default;

bool DeviceGraph::supported(torch::Device d) {
#if defined(PRIMECFG_WITH_CUDA)
  return d.is_cuda();
#else
  (void)d;
  return false;
#endif
}

bool DeviceGraph::captured() const { return impl_->captured; }

void DeviceGraph::capture(torch::Device d, const std::function<void()>& work) {
  if (!supported(d)) throw std::logic_error("DeviceGraph: CUDA graphs need a CUDA device in a CUDA build");
#if defined(PRIMECFG_WITH_CUDA)
  c10::cuda::CUDAGuard guard(d);
  release_cached(d);
  // A capture may not run on the legacy default stream.
  const auto side = c10::cuda::getStreamFromPool(false, d.index());
  c10::cuda::CUDAStreamGuard on_side(side);
  auto fresh = std::make_unique<Impl>();
  fresh->graph.capture_begin();
  try {
    work();
  } catch (...) {
    try {
      fresh->graph.capture_end();
    } catch (...) {  // the first error is the one to report
    }
    throw;
  }
  fresh->graph.capture_end();
  fresh->captured = true;
  impl_ = std::move(fresh);
#else
  (void)work;
#endif
}

bool DeviceGraph::out_of_memory(const std::exception& e) {
  if (dynamic_cast<const c10::OutOfMemoryError*>(&e)) return true;
  // Autograd's engine hands an error of its threads on by type; a copy of the message
  // names it as well ("CUDA out of memory. Tried to allocate ...").
  return std::string_view(e.what()).find("CUDA out of memory") != std::string_view::npos;
}

void DeviceGraph::release_cached(torch::Device d) {
#if defined(PRIMECFG_WITH_CUDA)
  if (!d.is_cuda()) return;
  c10::cuda::CUDAGuard guard(d);
  torch::cuda::synchronize(d.index());
  c10::cuda::CUDACachingAllocator::emptyCache();
#else
  (void)d;
#endif
}

void DeviceGraph::replay() {
  if (!impl_->captured) throw std::logic_error("DeviceGraph::replay: nothing captured");
#if defined(PRIMECFG_WITH_CUDA)
  impl_->graph.replay();
#endif
}

}  // namespace primecfg::train::dev
