// Streams and events of the training device, through c10's device-generic
// interfaces, so the offload strategies are written once: on a CUDA device the
// copies run on side streams and are ordered with events; on the CPU every copy is
// synchronous, there are no streams, and all of this does nothing.
#pragma once

#include <c10/core/Event.h>
#include <c10/core/Stream.h>
#include <c10/core/StreamGuard.h>
#include <torch/types.h>

#include <memory>
#include <optional>
#include <string>

namespace primecfg::train::dev {

using MaybeStream = std::optional<c10::Stream>;

// The stream the calling thread issues device work on (nullopt on the CPU).
MaybeStream current_stream(torch::Device d);
// A stream from the device's pool, for copies beside the compute stream.
MaybeStream side_stream(torch::Device d);
// Blocks the calling thread until everything queued on `s` has run.
void synchronize(const MaybeStream& s);

// A point in a stream's queue (copies share the event). Recording on no stream
// (the CPU) gives a marker that is already reached.
class Marker {
 public:
  Marker() = default;
  static Marker record(const MaybeStream& s);
  // Queue-side wait: work queued on `s` after this waits for the marker.
  void wait_on(const MaybeStream& s) const;
  // Host-side wait.
  void synchronize() const;
  bool reached() const;

 private:
  std::shared_ptr<c10::Event> ev_;
};

// Runs the enclosed device work on `s` (no-op for nullopt).
struct StreamScope {
  explicit StreamScope(const MaybeStream& s) : guard_(s) {}
  c10::OptionalStreamGuard guard_;
};

// Page-locked host memory of exactly `bytes` for copies to and from CUDA device `d`
// (cudaHostAlloc), as a uint8 tensor that frees it; LibTorch's pinned allocator would
// round each buffer up to a power of two and keep it cached. Unlike that allocator's
// buffers, nothing keeps this one alive for a copy still queued: that is the caller's
// business. Pageable memory for other devices. Throws std::runtime_error on failure.
torch::Tensor exact_pinned(std::int64_t bytes, torch::Device d);

// PCI bus id of a CUDA device as CUDA reports it ("0000:00:06.0"; follows
// CUDA_VISIBLE_DEVICES), "" for other devices or builds without CUDA.
std::string pci_bus_id(torch::Device d);
// The device's name ("NVIDIA H200"), "" where unknown.
std::string device_name(torch::Device d);

}  // namespace primecfg::train::dev
