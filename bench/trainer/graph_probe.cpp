// What a CUDA graph would save on primecfg's forward and backward (issue 31, item 2):
// the model's loss and backward at a fixed shape, run eagerly and replayed from one
// captured graph, in alternating rounds on one GPU. Both run the same kernels (the
// fused ones the trainer uses); the difference is the host's launches and the GPU's
// idle time between them, which is all a graph can remove.
//
// usage: graph_probe MODEL SEQ_LEN [ROUNDS] [STEPS_PER_ROUND]
//   MODEL: a preset name (Qwen/Qwen3-0.6B, meta-llama/Llama-3.2-3B, ...)
// Prints one line per round and a summary: median seconds per step of each, and the
// graph's gain. bench/trainer/graph_probe.sh runs it on the GPU machine.
#include "model/config.hpp"
#include "nn/loss_chunking.hpp"
#include "nn/transformer.hpp"

#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

using primecfg::train::Recompute;
using primecfg::train::Transformer;
using torch::Tensor;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: graph_probe MODEL SEQ_LEN [ROUNDS] [STEPS_PER_ROUND]\n");
    return 2;
  }
  const auto args = primecfg::train::preset(argv[1]);
  if (!args) {
    std::fprintf(stderr, "graph_probe: no preset named %s\n", argv[1]);
    return 2;
  }
  const std::int64_t T = std::atoll(argv[2]);
  const int rounds = argc > 3 ? std::atoi(argv[3]) : 5;
  const int steps = argc > 4 ? std::atoi(argv[4]) : 5;
  if (!torch::cuda::is_available() || T < 2 || rounds < 1 || steps < 1) {
    std::fprintf(stderr, "graph_probe: needs a CUDA device, SEQ_LEN >= 2, ROUNDS and STEPS >= 1\n");
    return 2;
  }
  const torch::Device dev(torch::kCUDA, 0);
  Transformer model(*args, dev, torch::kBFloat16, 1234);
  const auto ids_opts = torch::TensorOptions().dtype(torch::kInt64).device(dev);
  // Static inputs: a graph replays on the same addresses.
  Transformer::Inputs in;
  in.input_ids = torch::randint(args->vocab_size, {1, T}, ids_opts);
  in.positions = torch::arange(T, ids_opts).unsqueeze(0);
  const Tensor targets = torch::roll(in.input_ids, -1, 1).reshape({-1});
  const std::int64_t chunk = primecfg::train::default_ce_chunk_tokens(args->vocab_size);
  const double scale = 1.0 / static_cast<double>(T);

  // One forward and backward, as the trainer's `none` step runs them (no checkpointing):
  // autograd's fresh gradients each time, as the hand-over to the fused AdamW takes them.
  auto step = [&] {
    for (auto& p : model.params()) p.tensor.mutable_grad() = Tensor();
    Tensor loss = model.loss(model.hidden(in, Recompute::nothing), targets, scale, chunk);
    loss.backward();
    return loss;
  };

  // Warm-up on a side stream (a capture must not be the first use of cuBLAS, autograd's
  // device thread or the allocator's pools).
  {
    auto side = c10::cuda::getStreamFromPool();
    side.synchronize();
    c10::cuda::CUDAStreamGuard guard(side);
    for (int i = 0; i < 3; ++i) step();
    side.synchronize();
  }
  torch::cuda::synchronize();

  // Capture: the gradients are then the graph's (its pool), rewritten by each replay.
  at::cuda::CUDAGraph graph;
  Tensor static_loss;
  {
    auto side = c10::cuda::getStreamFromPool();
    c10::cuda::CUDAStreamGuard guard(side);
    for (auto& p : model.params()) p.tensor.mutable_grad() = Tensor();
    graph.capture_begin();
    static_loss = model.loss(model.hidden(in, Recompute::nothing), targets, scale, chunk);
    static_loss.backward();
    graph.capture_end();
  }
  torch::cuda::synchronize();
  // The captured gradients stay referenced by the parameters: the eager rounds below
  // give each parameter fresh ones, so hold the graph's apart.
  std::vector<Tensor> graph_grads;
  for (auto& p : model.params()) graph_grads.push_back(p.tensor.grad());

  auto timed = [&](auto&& one) {
    torch::cuda::synchronize();
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < steps; ++i) {
      one();
      torch::cuda::synchronize();  // the trainer's step ends on the host too
    }
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / steps;
  };
  std::vector<double> eager, replay;
  double eager_loss = 0, graph_loss = 0;
  for (int r = 0; r < rounds; ++r) {
    eager.push_back(timed([&] { eager_loss = step().item<double>(); }));
    replay.push_back(timed([&] { graph.replay(); }));
    graph_loss = static_loss.item<double>();
    std::printf("round %d: eager %.4f s, graph %.4f s a step (loss %.6f / %.6f)\n", r, eager.back(),
                replay.back(), eager_loss, graph_loss);
  }
  // The same inputs and weights: a replay must give the eager loss, else the graph is
  // not the step (a relative 1e-5 leaves room for a GEMM that picks another algorithm
  // on the capture's stream).
  const double em = median(eager), gm = median(replay);
  std::printf(
      "%s T=%lld: eager %.4f s, graph %.4f s (median of %d rounds of %d); graph saves %.2f%%; "
      "loss eager %.6f graph %.6f; peak %.2f GiB\n",
      argv[1], static_cast<long long>(T), em, gm, rounds, steps, 100.0 * (em - gm) / em, eager_loss,
      graph_loss,
      static_cast<double>(c10::cuda::CUDACachingAllocator::getDeviceStats(0).allocated_bytes[0].peak) /
          (1 << 30));
  return std::abs(eager_loss - graph_loss) <= 1e-5 * std::abs(eager_loss) ? 0 : 1;
}
