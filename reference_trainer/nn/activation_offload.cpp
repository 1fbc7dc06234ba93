#include "nn/activation_offload.hpp"

#include "base/run_error.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>

namespace primecfg::train {

using torch::Tensor;

ActivationOffload::ActivationOffload(torch::Device device, std::int64_t blocks, Settings s)
    : device_(device),
      blocks_(blocks),
      settings_(s),
      to_host_(dev::side_stream(device)),
      to_device_(dev::side_stream(device)),
      slots_(static_cast<std::size_t>(blocks)) {
  if (settings_.max_inflight < 1)
    throw run_error("activation offloading: max_inflight_activations must be >= 1");
}

std::int64_t ActivationOffload::stash(const Tensor& x, std::int64_t block) {
  TORCH_CHECK(block >= 0 && block < blocks_, "activation offloading: block ", block, " of ", blocks_);
  if (block == 0) {  // a new forward pass: whatever an earlier one left (no backward ran) goes
    for (Slot& s : slots_) {
      s.copied.synchronize();  // the copy may still read the device input
      s = Slot{};
    }
    on_device_.clear();
    host_bytes_ = 0;
  }
  Slot& slot = slots_[static_cast<std::size_t>(block)];
  while (static_cast<std::int64_t>(on_device_.size()) >= settings_.max_inflight) release_oldest();
  slot = Slot{};
  slot.device = x;
  on_device_.push_back(block);
  // The last max_inflight blocks' inputs are never released before their backward.
  if (block < block_inputs_offloaded(blocks_, settings_.max_inflight)) {
    const bool pinned = settings_.pin_memory && device_.is_cuda();
    try {
      slot.host = torch::empty(x.sizes(), torch::TensorOptions().dtype(x.dtype()).pinned_memory(pinned));
    } catch (const c10::Error& e) {
      throw host_memory_error(fmt::format(
          "activation offloading (model.ac_offloading) could not allocate {:.1f} MiB of {} host memory for "
          "block {}'s input, with {:.2f} GiB already held for this forward pass ({})",
          static_cast<double>(x.nbytes()) / (1 << 20), pinned ? "pinned" : "pageable", block,
          static_cast<double>(host_bytes_) / (1 << 30), e.what_without_backtrace()));
    }
    const dev::MaybeStream compute = dev::current_stream(device_);
    dev::Marker::record(compute).wait_on(to_host_);  // x is complete
    {
      dev::StreamScope on(to_host_);
      slot.host.copy_(x, /*non_blocking=*/true);
    }
    slot.copied = dev::Marker::record(to_host_);
    host_bytes_ += static_cast<std::int64_t>(slot.host.nbytes());
    stats_.host_bytes_peak = std::max(stats_.host_bytes_peak, host_bytes_);
    stats_.bytes_to_host += static_cast<std::int64_t>(x.nbytes());
  }
  return block;
}

// The device copy of the oldest input still there goes once its host copy is done:
// waited for on the host, so that the memory is free for the compute stream's next
// allocation (a stream-ordered release would leave it taken until the allocator
// notices).
void ActivationOffload::release_oldest() {
  Slot& s = slots_[static_cast<std::size_t>(on_device_.front())];
  on_device_.pop_front();
  TORCH_CHECK(s.host.defined(), "activation offloading: releasing an input that has no host copy");
  if (!s.copied.reached()) {
    const auto t0 = std::chrono::steady_clock::now();
    s.copied.synchronize();
    stats_.wait_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  s.device = Tensor();
}

// Queues the copy of a released input back to the device. The buffer is allocated on
// the calling (compute) stream, so the copy stream first waits for what that stream
// has queued: the buffer's memory may have been in use there until now.
void ActivationOffload::bring_back(Slot& s) {
  const dev::MaybeStream compute = dev::current_stream(device_);
  s.device = torch::empty(s.host.sizes(), s.host.options().device(device_).pinned_memory(false));
  dev::Marker::record(compute).wait_on(to_device_);
  s.copied.wait_on(to_device_);
  {
    dev::StreamScope on(to_device_);
    s.device.copy_(s.host, /*non_blocking=*/true);
  }
  s.arrived = dev::Marker::record(to_device_);
  stats_.bytes_to_device += static_cast<std::int64_t>(s.host.nbytes());
}

Tensor ActivationOffload::take(std::int64_t handle) {
  TORCH_CHECK(handle >= 0 && handle < blocks_, "activation offloading: no input stashed as ", handle);
  Slot& s = slots_[static_cast<std::size_t>(handle)];
  if (!s.device.defined()) {
    TORCH_CHECK(s.host.defined(), "activation offloading: block ", handle, "'s input was taken already");
    bring_back(s);
  }
  s.arrived.wait_on(dev::current_stream(device_));
  Tensor x = std::move(s.device);
  // A pinned buffer goes back to LibTorch's host cache, which keeps it until the copy
  // queued from it is done.
  if (s.host.defined()) host_bytes_ -= static_cast<std::int64_t>(s.host.nbytes());
  s = Slot{};
  on_device_.erase(std::remove(on_device_.begin(), on_device_.end(), handle), on_device_.end());
  // The next blocks' inputs (backward goes down), up to max_inflight on the device with this one.
  for (std::int64_t b = handle - 1; b >= 0 && b > handle - settings_.max_inflight; --b) {
    Slot& next = slots_[static_cast<std::size_t>(b)];
    if (!next.device.defined() && next.host.defined()) bring_back(next);
  }
  return x;
}

}  // namespace primecfg::train
