#include "offload/shared/device_update.hpp"

#if PRIMECFG_WITH_CUDA && PRIMECFG_FUSED_KERNELS
#include "optim/kernels/adamw.hpp"

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#define PRIMECFG_HAVE_FUSED_ADAMW 1
#else
#define PRIMECFG_HAVE_FUSED_ADAMW 0
#endif

#include <cstring>

namespace primecfg::train {

Tensor clip_grad_norm(std::vector<ParamState>& states, const std::optional<double>& max_norm, Sharding* dp) {
  std::vector<Tensor> grads;
  for (auto& s : states) grads.push_back(s.grad);
  Tensor sq = at::stack(at::_foreach_norm(grads, 2)).to(torch::kFloat64).square().sum();
  if (dp) dp->sum_pieces(sq, "the sum of the gradient norms");
  Tensor norm = sq.sqrt();
  if (max_norm)
    at::_foreach_mul_(grads, (norm + 1e-6).reciprocal().mul(*max_norm).clamp_max(1.0).to(torch::kFloat32));
  return norm;
}

void update_resident(std::vector<ParamState>& states, const OptSettings& opt, double lr, std::int64_t step) {
  torch::NoGradGuard ng;
  if (opt.kind == OptKind::adamw) {
    // One multi-tensor launch for all parameters (the same arithmetic as one
    // call per parameter).
    std::vector<Tensor> ps, gs, a, b;
    for (auto& s : states) {
      if (s.p->frozen) continue;
      ps.push_back(s.master);
      gs.push_back(s.grad);
      a.push_back(s.m1);
      b.push_back(s.m2);
    }
    Tensor step_t = torch::full({}, static_cast<double>(step), states[0].master.options());
    std::vector<Tensor> steps(ps.size(), step_t);
    at::_fused_adamw_(ps, gs, a, b, {}, steps, lr, opt.beta1, opt.beta2, opt.weight_decay, opt.eps, false,
                      false);
  } else {
    for (auto& s : states)
      if (!s.p->frozen)
        update_on_device(opt, *s.p, s.master, s.grad, s.m1.defined() ? &s.m1 : nullptr,
                         s.m2.defined() ? &s.m2 : nullptr, lr, step);
  }
  // The new weights, in one multi-tensor launch.
  std::vector<Tensor> weights, masters;
  for (auto& s : states) {
    if (s.p->frozen) continue;
    weights.push_back(s.weight);
    masters.push_back(s.master);
  }
  at::_foreach_copy_(weights, masters);
}

bool ResidentUpdate::applies_to(Transformer& model, const OptSettings& opt) const {
  if (!PRIMECFG_HAVE_FUSED_ADAMW || !enabled_ || opt.kind != OptKind::adamw || !model.device().is_cuda())
    return false;
  // (The kernel updates every parameter it is given: a frozen one takes the path above.)
  for (const auto& p : model.params())
    if (p.tensor.scalar_type() != torch::kBFloat16 || p.frozen) return false;
  return true;
}

bool ResidentUpdate::applies(const std::vector<ParamState>& states, const OptSettings& opt,
                             const std::vector<Tensor>* compute_grads) const {
  if (!PRIMECFG_HAVE_FUSED_ADAMW || !enabled_ || opt.kind != OptKind::adamw || states.empty()) return false;
  const auto device = states.front().master.device();
  if (!device.is_cuda()) return false;
  auto dense = [&](const Tensor& t, std::int64_t n, torch::ScalarType type) {
    return t.defined() && t.device() == device && t.scalar_type() == type && t.is_contiguous() &&
           t.numel() == n;
  };
  for (std::size_t i = 0; i < states.size(); ++i) {
    const auto& s = states[i];
    if (s.p->frozen) return false;
    const std::int64_t n = s.master.numel();
    const bool grad =
        compute_grads ? dense((*compute_grads)[i], n, torch::kBFloat16) : dense(s.grad, n, torch::kFloat32);
    if (!grad || !dense(s.master, n, torch::kFloat32) || !dense(s.m1, n, torch::kFloat32) ||
        !dense(s.m2, n, torch::kFloat32) || !dense(s.weight, n, torch::kBFloat16))
      return false;
  }
  return true;
}

#if PRIMECFG_HAVE_FUSED_ADAMW

// The state does not move between steps; autograd's gradients (compute_grads) usually
// come back at the same addresses. The table goes to the device when it changed, from
// pinned memory (the host allocator keeps that buffer until the copy has read it), so
// that no upload waits for the device.
void ResidentUpdate::upload_table(const std::vector<ParamState>& states,
                                  const std::vector<Tensor>* compute_grads) {
  std::vector<kernels::AdamWParam> params;
  params.reserve(states.size());
  for (std::size_t i = 0; i < states.size(); ++i) {
    const auto& s = states[i];
    kernels::AdamWParam q;
    q.master = s.master.data_ptr<float>();
    if (compute_grads)
      q.grad16 = reinterpret_cast<const kernels::bf16*>((*compute_grads)[i].data_ptr());
    else
      q.grad = s.grad.data_ptr<float>();
    q.exp_avg = s.m1.data_ptr<float>();
    q.exp_avg_sq = s.m2.data_ptr<float>();
    q.weight = reinterpret_cast<kernels::bf16*>(s.weight.data_ptr());
    q.n = s.master.numel();
    params.push_back(q);
  }
  const int count = static_cast<int>(params.size());
  std::vector<std::uint8_t> host(kernels::adamw_table(params.data(), count, nullptr));
  kernels::adamw_table(params.data(), count, host.data());
  if (host == table_host_) return;
  const auto device = states.front().master.device();
  const auto bytes = static_cast<std::int64_t>(host.size());
  Tensor pinned = torch::empty({bytes}, torch::TensorOptions().dtype(torch::kUInt8).pinned_memory(true));
  std::memcpy(pinned.data_ptr(), host.data(), host.size());
  if (!table_.defined() || table_.numel() != bytes)
    table_ = torch::empty({bytes}, torch::TensorOptions().dtype(torch::kUInt8).device(device));
  table_.copy_(pinned, /*non_blocking=*/true);
  table_host_ = std::move(host);
  chunks_ = kernels::adamw_chunks(params.data(), count);
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat32).device(device);
  if (!chunk_sq_.defined() || chunk_sq_.numel() < chunks_)
    chunk_sq_ = torch::empty({std::max<std::int64_t>(chunks_, 1)}, f32);
  if (!total_sq_.defined()) {
    total_sq_ = torch::empty({}, f32.dtype(torch::kFloat64));
    step_t_ = torch::empty({}, f32);
  }
}

