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

// The host memory goes with the arena: no copy may still use it.
ActivationOffload::~ActivationOffload() {
  dev::synchronize(to_host_);
  dev::synchronize(to_device_);
}

// Block `block`'s place in the arena, shaped like x. The arena is (re)allocated when the
// inputs grow, which happens with the first forward pass (all inputs of a pass have
// the same shape).
Tensor ActivationOffload::host_slot(std::int64_t block, const Tensor& like) {
  const auto bytes = static_cast<std::int64_t>(like.nbytes());
  if (bytes > slot_bytes_) {
    for (const Slot& s : slots_)
      TORCH_CHECK(!s.host.defined(), "activation offloading: block inputs of different sizes in one pass");
    dev::synchronize(to_host_);
    dev::synchronize(to_device_);
    arena_ = Tensor();
    const std::int64_t slots = block_inputs_offloaded(blocks_, settings_.max_inflight);
    const bool pinned = settings_.pin_memory && device_.is_cuda();
    try {
      arena_ = dev::exact_pinned(slots * bytes, pinned ? device_ : torch::Device(torch::kCPU));
    } catch (const std::exception& e) {
      stats_.host_bytes = 0;
      slot_bytes_ = 0;
      throw host_memory_error(fmt::format(
          "activation offloading (model.ac_offloading) could not allocate {:.2f} GiB of {} host memory for "
          "{} block inputs of {:.1f} MiB ({})",
          static_cast<double>(slots * bytes) / (1 << 30), pinned ? "pinned" : "pageable", slots,
          static_cast<double>(bytes) / (1 << 20), e.what()));
    }
    slot_bytes_ = bytes;
    stats_.host_bytes = slots * bytes;
    for (Slot& s : slots_) s.read = dev::Marker();
  }
  return arena_.narrow(0, block * slot_bytes_, bytes).view(like.scalar_type()).view(like.sizes());
}

std::int64_t ActivationOffload::stash(const Tensor& x, std::int64_t block) {
  TORCH_CHECK(block >= 0 && block < blocks_, "activation offloading: block ", block, " of ", blocks_);
  if (block == 0) {  // a new forward pass: whatever an earlier one left (no backward ran) goes
    for (Slot& s : slots_) {
      s.copied.synchronize();   // the copy out may still read the device input
      s.arrived.synchronize();  // a copy back (a backward that stopped part-way) may still write it
      s = Slot{Tensor(), Tensor(), {}, {}, s.read};
    }
    on_device_.clear();
  }
  Slot& slot = slots_[static_cast<std::size_t>(block)];
  while (static_cast<std::int64_t>(on_device_.size()) >= settings_.max_inflight) release_oldest();
  slot = Slot{x, Tensor(), {}, {}, slot.read};
  on_device_.push_back(block);
  // The last max_inflight blocks' inputs are never released before their backward.
  if (block < block_inputs_offloaded(blocks_, settings_.max_inflight)) {
    slot.host = host_slot(block, x);
    dev::Marker::record(dev::current_stream(device_)).wait_on(to_host_);  // x is complete
    slot.read.wait_on(to_host_);  // the last pass's copy back out of this memory is done
    {
      dev::StreamScope on(to_host_);
      slot.host.copy_(x, /*non_blocking=*/true);
    }
    slot.copied = dev::Marker::record(to_host_);
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
  s.device = torch::empty(s.host.sizes(), s.host.options().device(device_));
  dev::Marker::record(dev::current_stream(device_)).wait_on(to_device_);
  s.copied.wait_on(to_device_);
  {
    dev::StreamScope on(to_device_);
    s.device.copy_(s.host, /*non_blocking=*/true);
  }
  s.arrived = dev::Marker::record(to_device_);
  s.read = s.arrived;
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
  s = Slot{Tensor(), Tensor(), {}, {}, s.read};
  on_device_.erase(std::remove(on_device_.begin(), on_device_.end(), handle), on_device_.end());
  // The next blocks' inputs (backward goes down), up to max_inflight on the device with this one.
  for (std::int64_t b = handle - 1; b >= 0 && b > handle - settings_.max_inflight; --b) {
    Slot& next = slots_[static_cast<std::size_t>(b)];
    if (!next.device.defined() && next.host.defined()) bring_back(next);
  }
  return x;
}

}  // namespace primecfg::train
