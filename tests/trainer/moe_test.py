"""The routed experts of primecfg-train (nn/moe.hpp) against transformers' Qwen3-MoE.

transformers' Qwen3MoeSparseMoeBlock (router: softmax, top-k, renormalised when
norm_topk_prob; experts: SwiGLU) is built from Qwen3MoeConfig with random weights;
moe_probe (tests/trainer/moe_probe.cpp) runs the same weights and inputs. For each
setting, in FP32 on the CPU:

- the routing: every expert gets the slots transformers' router gives it;
- the output and the gradients of the input, the router and every expert's weights
  are as close to the float64 result as transformers' own FP32 result is, within a
  factor of 4 (the bound comes from FP32's rounding, as transformers' error shows it,
  not from a tolerance picked by hand);
- each of the three ways of running the experts (grouped, with the batched fallback
  that the CPU runs; the per-expert loop) and prime-rl's force-balanced routing
  (slot j of token t to expert (t k + j) mod E, the router's probabilities there).

usage: moe_test.py MOE_PROBE
"""

import os
import subprocess
import sys
import tempfile

import torch
from safetensors.torch import load_file, save_file
from transformers import Qwen3MoeConfig
from transformers.models.qwen3_moe import modeling_qwen3_moe as hf

PROBE = sys.argv[1]
N, D, I, E = 24, 16, 8, 8


def reference(weights, x, dy, top_k, norm, balanced, dtype):
    """transformers' block on the weights, in dtype: y and the gradients."""
    cfg = Qwen3MoeConfig(hidden_size=D, moe_intermediate_size=I, num_experts=E, num_experts_per_tok=top_k,
                         norm_topk_prob=norm)
    cfg._experts_implementation = "eager"  # the per-expert loop shown in modeling_qwen3_moe.py
    block = hf.Qwen3MoeSparseMoeBlock(cfg).to(dtype)
    with torch.no_grad():
        block.gate.weight.copy_(weights["router"])
        block.experts.gate_up_proj.copy_(torch.cat([weights["w1"], weights["w3"]], dim=1))
        block.experts.down_proj.copy_(weights["w2"])
    if balanced:
        # prime-rl's force_balanced_routing on transformers' router: the ids fixed, the
        # weights its softmax probabilities there, renormalised as usual.
        def forward(hidden):
            logits = torch.nn.functional.linear(hidden, block.gate.weight)
            probs = torch.softmax(logits, dtype=torch.float, dim=-1)
            ids = (torch.arange(hidden.shape[0] * top_k) % E).view(-1, top_k)
            w = probs.gather(1, ids)
            if norm:
                w = w / w.sum(-1, keepdim=True)
            return logits, w.to(logits.dtype), ids
        block.gate.forward = forward
    xs = x.to(dtype).clone().requires_grad_(True)
    y = block(xs.view(1, N, D)).view(N, D)
    (y * dy.to(dtype)).sum().backward()
    gu = block.experts.gate_up_proj.grad
    with torch.no_grad():
        ids = block.gate(xs.detach())[2]
    return {"y": y.detach(), "dx": xs.grad, "drouter": block.gate.weight.grad, "dw1": gu[:, :I], "dw3": gu[:, I:],
            "dw2": block.experts.down_proj.grad, "counts": torch.bincount(ids.flatten(), minlength=E)}


def check(top_k, norm, grouped, balanced, seed, recompute=False):
    what = (f"top_k {top_k}, norm_topk_prob {norm}, {'grouped' if grouped else 'loop'}" +
            (", force_balanced" if balanced else "") + (", experts recomputed in backward" if recompute else ""))
    g = torch.Generator().manual_seed(seed)
    weights = {"router": torch.randn(E, D, generator=g), "w1": torch.randn(E, I, D, generator=g) / D ** 0.5,
               "w3": torch.randn(E, I, D, generator=g) / D ** 0.5, "w2": torch.randn(E, D, I, generator=g) / I ** 0.5}
    x, dy = torch.randn(N, D, generator=g), torch.randn(N, D, generator=g)
    with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR")) as d:
        save_file({**weights, "x": x, "dy": dy}, os.path.join(d, "in.safetensors"),
                  metadata={"top_k": str(top_k), "norm_topk_prob": str(int(norm)), "grouped": str(int(grouped)),
                            "force_balanced": str(int(balanced)), "recompute": str(int(recompute))})
        p = subprocess.run([PROBE, os.path.join(d, "in.safetensors"), os.path.join(d, "out.safetensors")],
                           capture_output=True, text=True)
        if p.returncode != 0:
            raise AssertionError(f"{what}: moe_probe failed: {p.stderr}")
        ours = load_file(os.path.join(d, "out.safetensors"))
    exact = reference(weights, x, dy, top_k, norm, balanced, torch.float64)
    hf32 = reference(weights, x, dy, top_k, norm, balanced, torch.float32)
    if not torch.equal(ours["tokens_per_expert"].long(), hf32["counts"]):
        raise AssertionError(f"{what}: slots per expert {ours['tokens_per_expert'].tolist()}, transformers routes "
                             f"{hf32['counts'].tolist()}")
    for name in ("y", "dx", "drouter", "dw1", "dw3", "dw2"):
        truth = exact[name]
        ours_err = (ours[name].double() - truth).abs().max().item()
        hf_err = (hf32[name].double() - truth).abs().max().item()
        # transformers' own FP32 rounding sets the scale; 2^-24 of the largest value
        # keeps a bound for results transformers happens to round exactly.
        bound = 4 * max(hf_err, 2 ** -24 * truth.abs().max().item())
        if not ours_err <= bound:
            raise AssertionError(f"{what}: {name} is {ours_err:.3g} from the float64 result, transformers' FP32 "
                                 f"{hf_err:.3g} (bound {bound:.3g})")
    print(f"ok: {what}")


def main():
    torch.set_num_threads(1)
    seed = 0
    for top_k, norm in ((2, True), (2, False), (3, False), (1, True)):
        for grouped in (True, False):
            seed += 1
            check(top_k, norm, grouped, False, seed)
    check(2, True, True, True, 100)
    check(2, False, False, True, 101)
    # Selective checkpointing of "routed_experts": the same gradients from the recompute.
    check(2, True, True, False, 102, recompute=True)
    check(3, False, False, False, 103, recompute=True)


if __name__ == "__main__":
    main()
