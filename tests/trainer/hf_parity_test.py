"""primecfg-train computes what transformers computes.

For each supported architecture and RoPE variant, transformers builds a small
random model (norms and biases perturbed so that every term matters, attention
sharp enough that positions matter) and saves it. primecfg-train loads the folder
and writes the FP32 CPU logits of a pre-tokenized batch (--dump-logits); they
must equal transformers' within 1e-5 of the largest logit. The same holds for
config.json in the transformers 4.x layout (rope_theta + rope_scaling) and the
5.x one (rope_parameters). Then the round trip: one training step saves a
checkpoint, transformers loads that folder, and its logits equal primecfg-train's
on it. Saved with a smaller --save.max-shard-bytes, the weights are split into the
files and index that huggingface_hub's split_torch_state_dict_into_shards gives for
transformers' state dict (what save_pretrained and prime-rl write), and both
programs read that folder. For Qwen3 and Qwen3-MoE, one SGD step's update is transformers'
gradient, parameter by parameter, and Qwen3-MoE's experts load from transformers 5's
fused layout as well. Finally, keys and tensors the trainer does not implement are
refused by name.

usage: hf_parity_test.py PRIMECFG_TRAIN
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile

import torch
import transformers
from huggingface_hub import split_torch_state_dict_into_shards
from safetensors.torch import load_file, save_file

TRAIN = sys.argv[1]
SEQ_LEN = 64
TOLERANCE = 1e-5  # of the largest logit

torch.manual_seed(0)


def small(cls, **kw):
    base = dict(
        vocab_size=96,
        hidden_size=64,
        intermediate_size=112,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
    )
    base.update(kw)
    return cls(**base)


def rope(kind, theta=10000.0):
    if kind == "default":
        return {"rope_type": "default", "rope_theta": theta}
    if kind == "linear":
        return {"rope_type": "linear", "rope_theta": theta, "factor": 2.0}
    if kind == "llama3":
        return {
            "rope_type": "llama3",
            "rope_theta": theta,
            "factor": 4.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        }
    if kind == "yarn":
        return {"rope_type": "yarn", "rope_theta": theta, "factor": 4.0, "original_max_position_embeddings": 64}
    raise ValueError(kind)


L, Q2, Q3, Q3M = transformers.LlamaConfig, transformers.Qwen2Config, transformers.Qwen3Config, transformers.Qwen3MoeConfig
CASES = {
    "llama-default": lambda: small(L, head_dim=16, rope_parameters=rope("default")),
    "llama-linear": lambda: small(L, head_dim=16, rope_parameters=rope("linear", 500000.0)),
    "llama-llama3": lambda: small(L, head_dim=16, rope_parameters=rope("llama3", 500000.0)),
    "llama-yarn": lambda: small(L, head_dim=16, rope_parameters=rope("yarn")),
    "llama-biases-tied": lambda: small(
        L, head_dim=16, attention_bias=True, mlp_bias=True, tie_word_embeddings=True, rope_parameters=rope("default")
    ),
    "llama-headdim-wide": lambda: small(L, head_dim=24, rope_parameters=rope("llama3")),
    "qwen2": lambda: small(Q2, rope_parameters=rope("default", 1000000.0)),
    "qwen2-tied-yarn": lambda: small(Q2, tie_word_embeddings=True, rope_parameters=rope("yarn")),
    "qwen3": lambda: small(Q3, head_dim=16, rope_parameters=rope("default", 1000000.0)),
    "qwen3-tied-bias-yarn": lambda: small(
        Q3, head_dim=16, attention_bias=True, tie_word_embeddings=True, rope_parameters=rope("yarn")
    ),
    # Routed experts: 8 of them, top-2, the second of three blocks dense (mlp_only_layers).
    "qwen3_moe": lambda: small(
        Q3M, head_dim=16, num_hidden_layers=3, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=48,
        mlp_only_layers=[1], norm_topk_prob=True, rope_parameters=rope("default", 1000000.0)
    ),
    # Every other block routed (decoder_sparse_step), the top-k weights not renormalised, tied.
    "qwen3_moe-sparse-step-tied": lambda: small(
        Q3M, head_dim=16, num_hidden_layers=4, num_experts=8, num_experts_per_tok=3, moe_intermediate_size=32,
        decoder_sparse_step=2, norm_topk_prob=False, tie_word_embeddings=True, rope_parameters=rope("yarn")
    ),
}


def perturb(model):
    """Every term matters: norms away from 1, biases away from 0, sharp attention."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.3 * torch.randn_like(p))
            elif name.endswith(".bias"):
                p.copy_(0.2 * torch.randn_like(p))
            elif "q_proj" in name or "k_proj" in name:
                p.copy_(0.25 * torch.randn_like(p))
            else:
                p.copy_(0.08 * torch.randn_like(p))


