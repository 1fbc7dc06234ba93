#include "base/mapped_copies.hpp"

#include "base/device_streams.hpp"

#include <ATen/core/CachingHostAllocator.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>

#if defined(PRIMECFG_WITH_CUDA)
#include <cuda_runtime_api.h>
#endif

namespace primecfg::train::dev {

namespace {

using torch::Tensor;

#if defined(PRIMECFG_WITH_CUDA)
// Page-locked int32 host memory from LibTorch's pinned allocator (cudaHostAlloc: mapped
// into every device's address space where addressing is unified) and the same bytes as a
// tensor on `device`.
std::pair<Tensor, Tensor> mapped_int32(torch::IntArrayRef shape, torch::Device device) {
  Tensor host = torch::empty(shape, torch::TensorOptions().dtype(torch::kInt32).pinned_memory(true));
  void* on_device = nullptr;
  if (const cudaError_t rc = cudaHostGetDevicePointer(&on_device, host.data_ptr(), 0); rc != cudaSuccess) {
    (void)cudaGetLastError();  // reported here, not by the next kernel
    throw std::runtime_error(std::string("pinned host memory not mapped into the device: ") +
                             cudaGetErrorString(rc));
  }
  Tensor view =
      torch::from_blob(on_device, shape, torch::TensorOptions().dtype(torch::kInt32).device(device));
  return {host, view};
}
#endif

}  // namespace

Tensor upload_ints(const std::vector<std::int64_t>& values, torch::IntArrayRef shape, torch::Device device) {
  Tensor out = torch::empty(shape, torch::TensorOptions().dtype(torch::kInt64));
  if (static_cast<std::size_t>(out.numel()) != values.size())
    throw std::invalid_argument("upload_ints: " + std::to_string(values.size()) + " values for a shape of " +
                                std::to_string(out.numel()));
  // Checked on every device, so that a run on the CPU refuses what one on a GPU would.
  for (std::size_t i = 0; i < values.size(); ++i)
    if (values[i] < std::numeric_limits<std::int32_t>::min() ||
        values[i] > std::numeric_limits<std::int32_t>::max())
      throw std::invalid_argument("upload_ints: value " + std::to_string(values[i]) + " at index " +
                                  std::to_string(i) + " does not fit in 32 bits");
  if (!device.is_cuda()) {
    std::memcpy(out.data_ptr<std::int64_t>(), values.data(), values.size() * sizeof(std::int64_t));
    return out.to(device);
  }
#if defined(PRIMECFG_WITH_CUDA)
  auto [host, mapped] = mapped_int32(shape, device);
  std::copy(values.begin(), values.end(), host.data_ptr<std::int32_t>());
  // int32 -> int64 makes copy_ an elementwise kernel: ATen hands only copies of one dtype
  // to cudaMemcpy, which a copy engine would run.
  out = torch::empty(shape, torch::TensorOptions().dtype(torch::kInt64).device(device));
  out.copy_(mapped);
  // The pinned block is not reused before the kernel has read it.
  at::getHostAllocator(at::kCUDA)->record_event(host.data_ptr(), host.storage().data_ptr().get_context(),
                                                *current_stream(device));
  return out;
#else
  throw std::logic_error("upload_ints: a CUDA device in a build without CUDA");
#endif
}

std::vector<std::int64_t> read_back_ints(const Tensor& t) {
  if (t.scalar_type() != torch::kInt64)
    throw std::logic_error(std::string("read_back_ints: an int64 tensor, not ") +
                           c10::toString(t.scalar_type()));
  if (!t.is_cuda()) {
    const Tensor c = t.cpu().contiguous();
    return {c.data_ptr<std::int64_t>(), c.data_ptr<std::int64_t>() + c.numel()};
  }
#if defined(PRIMECFG_WITH_CUDA)
  auto [host, mapped] = mapped_int32(t.sizes(), t.device());
  mapped.copy_(t);  // int64 -> int32: a kernel writing host memory (see upload_ints)
  synchronize(current_stream(t.device()));
  const auto* h = host.data_ptr<std::int32_t>();
  return {h, h + host.numel()};
#else
  throw std::logic_error("read_back_ints: a CUDA tensor in a build without CUDA");
#endif
}

}  // namespace primecfg::train::dev
