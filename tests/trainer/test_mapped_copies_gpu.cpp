// base/mapped_copies.hpp: the values cross exactly (on the CPU too), and on a CUDA device
// neither direction waits for a large copy queued in its direction on another stream (the
// offload pipelines' moments). The GPU cases skip where LibTorch has no usable CUDA device.
#include "base/device_streams.hpp"
#include "base/mapped_copies.hpp"

#include <doctest/doctest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

using namespace primecfg::train;

namespace {

bool have_cuda() {
  if (torch::cuda::is_available()) return true;
  MESSAGE("no CUDA device: GPU tests skipped");
  return false;
}

void check_round_trip(torch::Device d) {
  CAPTURE(d.str());
  const std::vector<std::int64_t> values = {
      0, 1, -100, 151935, std::numeric_limits<std::int32_t>::max(), std::numeric_limits<std::int32_t>::min(),
      7};
  const torch::Tensor up = dev::upload_ints(values, {7}, d);
  CHECK(up.device().type() == d.type());
  CHECK((up.scalar_type() == torch::kInt64));
  CHECK(dev::read_back_ints(up) == values);
  CHECK(dev::read_back_ints(up.view({7, 1}).expand({7, 3}).t()).size() == 21);  // strided: row-major
  CHECK(dev::read_back_ints(at::bincount(up.clamp(0, 9), {}, 10))[0] == 3);
  // A value outside 32 bits is refused by name, never truncated.
  CHECK_THROWS_WITH_AS(dev::upload_ints({1, std::int64_t{1} << 31}, {2}, d),
                       "upload_ints: value 2147483648 at index 1 does not fit in 32 bits",
                       std::invalid_argument);
  CHECK_THROWS_AS(dev::read_back_ints(up.to(torch::kInt32)), std::logic_error);
}

// 2 GiB between pinned host memory and the device on a side stream: about 40 ms at the
// link's 50 GB/s, so a transfer that waits for it cannot finish before it.
struct BulkCopy {
  torch::Tensor host, device;
  dev::MaybeStream stream;
  dev::Marker done;
  BulkCopy(torch::Device d, bool to_device)
      : host(dev::exact_pinned(std::int64_t{2} << 30, d)),
        device(torch::empty({std::int64_t{2} << 30}, torch::TensorOptions().dtype(torch::kUInt8).device(d))),
        stream(dev::side_stream(d)) {
    {
      dev::StreamScope on(stream);
      if (to_device)
        device.copy_(host, /*non_blocking=*/true);
      else
        host.copy_(device, /*non_blocking=*/true);
    }
    done = dev::Marker::record(stream);
  }
  ~BulkCopy() { done.synchronize(); }
};

}  // namespace

TEST_CASE("small integers go up and come back exactly (the CPU, then through mapped memory on a GPU)") {
  check_round_trip(torch::kCPU);
  if (have_cuda()) check_round_trip(torch::Device("cuda"));
}

TEST_CASE("GPU: a read-back and an upload do not wait for a bulk copy queued in their direction") {
  if (!have_cuda()) return;
  const torch::Device d("cuda");
  const torch::Tensor counts = torch::arange(128, torch::TensorOptions().dtype(torch::kInt64).device(d));
  // The pinned allocator's first blocks are made before the bulk copies start.
  (void)dev::read_back_ints(dev::upload_ints({1, 2, 3}, {3}, d));
  {
    BulkCopy down(d, /*to_device=*/false);
    const std::vector<std::int64_t> back = dev::read_back_ints(counts);
    CHECK_FALSE(down.done.reached());  // the counts came back while the bulk copy ran
    CHECK(back[127] == 127);
  }
  {
    BulkCopy up(d, /*to_device=*/true);
    const torch::Tensor ids = dev::upload_ints({5, 6, 7}, {3}, d);
    dev::synchronize(dev::current_stream(d));  // the upload has landed
    CHECK_FALSE(up.done.reached());
    CHECK(dev::read_back_ints(ids) == std::vector<std::int64_t>{5, 6, 7});
  }
  // What the trainer did before (.cpu(), a copy engine), for the record: reported, not held.
  {
    BulkCopy down(d, /*to_device=*/false);
    const auto t0 = std::chrono::steady_clock::now();
    (void)counts.cpu();
    MESSAGE("counts.cpu() beside a 2 GiB copy down: ",
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count(),
            " ms; the bulk copy ", std::string(down.done.reached() ? "had finished" : "was still running"));
  }
}