def legacy_layout(path):
    """Rewrites config.json as transformers 4.x wrote it: rope_theta and rope_scaling (and
    num_experts, which transformers 5 writes as num_local_experts)."""
    cfg = json.load(open(path))
    if "num_local_experts" in cfg:
        cfg["num_experts"] = cfg.pop("num_local_experts")
    params = cfg.pop("rope_parameters")
    cfg["rope_theta"] = params.pop("rope_theta")
    cfg["rope_scaling"] = None if params["rope_type"] == "default" else params
    json.dump(cfg, open(path, "w"), indent=2)


def fused_layout(d):
    """Rewrites a Qwen3-MoE folder's per-expert tensors in transformers 5's fused layout:
    experts.gate_up_proj [E, 2I, D] (each expert's gate rows, then its up rows) and
    experts.down_proj [E, D, I]."""
    path = os.path.join(d, "model.safetensors")
    t = load_file(path)
    blocks = sorted({k.split(".mlp.experts.")[0] for k in t if ".mlp.experts." in k})
    for b in blocks:
        n = len({k.split(".")[5] for k in t if k.startswith(b + ".mlp.experts.")})
        ex = lambda e, proj: t.pop(f"{b}.mlp.experts.{e}.{proj}.weight")
        gate_up = [torch.cat([ex(e, "gate_proj"), ex(e, "up_proj")]) for e in range(n)]
        t[f"{b}.mlp.experts.gate_up_proj"] = torch.stack(gate_up).contiguous()
        t[f"{b}.mlp.experts.down_proj"] = torch.stack([ex(e, "down_proj") for e in range(n)]).contiguous()
    save_file(t, path, metadata={"format": "pt"})


