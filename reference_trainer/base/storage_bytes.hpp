// A tensor's bytes freed, or given back, under autograd's feet: the tensor keeps its sizes
// and its place in every saved graph, only its storage goes (as FSDP2 does with
// storage.resize_). What reads it while freed is what its owner's hooks rule out: FSDP
// gathers a block's weights again before its backward (distributed/fsdp.cpp), the routed
// experts stack their weights again before theirs (nn/moe.cpp). On CUDA the caching
// allocator orders the reuse after what the stream has queued, so a kernel already queued
// on the bytes still reads them.
//
// Internal to primecfg-train.
#pragma once

#include <torch/torch.h>

#include <cstddef>

namespace primecfg::train {

inline void free_bytes(const torch::Tensor& t) {
  c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  s->set_data_ptr_noswap(at::DataPtr(nullptr, t.device()));
  s->set_nbytes(0);
}

inline void alloc_bytes(const torch::Tensor& t) {
  c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  const auto n = static_cast<std::size_t>(t.numel()) * t.element_size();
  s->set_data_ptr_noswap(s->allocator()->allocate(n));
  s->set_nbytes(n);
}

}  // namespace primecfg::train
