// Activation offloading (model.ac_offloading): under activation checkpointing each
// block keeps only its input for the backward pass; this moves those inputs to host
// memory during the forward pass and brings them back, ahead of need, during the
// backward pass. What stays on the device is a window of `max_inflight` block inputs:
//
//   forward   block l's input is copied to host memory on a copy stream, beside the
//             compute; the device copy of the input stashed max_inflight blocks
//             earlier is released once its copy is known to be done. The last
//             max_inflight blocks' inputs stay on the device: their backward comes
//             first, so a round trip would only add traffic.
//   backward  taking block l's input starts the upload of blocks l-1 .. l-max_inflight+1
//             on a second copy stream, so each arrives while a later block recomputes.
//
// The same limit as torchtune's `max_fwd_stash_size`, which prime-rl's
// `max_inflight_activations` configures. On the CPU the "host" is the same memory:
// the inputs are copied there and back all the same, so the CPU tests exercise the
// bookkeeping (which input comes back for which block).
//
// One forward pass, then its backward, at a time (the trainer's micro-batches); the
// backward may run on autograd's device thread, never beside the forward.
//
// Internal to nn/.
#pragma once

#include "base/device_streams.hpp"
#include "nn/activation_window.hpp"

#include <torch/torch.h>

#include <cstdint>
#include <deque>
#include <vector>

namespace primecfg::train {

class ActivationOffload {
 public:
  struct Settings {
    bool pin_memory = true;         // page-locked host memory (asynchronous copies)
    std::int64_t max_inflight = 5;  // block inputs on the device at once
  };
  // `blocks`: the number of checkpointed blocks of a forward pass, in order 0..blocks-1.
  ActivationOffload(torch::Device device, std::int64_t blocks, Settings s);
  ~ActivationOffload();
  ActivationOffload(const ActivationOffload&) = delete;
  ActivationOffload& operator=(const ActivationOffload&) = delete;

  // Forward: keeps block `block`'s input x; returns the handle its backward passes to take().
  std::int64_t stash(const torch::Tensor& x, std::int64_t block);
  // Backward: the input again, on the device and ordered before the calling stream's
  // next work; starts bringing back the inputs the next blocks' backward needs.
  torch::Tensor take(std::int64_t handle);

  // Counters since construction (metrics.jsonl).
  struct Stats {
    std::int64_t bytes_to_host = 0;    // block inputs copied out
    std::int64_t bytes_to_device = 0;  // block inputs brought back
    std::int64_t host_bytes = 0;       // the host memory allocated for them
    double wait_s = 0;                 // forward waited for an earlier copy before releasing its input
  };
  const Stats& stats() const { return stats_; }

 private:
  struct Slot {
    torch::Tensor device;  // on the device: kept, not yet released, or brought back
    torch::Tensor host;    // its copy in host memory (absent for the kept last blocks)
    dev::Marker copied;    // the copy to the host is done
    dev::Marker arrived;   // the copy back to the device is done
    dev::Marker read;      // the last copy out of this slot's host memory is done (kept across passes)
  };
  torch::Tensor host_slot(std::int64_t block, const torch::Tensor& like);
  void release_oldest();
  void bring_back(Slot& s);

  torch::Device device_;
  std::int64_t blocks_;
  Settings settings_;
  dev::MaybeStream to_host_, to_device_;
  std::vector<Slot> slots_;
  std::deque<std::int64_t> on_device_;  // stashed this forward pass and not released, oldest first
  // One host buffer for all offloaded inputs, slot_bytes_ each: allocated once, exactly
  // (LibTorch's pinned allocator would round every buffer up to a power of two: up to
  // twice the memory).
  torch::Tensor arena_;
  std::int64_t slot_bytes_ = 0;
  Stats stats_;
};

}  // namespace primecfg::train
