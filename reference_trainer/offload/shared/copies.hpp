// Copies of the offload pipelines: typed views into byte buffers (the staging rings
// and the moment window), row indices sent to the device without stalling the host,
// and large copies queued in pieces.
//
// Internal to primecfg-train.
#pragma once

#include "offload/shared/copy_pieces.hpp"

#include <torch/torch.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

namespace primecfg::train {

using torch::Tensor;

// A typed view of `bytes` bytes at `offset` in a byte buffer.
inline Tensor ring_view(const Tensor& buf, std::size_t offset, torch::ScalarType dtype,
                        torch::IntArrayRef sizes) {
  const auto elem = static_cast<std::int64_t>(c10::elementSize(dtype));
  std::int64_t n = 1;
  for (auto d : sizes) n *= d;
  return buf.narrow(0, static_cast<std::int64_t>(offset), n * elem).view(dtype).view(sizes);
}

// Row indices as a device tensor, through pinned memory with an asynchronous copy on the
// current stream (the host does not wait). The inputs of the forward use
// dev::upload_ints instead (base/mapped_copies.hpp), which no copy engine carries.
inline Tensor to_device(const std::vector<std::int64_t>& values, torch::IntArrayRef shape,
                        torch::Device device) {
  auto host = torch::TensorOptions().dtype(torch::kInt64).pinned_memory(!device.is_cpu());
  Tensor t = torch::empty(shape, host);
  TORCH_CHECK(static_cast<std::size_t>(t.numel()) == values.size(), "to_device: shape does not match");
  std::memcpy(t.data_ptr<std::int64_t>(), values.data(), values.size() * sizeof(std::int64_t));
  return device.is_cpu() ? t : t.to(device, /*non_blocking=*/true);
}

// An asynchronous copy between contiguous tensors of one size, queued in pieces of at
// most kCopyPieceBytes (copy_pieces.hpp says why).
inline void copy_in_pieces(const Tensor& dst, const Tensor& src) {
  Tensor d = dst.view(-1), s = src.view(-1);
  const std::int64_t piece = std::max<std::int64_t>(1, kCopyPieceBytes / d.element_size());
  for (std::int64_t at = 0, n = d.numel(); at < n; at += piece) {
    const std::int64_t len = std::min(piece, n - at);
    d.narrow(0, at, len).copy_(s.narrow(0, at, len), /*non_blocking=*/true);
  }
}

}  // namespace primecfg::train