def records(vocab, n=3):
    """Pre-tokenized records of different lengths (one per row: no packing)."""
    g = torch.Generator().manual_seed(1)
    lengths = [SEQ_LEN + 1, SEQ_LEN // 2, 17][:n]
    return [{"input_ids": torch.randint(0, vocab, (k,), generator=g).tolist()} for k in lengths]


def write_run(work, model_dir, data, extra="", optim="lr = 1e-2"):
    jsonl = os.path.join(work, "data.jsonl")
    with open(jsonl, "w") as f:
        for r in data:
            f.write(json.dumps(r) + "\n")
    toml = os.path.join(work, "run.toml")
    with open(toml, "w") as f:
        f.write(
            f"""max_steps = 1
output_dir = {json.dumps(os.path.join(work, "out"))}
[model]
name = {json.dumps(model_dir)}
attn = "sdpa"
compile = "None"
[data]
path = {json.dumps(jsonl)}
seq_len = {SEQ_LEN}
batch_size = {len(data)}
micro_batch_size = {len(data)}
pack = false
shuffle = false
[optim]
{optim}
{extra}"""
        )
    return toml


def run_train(toml, *args, ok=True):
    cmd = [TRAIN, "@", toml, "--device=cpu", "--compute-dtype=fp32", *args]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if ok and p.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {p.returncode}:\n{p.stderr}")
    return p


def dump(work, model_dir, data):
    out = os.path.join(work, "logits.safetensors")
    run_train(write_run(work, model_dir, data), f"--dump-logits={out}")
    return load_file(out)


def hf_logits(model_dir, ids):
    m = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    m.eval()
    with torch.no_grad():
        return m(input_ids=ids[None]).logits[0]


def compare(name, ours, model_dir):
    """Row by row on the real tokens (padding is its own document in ours)."""
    worst = 0.0
    for row in range(ours["input_ids"].shape[0]):
        n = int((ours["doc_ids"][row] == 0).sum())
        ids = ours["input_ids"][row, :n]
        ref = hf_logits(model_dir, ids)
        err = (ours["logits"][row, :n] - ref).abs().max().item() / ref.abs().max().item()
        worst = max(worst, err)
    if not worst <= TOLERANCE:
        raise AssertionError(f"{name}: logits differ from transformers by {worst:.3g} of the largest (> {TOLERANCE})")
    return worst


def expect_error(work, model_dir, needle, what):
    os.makedirs(work, exist_ok=True)
    data = records(96, 1)
    p = run_train(write_run(work, model_dir, data), "--dump-logits=" + os.path.join(work, "x.safetensors"), ok=False)
    if p.returncode != 1 or needle not in p.stderr:
        raise AssertionError(f"{what}: expected exit 1 with {needle!r}, got {p.returncode}:\n{p.stderr}")


def split_checkpoint(name, work, model_dir, data, model, trained):
    """The same step saved in files of at most a quarter of the weights: huggingface_hub's
    split of transformers' state dict (without the tied head, as save_pretrained drops it),
    the same tensors as the one-file checkpoint, and a folder both programs read."""
    tied = model.config.tie_word_embeddings
    if model.config.model_type == "qwen3_moe":
        return split_moe_checkpoint(name, work, model_dir, data, trained)
    hf_order = {k: v for k, v in model.state_dict().items() if not (tied and k == "lm_head.weight")}
    limit = sum(v.numel() * v.element_size() for v in hf_order.values()) // 4 + 1
    work = os.path.join(work, "split")
    os.makedirs(work)
    run_train(write_run(work, model_dir, data, "[ckpt]\n"), f"--save.max-shard-bytes={limit}")
    step = os.path.join(work, "out", "checkpoints", "step_1")
    want = split_torch_state_dict_into_shards(hf_order, max_shard_size=limit)
    if not want.is_sharded or "model.safetensors" in os.listdir(step):
        raise AssertionError(f"{name}: expected several weight files in {step}")
    with open(os.path.join(step, "model.safetensors.index.json")) as f:
        index = json.load(f)
    if index["weight_map"] != want.tensor_to_filename or index["metadata"] != want.metadata:
        raise AssertionError(f"{name}: the index differs from huggingface_hub's split:\n{index}\n{want}")
    got = {}
    for file, tensors in want.filename_to_tensors.items():
        held = load_file(os.path.join(step, file))
        if sorted(held) != sorted(tensors):
            raise AssertionError(f"{name}: {file} holds {sorted(held)}, huggingface_hub puts {sorted(tensors)} there")
        got.update(held)
    if got.keys() != trained.keys() or any(not torch.equal(got[k], trained[k]) for k in got):
        raise AssertionError(f"{name}: the split checkpoint's tensors differ from the one-file checkpoint's")
    return compare(name + " (split)", dump(work, step, data), step), len(want.filename_to_tensors)


def gradient_check(name, work, model_dir, data, model):
    """One SGD step of learning rate 1 (no momentum, decay or clipping) leaves w - g in the
    checkpoint, so w0 - w1 is primecfg-train's gradient of the batch's loss (the sum of its
    tokens' cross-entropies over their count), compared with transformers' gradient of the
    same loss, parameter by parameter (a fused expert tensor split per expert). The bound:
    1e-4 of the parameter's largest gradient element. FP32 sums in another order give about
    1e-6; the subtraction w0 - w1 is rounded to the weights' ulp (6e-8 at the perturbed
    norms' 1.3), which is 1e-5 of the smallest parameters' gradients here (measured: 4e-6
    to 2.3e-5 of the largest over the four cases)."""
    work = os.path.join(work, "grad")
    os.makedirs(work)
    sgd = 'type = "sgd"\nlr = 1.0\nmomentum = 0.0\nnesterov = false\nweight_decay = 0.0\nmax_norm = "None"'
    run_train(write_run(work, model_dir, data, "[ckpt]\n", optim=sgd))
    w0 = load_file(os.path.join(model_dir, "model.safetensors"))
    w1 = load_file(os.path.join(work, "out", "checkpoints", "step_1", "model.safetensors"))
    model.zero_grad()
    total = sum(len(r["input_ids"]) - 1 for r in data)
    loss = 0
    for r in data:
        ids = torch.tensor(r["input_ids"])[None]
        logits = model(input_ids=ids).logits[0, :-1]
        loss = loss + torch.nn.functional.cross_entropy(logits, ids[0, 1:], reduction="sum")
    (loss / total).backward()
    ref = {}
    for k, p in model.named_parameters():
        if k.endswith("experts.gate_up_proj"):
            half = p.grad.shape[1] // 2
            for e in range(p.grad.shape[0]):
                ref[k.replace("gate_up_proj", f"{e}.gate_proj.weight")] = p.grad[e, :half]
                ref[k.replace("gate_up_proj", f"{e}.up_proj.weight")] = p.grad[e, half:]
        elif k.endswith("experts.down_proj"):
            for e in range(p.grad.shape[0]):
                ref[k.replace("down_proj", f"{e}.down_proj.weight")] = p.grad[e]
        else:
            ref[k] = p.grad
    if model.config.tie_word_embeddings:
        ref.pop("lm_head.weight", None)
    if sorted(ref) != sorted(w1):
        raise AssertionError(f"{name}: the checkpoint's tensors {sorted(set(w1) ^ set(ref))} differ from transformers'")
    worst, where = 0.0, ""
    for k, g in ref.items():
        ours = w0[k] - w1[k]
        err = (ours - g).abs().max().item() / max(g.abs().max().item(), 1e-30)
        if err > worst:
            worst, where = err, k
    if not worst <= 1e-4:
        raise AssertionError(f"{name}: gradient of {where} differs from transformers' by {worst:.3g} of its largest")
    return worst


def split_moe_checkpoint(name, work, model_dir, data, trained):
    """transformers 5 holds a block's experts fused (experts.gate_up_proj) and splits them
    back per expert in an order of its own when it saves, so huggingface_hub's split of its
    state dict is no oracle for the files here. What holds: several files whose index
    names every tensor of the one-file checkpoint once, the same tensors, and a folder
    that transformers and primecfg-train read as the same model."""
    total = sum(v.numel() * v.element_size() for v in trained.values())
    work = os.path.join(work, "split")
    os.makedirs(work)
    run_train(write_run(work, model_dir, data, "[ckpt]\n"), f"--save.max-shard-bytes={total // 4 + 1}")
    step = os.path.join(work, "out", "checkpoints", "step_1")
    with open(os.path.join(step, "model.safetensors.index.json")) as f:
        index = json.load(f)
    files = sorted(set(index["weight_map"].values()))
    if len(files) < 2 or "model.safetensors" in os.listdir(step):
        raise AssertionError(f"{name}: expected several weight files in {step}")
    got = {}
    for file in files:
        held = load_file(os.path.join(step, file))
        if any(index["weight_map"][k] != file for k in held):
            raise AssertionError(f"{name}: {file} holds tensors its index puts elsewhere")
        got.update(held)
    if got.keys() != trained.keys() or any(not torch.equal(got[k], trained[k]) for k in got):
        raise AssertionError(f"{name}: the split checkpoint's tensors differ from the one-file checkpoint's")
    return compare(name + " (split)", dump(work, step, data), step), len(files)


def main():
    root = tempfile.mkdtemp(prefix="hf-parity-")
    failures = []
    for name, make in CASES.items():
        try:
            work = os.path.join(root, name)
            model_dir = os.path.join(work, "hf")
            os.makedirs(work)
            model = transformers.AutoModelForCausalLM.from_config(make(), dtype=torch.float32)
            perturb(model)
            model.save_pretrained(model_dir)
            data = records(model.config.vocab_size)
            err = compare(name, dump(work, model_dir, data), model_dir)
            # The transformers 4.x layout of the same config: transformers and we read the same model.
            legacy_dir = os.path.join(work, "hf-4x")
            shutil.copytree(model_dir, legacy_dir)
            legacy_layout(os.path.join(legacy_dir, "config.json"))
            err4 = compare(name + " (4.x config)", dump(work, legacy_dir, data), model_dir)
            fused = ""
            if model.config.model_type == "qwen3_moe":
                # transformers 5's fused expert tensors read as the per-expert ones.
                fused_dir = os.path.join(work, "hf-fused")
                shutil.copytree(model_dir, fused_dir)
                fused_layout(fused_dir)
                fused = f", {compare(name + ' (fused experts)', dump(work, fused_dir, data), model_dir):.2e} (fused experts)"
            # Round trip: a checkpoint of one training step is an HF directory of the trained model.
            toml = write_run(work, model_dir, data, "[ckpt]\n")
            run_train(toml)
            step = os.path.join(work, "out", "checkpoints", "step_1")
            errt = compare(name + " (round trip)", dump(work, step, data), step)
            trained = load_file(os.path.join(step, "model.safetensors"))
            # The model class vLLM and transformers' pipelines pick: transformers' own.
            written = json.load(open(os.path.join(step, "config.json")))["architectures"]
            if written != model.config.architectures:
                raise AssertionError(f"{name}: config.json names {written}, transformers {model.config.architectures}")
            moved = max((trained[k] - v).abs().max().item() for k, v in model.state_dict().items() if k in trained)
            if not moved > 0:
                raise AssertionError(f"{name}: the checkpoint holds the untrained weights")
            errs, files = split_checkpoint(name, work, model_dir, data, model, trained)
            grads = ""
            if model.config.model_type in ("qwen3", "qwen3_moe"):
                grads = f", {gradient_check(name, work, model_dir, data, model):.2e} (gradients)"
            print(f"ok {name}: {err:.2e} (5.x config), {err4:.2e} (4.x config){fused}, {errt:.2e} (round trip), "
                  f"{errs:.2e} (in {files} files){grads}")
        except AssertionError as e:
            failures.append(str(e))
            print(f"FAIL {e}")

    # Refusals: each one names the key or tensor.
    work = os.path.join(root, "refusals")
    base = os.path.join(work, "base")
    os.makedirs(work)
    model = transformers.AutoModelForCausalLM.from_config(CASES["llama-default"](), dtype=torch.float32)
    model.save_pretrained(base)

    def variant(tag, edit_config=None, edit_tensors=None, edit_folder=None, src=None):
        d = os.path.join(work, tag)
        shutil.copytree(src or base, d)
        if edit_folder:
            edit_folder(d)
        if edit_config:
            cfg = json.load(open(os.path.join(d, "config.json")))
            edit_config(cfg)
            json.dump(cfg, open(os.path.join(d, "config.json"), "w"))
        if edit_tensors:
            t = load_file(os.path.join(d, "model.safetensors"))
            edit_tensors(t)
            save_file(t, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
        return d

    def add_index(d):
        """model.safetensors and, beside it, the same weights as files of an index."""
        names = list(load_file(os.path.join(d, "model.safetensors")))
        shutil.copy(os.path.join(d, "model.safetensors"), os.path.join(d, "model-00001-of-00001.safetensors"))
        with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {}, "weight_map": {n: "model-00001-of-00001.safetensors" for n in names}}, f)

    refusals = [
        # transformers reads model.safetensors, vLLM the index's files: which is meant is unclear.
        ("weights in two forms", dict(edit_folder=add_index), "both model.safetensors and model.safetensors.index.json"),
        ("unknown key", dict(edit_config=lambda c: c.update(rope_interleaved=True)), '"rope_interleaved"'),
        ("dynamic rope", dict(edit_config=lambda c: c.update(rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4})), "dynamic"),
        ("activation", dict(edit_config=lambda c: c.update(hidden_act="gelu")), '"hidden_act"'),
        ("dropout", dict(edit_config=lambda c: c.update(attention_dropout=0.1)), '"attention_dropout"'),
        ("odd head_dim", dict(edit_config=lambda c: c.update(head_dim=15)), '"head_dim"'),
        ("zero size", dict(edit_config=lambda c: c.update(intermediate_size=0)), '"intermediate_size"'),
        ("heads", dict(edit_config=lambda c: c.update(num_key_value_heads=3)), '"num_key_value_heads"'),
        ("string size", dict(edit_config=lambda c: c.update(hidden_size="64")), '"hidden_size"'),
        ("model_type", dict(edit_config=lambda c: c.update(model_type="mistral")), '"mistral"'),
        (
            "extra tensor",
            dict(edit_tensors=lambda t: t.update({"model.layers.0.self_attn.rotary_emb.inv_freq": torch.ones(8)})),
            "model.layers.0.self_attn.rotary_emb.inv_freq",
        ),
        ("missing tensor", dict(edit_tensors=lambda t: t.pop("model.layers.1.mlp.up_proj.weight")), "model.layers.1.mlp.up_proj.weight"),
        (
            "integer tensor",
            dict(edit_tensors=lambda t: t.update({"model.norm.weight": torch.ones(64, dtype=torch.int32)})),
            "model.norm.weight has dtype I32",
        ),
        (
            "bias the config does not have",
            dict(edit_tensors=lambda t: t.update({"model.layers.0.self_attn.q_proj.bias": torch.zeros(64)})),
            "model.layers.0.self_attn.q_proj.bias",
        ),
        (
            "tied head that differs",
            dict(
                edit_config=lambda c: c.update(tie_word_embeddings=True),
                edit_tensors=lambda t: t.update({"lm_head.weight": t["lm_head.weight"] + 1}),
            ),
            "lm_head.weight differs",
        ),
    ]
    for what, edits, needle in refusals:
        try:
            expect_error(os.path.join(work, what.replace(" ", "_")) + "-run", variant(what.replace(" ", "_"), **edits), needle, what)
            print(f"ok refused: {what}")
        except (AssertionError, FileNotFoundError) as e:
            failures.append(str(e))
            print(f"FAIL {e}")
    # Qwen3-MoE's own: its keys and its expert tensors, by name.
    moe_base = os.path.join(work, "moe-base")
    moe = transformers.AutoModelForCausalLM.from_config(CASES["qwen3_moe"](), dtype=torch.float32)
    moe.save_pretrained(moe_base)

    def fewer_fused_experts(d):
        fused_layout(d)
        t = load_file(os.path.join(d, "model.safetensors"))
        t["model.layers.0.mlp.experts.down_proj"] = t["model.layers.0.mlp.experts.down_proj"][:7].contiguous()
        save_file(t, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})

    def expert_twice(d):
        one = load_file(os.path.join(d, "model.safetensors"))["model.layers.0.mlp.experts.0.gate_proj.weight"]
        fused_layout(d)
        t = load_file(os.path.join(d, "model.safetensors"))
        t["model.layers.0.mlp.experts.0.gate_proj.weight"] = one
        save_file(t, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})

    moe_refusals = [
        # transformers would add its auxiliary load-balancing loss; prime-rl and we do not.
        ("router logits", dict(edit_config=lambda c: c.update(output_router_logits=True)), '"output_router_logits"'),
        ("top-k above experts", dict(edit_config=lambda c: c.update(num_experts_per_tok=9)), '"num_experts_per_tok"'),
        ("dense layer out of range", dict(edit_config=lambda c: c.update(mlp_only_layers=[3])), '"mlp_only_layers"'),
        (
            "two expert counts",
            dict(edit_config=lambda c: c.update(num_experts=4)),
            '"num_experts"',
        ),
        (
            "missing expert",
            dict(edit_tensors=lambda t: t.pop("model.layers.2.mlp.experts.7.up_proj.weight")),
            "model.layers.2.mlp.experts.7.up_proj.weight",
        ),
        (
            "router of a dense block",
            dict(edit_tensors=lambda t: t.update({"model.layers.1.mlp.gate.weight": torch.zeros(8, 64)})),
            "model.layers.1.mlp.gate.weight",
        ),
        ("fused experts of another count", dict(edit_folder=fewer_fused_experts), "model.layers.0.mlp.experts.down_proj"),
        # Expert 0's gate both by name and inside the fused tensor: which one is meant is unclear.
        ("an expert twice", dict(edit_folder=expert_twice), "model.layers.0.mlp.experts.gate_up_proj"),
    ]
    for what, edits, needle in moe_refusals:
        try:
            tag = "moe_" + what.replace(" ", "_")
            expect_error(os.path.join(work, tag) + "-run", variant(tag, src=moe_base, **edits), needle, what)
            print(f"ok refused: {what}")
        except (AssertionError, FileNotFoundError) as e:
            failures.append(str(e))
            print(f"FAIL {e}")

    # A token id outside the vocabulary names the data file and line.
    d = os.path.join(work, "oov-run")
    os.makedirs(d)
    p = run_train(write_run(d, base, [{"input_ids": [1, 2, 3]}, {"input_ids": [4, 96]}]), "--dump-logits=" + os.path.join(d, "x"), ok=False)
    if p.returncode != 1 or "data.jsonl:2" not in p.stderr or "outside the vocabulary" not in p.stderr:
        failures.append(f"out-of-vocabulary id: {p.returncode} {p.stderr}")
    else:
        print("ok refused: token id outside the vocabulary")

    print(f"transformers {transformers.__version__}, torch {torch.__version__}")
    shutil.rmtree(root, ignore_errors=True)
    if failures:
        print(f"{len(failures)} failed")
        sys.exit(1)


if __name__ == "__main__":
    main()
