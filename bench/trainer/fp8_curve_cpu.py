"""FP8 training against FP32 on the CPU: does prime-rl's FP8 recipe by itself move the loss?

A small Qwen3 (transformers' class: 4 layers, hidden 256, vocabulary of 256 bytes) trains
STEPS steps of byte-tokenized standard-library sources twice from the same seed, with every
linear whose sides are multiples of 128 (not the LM head) as prime-rl's FP8 linear (the
three matmuls on e4m3 operands with blockwise scales, docs/design/fp8.md), the rest FP32;
then as plain FP32. AdamW at 3e-4 without clipping, as bench/trainer/fake.toml. Prints both
losses along the way and the largest relative gap of their 20-step means: what the format
alone costs, beside bench/trainer/fp8_curve.sh's GPU curve.

LOSS_SCALE multiplies the loss (and so every gradient; AdamW's step hardly changes): 256/8192
gives the output gradients the size they have when the loss is a mean over 8,192 tokens, as
in the GPU curve. FLOOR is the scale's floor (prime-rl's 1e-4): a group whose amax is below
448 x FLOOR is cast with the floor as its scale, so its values lose bits or flush to zero.
The FP8 run counts how many of the output gradients' groups the floor took.

usage: python3 bench/trainer/fp8_curve_cpu.py [STEPS] [SEQ] [LOSS_SCALE] [FLOOR]
(200, 256, 1, 1e-4: about 10 minutes on one core for both runs)
"""
import os
import statistics
import sys
import sysconfig

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

GROUP, E4M3_MAX = 128, 448.0
SCALE_FLOOR = float(sys.argv[4]) if len(sys.argv) > 4 else 1e-4
FLOORED = [0, 0]  # output-gradient groups cast with the floor as their scale, all such groups


def dequantized(x, row_group, col_group):
    """x (FP32 matrix) cast to e4m3 in row_group x col_group blocks and back: each block's
    scale max(amax / 448, 1e-4), values rounded to nearest even by torch's e4m3 cast after
    the clamp that saturates them (zeros fill a partial block)."""
    r, c = x.shape
    pr, pc = -(-r // row_group) * row_group, -(-c // col_group) * col_group
    p = torch.zeros(pr, pc)
    p[:r, :c] = x
    blocks = p.view(pr // row_group, row_group, pc // col_group, col_group)
    scales = (blocks.abs().amax(dim=(1, 3), keepdim=True) / E4M3_MAX).clamp(min=SCALE_FLOOR)
    q = (blocks / scales).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).float() * scales
    return q.view(pr, pc)[:r, :c]


def tokens_padded(t):
    """t [features, tokens] with the tokens zero-padded to a multiple of 128."""
    return torch.nn.functional.pad(t, (0, -t.shape[1] % GROUP))


class Fp8Linear(torch.autograd.Function):
    """y = x W^T on x by 1 x 128 and W by 128 x 128; dX on dY by 1 x 128 and W^T by 128 x 128;
    dW on dY^T and X^T by 1 x 128 along the tokens. Products in FP32."""

    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        x2 = x.reshape(-1, x.shape[-1])
        y = dequantized(x2, 1, GROUP) @ dequantized(w, GROUP, GROUP).t()
        return y.view(*x.shape[:-1], w.shape[0])

    @staticmethod
    def backward(ctx, dy):
        x, w = ctx.saved_tensors
        x2, dy2 = x.reshape(-1, x.shape[-1]), dy.reshape(-1, dy.shape[-1])
        amax = torch.nn.functional.pad(dy2.abs(), (0, -dy2.shape[1] % GROUP)).view(dy2.shape[0], -1, GROUP).amax(2)
        FLOORED[0] += int((amax / E4M3_MAX < SCALE_FLOOR).sum())
        FLOORED[1] += amax.numel()
        dx = dequantized(dy2, 1, GROUP) @ dequantized(w.t().contiguous(), GROUP, GROUP).t()
        dw = dequantized(tokens_padded(dy2.t()), 1, GROUP) @ dequantized(tokens_padded(x2.t()), 1, GROUP).t()
        return dx.view_as(x), dw


def byte_text(n):
    root, data = sysconfig.get_paths()["stdlib"], bytearray()
    for d, _, files in sorted(os.walk(root)):
        for name in sorted(files):
            if name.endswith(".py"):
                data += open(os.path.join(d, name), "rb").read()
        if len(data) >= n:
            break
    return torch.tensor(list(data[:n]), dtype=torch.long)


def train(fp8, steps, seq, data, loss_scale):
    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=256, hidden_size=256, intermediate_size=768, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=64, tie_word_embeddings=True,
                      max_position_embeddings=seq)
    model = Qwen3ForCausalLM(cfg).float()
    if fp8:
        for name, m in model.named_modules():
            if isinstance(m, torch.nn.Linear) and name != "lm_head" and m.in_features % GROUP == 0 \
                    and m.out_features % GROUP == 0:
                m.forward = (lambda mod: lambda x: Fp8Linear.apply(x, mod.weight))(m)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.01)
    losses = []
    for s in range(steps):
        ids = data[s * seq:(s + 1) * seq + 1]
        loss = torch.nn.functional.cross_entropy(model(ids[:-1].unsqueeze(0)).logits[0], ids[1:])
        opt.zero_grad()
        (loss * loss_scale).backward()
        opt.step()
        losses.append(loss.item())
        if s % 25 == 0 or s == steps - 1:
            print(f"{'FP8 ' if fp8 else 'FP32'} step {s + 1}: loss {loss.item():.4f}", flush=True)
    return losses


def main():
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    seq = int(sys.argv[2]) if len(sys.argv) > 2 else 256
    loss_scale = float(sys.argv[3]) if len(sys.argv) > 3 else 1.0
    torch.set_num_threads(1)
    data = byte_text(seq * (steps + 1) + 1)
    fp32, fp8 = train(False, steps, seq, data, loss_scale), train(True, steps, seq, data, loss_scale)
    mean = lambda xs, i: statistics.mean(xs[max(0, i - 20):i])
    gaps = [abs(mean(fp8, i) / mean(fp32, i) - 1) for i in range(20, steps + 1)]
    print(f"loss at the end: FP32 {fp32[-1]:.4f}, FP8 {fp8[-1]:.4f}; largest relative gap of the 20-step "
          f"means: {max(gaps):.4f}; output-gradient groups under the floor {SCALE_FLOOR:g}: "
          f"{FLOORED[0] / max(1, FLOORED[1]):.3f}")


if __name__ == "__main__":
    main()
