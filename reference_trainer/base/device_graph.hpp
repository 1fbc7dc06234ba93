// Device work captured once as a CUDA graph and replayed: the training loop's forward
// and backward of a micro-batch whose shapes do not change (docs/trainer.md, "CUDA
// graph"). Capturing runs the host code of the work once and records its device work
// without running it; a replay runs that device work again, on the same memory (the
// graph's own pool), with no launches from the host. So the inputs are copied into the
// tensors the capture read, the outputs read from the tensors it wrote, and anything the
// host code did (hooks keeping tensors) is what every replay has done.
#pragma once

#include <torch/torch.h>

#include <exception>
#include <functional>
#include <memory>

namespace primecfg::train::dev {

class DeviceGraph {
 public:
  DeviceGraph();
  ~DeviceGraph();
  DeviceGraph(const DeviceGraph&) = delete;
  DeviceGraph& operator=(const DeviceGraph&) = delete;

  // Whether this build captures graphs on `d` (CUDA devices, in a CUDA build).
  static bool supported(torch::Device d);
  // Captures the device work of `work`, queued on a side stream of `d` once the device
  // is idle (its cached free memory handed back first: the graph's pool is new memory).
  // Nothing of it runs until replay(). Throws where the work cannot be captured (it
  // waits for the device, or reads a value back); nothing is kept then.
  void capture(torch::Device d, const std::function<void()>& work);
  bool captured() const;
  // Queues the captured work on the current stream.
  void replay();

  // Whether `e`, thrown by capture(), is the caching allocator running out of device
  // memory (the run may go on eagerly), not work that cannot be captured.
  static bool out_of_memory(const std::exception& e);
  // Hands the allocator's cached free memory back to the device, once the device is idle:
  // before a capture (which cannot release a block), and after one that failed, its pool's
  // once nothing holds a tensor of it.
  static void release_cached(torch::Device d);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace primecfg::train::dev