#endif

Tensor ResidentUpdate::step(std::vector<ParamState>& states, const OptSettings& opt, double lr,
                            std::int64_t step, Sharding* dp, const std::vector<Tensor>* compute_grads) {
  fused_ = applies(states, opt, compute_grads);
  if (!fused_) {
    TORCH_CHECK(!compute_grads,
                "ResidentUpdate: bf16 gradients handed over where the fused kernel does not apply");
    Tensor norm = clip_grad_norm(states, opt.max_norm, dp);
    update_resident(states, opt, lr, step);
    return norm;
  }
#if PRIMECFG_HAVE_FUSED_ADAMW
  torch::NoGradGuard ng;
  c10::cuda::CUDAGuard guard(states.front().master.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();
  upload_table(states, compute_grads);
  const int count = static_cast<int>(states.size());
  const kernels::AdamWHyper hyper{static_cast<float>(lr), static_cast<float>(opt.beta1),
                                  static_cast<float>(opt.beta2), static_cast<float>(opt.weight_decay),
                                  static_cast<float>(opt.eps)};
  step_t_.fill_(static_cast<double>(step));
  if (opt.max_norm || dp) {
    // The norm first: clipping needs it before the update, and with ranks it is a sum
    // over them.
    kernels::adamw_grad_squares(table_.data_ptr(), count, chunks_, chunk_sq_.data_ptr<float>(), stream);
    kernels::sum_chunks(chunk_sq_.data_ptr<float>(), chunks_, total_sq_.data_ptr<double>(), stream);
    Tensor sq = total_sq_.clone();
    if (dp) dp->sum_pieces(sq, "the sum of the gradient norms");
    Tensor norm = sq.sqrt();
    Tensor scale;
    if (opt.max_norm)
      scale = (norm + 1e-6).reciprocal().mul(*opt.max_norm).clamp_max(1.0).to(torch::kFloat32);
    kernels::adamw_step(table_.data_ptr(), count, chunks_, hyper, step_t_.data_ptr<float>(),
                        scale.defined() ? scale.data_ptr<float>() : nullptr, nullptr, stream);
    return norm;
  }
  kernels::adamw_step(table_.data_ptr(), count, chunks_, hyper, step_t_.data_ptr<float>(), nullptr,
                      chunk_sq_.data_ptr<float>(), stream);
  kernels::sum_chunks(chunk_sq_.data_ptr<float>(), chunks_, total_sq_.data_ptr<double>(), stream);
  return total_sq_.sqrt();
#else
  TORCH_CHECK(false, "ResidentUpdate: no fused kernel in this build");  // applies() said so already
#endif
}

}  // namespace primecfg::train
