"""primecfg-train over several ranks (Gloo, CPU): the same numbers as one process.

Each case runs the real program, launched by torchrun (or, for the faults, by
setting the launcher's variables directly), on the tiny model in FP32, and
compares it with one process on the same global batch:

- 2 and 4 ranks, in every offload mode: every step's loss and gradient norm, and
  after the last step the weights, the FP32 masters and the moments (the ranks'
  pieces put back together);
- a checkpoint saved by N ranks resumed on M ranks (and in another offload mode)
  continues as one process resumed the same way does;
- two "nodes" of two ranks each (two torchrun invocations, --nnodes 2, loopback);
- a rank that is killed or stopped makes the others exit, naming it, within the
  timeout; a config that differs between ranks is refused at start;
- under torchrun --max-restarts, a killed rank's job continues from its latest
  checkpoint and ends as the straight run, and a restart never takes over a folder
  its first attempt was refused.

The tolerance (TOL) is what one reassociation of the gradient sums costs: the
largest difference measured over all cases was about 1e-6 (docs/trainer.md). It
holds the losses, gradient norms and moments, which nothing magnifies. The weights
and masters of the cases that keep a checkpoint every step are compared through Adam
instead (close_adam): Adam's update lr * m / (sqrt(v) + eps) magnifies a rounding
difference d of a gradient near 0 by up to lr / eps, so a bound on the weights alone
would depend on which CPU summed them.

usage: distributed_test.py PRIMECFG_TRAIN [WORDS] [-- FLAG...]
  WORDS: run only the cases whose name has them; FLAGs go to every primecfg-train
  (CI runs the `full` cases once per --offload.cpu-isa the machine has).
  PRIMECFG_TEST_SHARD=I/N (environment): only every N-th selected case from the I-th
  (0-based), so that N processes run the suite side by side on a machine with the cores.
  PRIMECFG_TEST_FIRST=K (environment): start at the K-th selected case (1-based), to finish
  a run that a time limit stopped.
"""

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import torch
from safetensors.torch import load_file

_args = sys.argv[1:]
EXTRA = _args[_args.index("--") + 1 :] if "--" in _args else []
_args = _args[: _args.index("--")] if "--" in _args else _args
TRAIN = _args[0]
ONLY = _args[1] if len(_args) > 1 else ""
SHARD, SHARDS = (int(v) for v in os.environ.get("PRIMECFG_TEST_SHARD", "0/1").split("/"))
FIRST = int(os.environ.get("PRIMECFG_TEST_FIRST", "1"))
selected = 0  # cases whose name has ONLY, counted for PRIMECFG_TEST_SHARD and _FIRST
ROOT = tempfile.mkdtemp(prefix="distributed-")
# torchrun keeps a log folder (torchelastic_*) in its temporary directory: under ROOT,
# it goes when ROOT does.
os.environ["TMPDIR"] = ROOT
TOL = 2e-5  # absolute, on losses, norms, weights and optimizer state (values are O(1))
passed, failed = 0, []
worst = 0.0


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def config(work, steps=4, offload="optimizer", extra="", resume=None, clip=True):
    """full offload cannot clip: a run that changes modes has no clipping on either side."""
    path = os.path.join(work, f"run-{offload}-{resume}.toml")
    no_clip = "" if clip else 'max_norm = "None"'
    with open(path, "w") as f:
        f.write(
            f"""max_steps = {steps}
output_dir = {json.dumps(os.path.join(work, "out"))}
dist_timeout_seconds = 20
{extra}
[model]
name = "primecfg/tiny"
attn = "sdpa"
compile = "None"
offload = "{offload}"
ac = "None"
ac_offloading = "None"
[data]
seq_len = 32
batch_size = 8
micro_batch_size = 2
[optim]
lr = 1e-3
{no_clip}
[ckpt]
interval = 2
"""
            + (f"[resume]\nstep = {resume}\n" if resume else "")
        )
    return path


def one(cfg, *args):
    return subprocess.run(
        [TRAIN, "@", cfg, "--device=cpu", *EXTRA, *args], capture_output=True, text=True, errors="replace", timeout=300
    )


def torchrun(world, cfg, *args, nnodes=1, node_rank=0, port=None, wait=True, restarts=0):
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={world}", f"--max-restarts={restarts}"]
    if nnodes == 1:
        cmd.append("--standalone")
    else:
        cmd += [f"--nnodes={nnodes}", f"--node-rank={node_rank}", "--master-addr=127.0.0.1", f"--master-port={port}"]
    cmd += ["--no-python", TRAIN, "@", cfg, "--device=cpu", *EXTRA, *args]
    if not wait:
        return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace")
    return subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=300)


def ok(p, what):
    if p.returncode != 0:
        # The whole stderr is kept beside the failed cases' folders: a crash's backtrace
        # comes before torchrun's report, so the tail below can lose its frames.
        fd, path = tempfile.mkstemp(dir=ROOT, suffix=".stderr")
        with os.fdopen(fd, "w") as f:
            f.write(p.stderr)
        raise AssertionError(f"{what}: exit {p.returncode} (whole stderr: {path})\n{p.stderr[-3000:]}")


def metrics(work):
    with open(os.path.join(work, "out", "metrics.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def state(work, step):
    """The checkpoint's weights and full optimizer tensors (pieces put together)."""
    d = os.path.join(work, "out", "checkpoints", f"step_{step}")
    out = {}
    for f in sorted(os.listdir(d)):  # model.safetensors, or model-0000i-of-0000N.safetensors
        if f.startswith("model") and f.endswith(".safetensors"):
            out.update({"model." + k: v for k, v in load_file(os.path.join(d, f)).items()})
    pieces = sorted(f for f in os.listdir(d) if f.startswith("optimizer"))
    files = [load_file(os.path.join(d, f)) for f in pieces]
    for name in files[0]:
        out[name] = torch.cat([f[name].reshape(-1) for f in files])
    return out


def close(a, b, what):
    global worst
    if a.keys() != b.keys():
        raise AssertionError(f"{what}: tensors differ: {sorted(a.keys() ^ b.keys())[:5]}")
    for k in a:
        x, y = a[k].reshape(-1), b[k].reshape(-1)
        n = min(x.numel(), y.numel())  # a sharded tensor carries zero padding at the end
        if x[n:].count_nonzero() or y[n:].count_nonzero():
            raise AssertionError(f"{what}: {k}: the padding is not zero")
        d = (x[:n] - y[:n]).abs().max().item()
        worst = max(worst, d)
        if d > TOL:
            raise AssertionError(f"{what}: {k} differs by {d:.3g} (tolerance {TOL})")


# AdamW as the trainer runs it (optim/math.hpp; prime-rl's defaults; this config's
# weight decay is AdamWConfig's 0.01), and FP32's unit roundoff.
BETA1, BETA2, EPS, WEIGHT_DECAY = 0.9, 0.999, 1e-8, 0.01
U32 = 2.0**-24
EVERY_STEP = ["--ckpt.interval=1"]  # what close_adam reads


def close_adam(ref_work, got_work, what, steps=4):
    """The weights and masters of two runs, through Adam, from checkpoints of every step.

    Each run applies w_t = w_{t-1} (1 - lr wd) - lr u_t with u_t = m^_t / (sqrt(v^_t) + eps)
    to its own moments m_t, v_t (bias-corrected), so their difference follows from the
    moments': D_t = D_{t-1} (1 - lr wd) - lr (u_t - u'_t), D_0 = 0 (the same init). The
    moments are held to TOL, which nothing magnifies; the weights must then differ by
    D_t up to what FP32 leaves: each step rounds the decay, the product and the
    difference (3 U |w|) and evaluates u in about five operations (5 U |u|, times lr), in
    each of the two runs; with a margin for eps and the bias corrections,
    8 U |w| + 16 U lr (|u| + 1) a step, summed. That bound is the same on
    every CPU; an update skipped, repeated or applied to the wrong piece is off by about
    lr |u|, 10^3 to 10^4 times more (|w| from 1 down to 0.05)."""
    global worst
    lrs = {m["step"]: m["lr"] for m in metrics(got_work) + metrics(ref_work)}
    ref = [state(ref_work, t) for t in range(1, steps + 1)]
    got = [state(got_work, t) for t in range(1, steps + 1)]
    moments = lambda s: {k: v for k, v in s.items() if k.startswith(("m1.", "m2."))}
    for t in range(steps):
        close(moments(ref[t]), moments(got[t]), f"{what}, moments after step {t + 1}")
    if ref[-1].keys() != got[-1].keys():
        raise AssertionError(f"{what}: tensors differ: {sorted(ref[-1].keys() ^ got[-1].keys())[:5]}")
    for name in (k for k in ref[-1] if k.startswith(("model.", "master."))):
        base = name.split(".", 1)[1]
        delta = bound = 0.0
        for t in range(1, steps + 1):
            lr, r, g = lrs[t], ref[t - 1], got[t - 1]
            n = r[name].numel()
            wr, wg = r[name].reshape(-1).double(), g[name].reshape(-1)[:n].double()
            if g[name].reshape(-1)[n:].count_nonzero():
                raise AssertionError(f"{what}: {name}: the padding is not zero")

            def update(s):
                m, v = s["m1." + base].reshape(-1)[:n].double(), s["m2." + base].reshape(-1)[:n].double()
                return (m / (1 - BETA1**t)) / ((v / (1 - BETA2**t)).sqrt() + EPS)

            ur, ug = update(r), update(g)
            delta = delta * (1 - lr * WEIGHT_DECAY) - lr * (ur - ug)
            bound = bound + 8 * U32 * wr.abs() + 16 * U32 * lr * (ur.abs() + 1)
            off = ((wr - wg) - delta).abs()
            worst = max(worst, off.max().item())
            if (off > bound).any():
                i = int((off - bound).argmax())
                raise AssertionError(
                    f"{what}: {name}[{i}] after step {t}: the runs differ by {(wr - wg)[i].item():.3g} where "
                    f"their moments say {delta[i].item():.3g} (FP32 allows {bound[i].item():.2g})")


def same_steps(ref, got, what, first=1):
    ref = {m["step"]: m for m in ref}
    got = {m["step"]: m for m in got}
    global worst
    for step in sorted(got):
        if step < first:
            continue
        for key in ("loss", "grad_norm"):
            d = abs(ref[step][key] - got[step][key])
            worst = max(worst, d)
            if d > TOL:
                raise AssertionError(f"{what}: step {step} {key} {got[step][key]} vs {ref[step][key]} one process")
    if sorted(s for s in got if s >= first) != sorted(s for s in ref if s >= first):
        raise AssertionError(f"{what}: steps {sorted(got)} vs {sorted(ref)}")


def case(name):
    def wrap(fn):
        global passed
        global worst
        global selected
        if ONLY not in name:
            return fn
        selected += 1
        if selected < FIRST or (selected - FIRST) % SHARDS != SHARD:
            return fn
        work = tempfile.mkdtemp(dir=ROOT)
        t = time.time()
        before, worst = worst, 0.0
        try:
            fn(work)
            passed += 1
            print(f"ok    [{selected}] {name} ({time.time() - t:.1f} s, largest difference {worst:.2g})")
            shutil.rmtree(work, ignore_errors=True)  # a CI disk holds the suite only if cases clean up
        except Exception as e:  # noqa: BLE001 - every failure is reported, then the next case runs
            failed.append(name)
            print(f"FAIL  {name}: {e}")
        worst = max(worst, before)
        return fn

    return wrap


_references = {}


def reference(offload, clip=True):
    """One process, 4 steps, a checkpoint every step (close_adam reads them all)."""
    if (offload, clip) not in _references:
        work = tempfile.mkdtemp(dir=ROOT)
        ok(one(config(work, offload=offload, clip=clip), *EVERY_STEP), f"one process, {offload}")
        _references[offload, clip] = (metrics(work), state(work, 2), state(work, 4))
        _reference_dirs[offload, clip] = work
    return _references[offload, clip]


_reference_dirs = {}


def reference_dir(offload, clip=True):
    reference(offload, clip)
    return _reference_dirs[offload, clip]


_resumed_references = {}


def resumed_reference(mode_from, mode_to, clip):
    """One process running the same sequence as a resume case: 2 steps in mode_from,
    then resumed at step 2 in mode_to. Compared with it, a sharded resume differs only
    by the reassociated gradient sums, so TOL keeps its meaning. (A straight run in
    mode_to would also measure how full's vocabulary-chunked loss rounds against the
    token-chunked loss of none/optimizer in steps 1-2; Adam's first update
    lr*g/(|g|+eps) magnifies that rounding by up to lr/eps where g is near 0, which
    put one weight 5.8e-5 apart on some seeds and CPUs.)"""
    if mode_from == mode_to:
        ref_metrics, _, ref_final = reference(mode_to, clip)
        return ref_metrics, ref_final
    if (mode_from, mode_to) not in _resumed_references:
        work = tempfile.mkdtemp(dir=ROOT)
        ok(one(config(work, steps=2, offload=mode_from, clip=clip), *EVERY_STEP), f"one process, {mode_from}, 2 steps")
        ok(one(config(work, steps=4, offload=mode_to, resume=2, clip=clip), *EVERY_STEP),
           f"one process, resumed in {mode_to}")
        _resumed_references[mode_from, mode_to] = (metrics(work), state(work, 4), work)
    return _resumed_references[mode_from, mode_to][:2]


def resumed_reference_dir(mode_from, mode_to, clip):
    resumed_reference(mode_from, mode_to, clip)
    if mode_from == mode_to:
        return reference_dir(mode_to, clip)
    return _resumed_references[mode_from, mode_to][2]


for offload in ("none", "optimizer", "full"):
    for world in (1, 2, 4):  # 1: torchrun's one rank still goes through the process group

        @case(f"{world} ranks, offload = {offload}: every step and the final state match one process")
        def _(work, offload=offload, world=world):
            ref_metrics, _, ref_final = reference(offload)
            # Several ranks: buckets of a few parameters, so that several reduce-scatters
            # run while backward goes on; one rank: the default, one bucket.
            buckets = ["--dist.bucket-mib=0.01"] if world > 1 else []
            p = torchrun(world, config(work, offload=offload), *buckets, *EVERY_STEP)
            ok(p, "torchrun")
            got = metrics(work)
            # One rank has nothing to sum: its gradients go to the pipeline as they come,
            # with no bucket, no copy and no collective.
            for m in got:
                overlapped = m["pipeline"]["fsdp_reduces_overlapped"]
                launched = m["pipeline"]["fsdp_reduce_scatters"]
                if (overlapped > 0) != (world > 1) or (launched > 0) != (world > 1):
                    raise AssertionError(f"step {m['step']}: {launched} reduce-scatters, {overlapped} overlapped "
                                         f"with backward, want {'some' if world > 1 else 'none (one rank)'}")
            same_steps(ref_metrics, got, f"{world} ranks")
            close_adam(reference_dir(offload), work, f"{world} ranks")
            pieces = [f for f in os.listdir(os.path.join(work, "out", "checkpoints", "step_4")) if f.startswith("optimizer")]
            if len(pieces) != world:
                raise AssertionError(f"{len(pieces)} optimizer files, want one per rank: {pieces}")
            if any(m["tokens"] != r["tokens"] for m, r in zip(got, ref_metrics)):
                raise AssertionError("metrics: tokens are not the global batch's")
            # Every rank's own peak, in rank order; rank 0's is the line's peak. (On the
            # CPU a rank's peak is its process's high-water mark, so they differ.)
            for m in got:
                ranks = m.get("peak_device_mem_gib_ranks")
                if world == 1:
                    if ranks is not None:
                        raise AssertionError(f"one rank: peak_device_mem_gib_ranks {ranks}")
                    continue
                if ranks is None or len(ranks) != world or min(ranks) <= 0 or ranks[0] != m["peak_device_mem_gib"]:
                    raise AssertionError(f"step {m['step']}: peak_device_mem_gib_ranks {ranks}, "
                                         f"peak_device_mem_gib {m['peak_device_mem_gib']}")


MOE = ["--model.name=primecfg/tiny-moe"]  # Qwen3-MoE: 8 experts, top-2, the second block dense
SELECTIVE = ["--model.ac.mode=selective", '--model.ac.targets=["routed_experts"]']


@case("2 ranks, Qwen3-MoE, freeze_moe_router: the routers' zero gradients through FSDP, as one process")
def _(work):
    ref = os.path.join(work, "one")
    os.makedirs(ref)
    ok(one(config(ref, offload="full", clip=False), *MOE, "--model.freeze-moe-router", *EVERY_STEP), "one process")
    ok(torchrun(2, config(work, offload="full", clip=False), *MOE, "--model.freeze-moe-router", "--model.ep=1",
                "--dist.bucket-mib=0.01", *EVERY_STEP), "torchrun")
    same_steps(metrics(ref), metrics(work), "2 ranks")
    close_adam(ref, work, "2 ranks")


@case("2 ranks, Qwen3-MoE, selective checkpointing of routed_experts: the experts recomputed on gathered weights")
def _(work):
    # FSDP frees a block's gathered weights after its forward; the experts' recompute in
    # the backward must run on the weights gathered again, or it reads freed storage.
    ref = os.path.join(work, "one")
    os.makedirs(ref)
    ok(one(config(ref), *MOE, *EVERY_STEP), "one process without checkpointing")
    ok(torchrun(2, config(work), *MOE, *SELECTIVE, "--model.ep=1", "--dist.bucket-mib=0.01", *EVERY_STEP),
       "torchrun")
    same_steps(metrics(ref), metrics(work), "2 ranks")
    close_adam(ref, work, "2 ranks")


def waited_no_more_than_one_projection(work):
    """The gradient buckets follow backward's order (distributed/fsdp.cpp): the stacked
    experts' gradients come one projection at a time, the per-expert loop's expert by
    expert, so none waits for another projection, another expert, the router or the
    attention. The most that may wait (10 kB buckets): one projection of the routed block's
    8 experts, or two of the dense block's MLP, 393,216 bytes each in FP32 (8 x 96 x 128 and
    2 x 384 x 128 elements)."""
    waited = max(m["pipeline"]["fsdp_grads_waiting_peak_gib"] for m in metrics(work)) * 2**30
    if waited > 393216 * 1.001:
        raise AssertionError(f"{waited:.0f} bytes of gradients waited for their buckets (at most 393216)")


for offload in ("none", "full"):

    @case(f"2 ranks, Qwen3-MoE, offload = {offload}: every step and the final state match one process")
    def _(work, offload=offload):
        ref = os.path.join(work, "one")
        os.makedirs(ref)
        ok(one(config(ref, offload=offload, clip=offload != "full"), *MOE, *EVERY_STEP), "one process")
        ok(torchrun(2, config(work, offload=offload, clip=offload != "full"), *MOE, "--model.ep=1",
                    "--dist.bucket-mib=0.01", *EVERY_STEP), "torchrun")
        same_steps(metrics(ref), metrics(work), "2 ranks")
        close_adam(ref, work, "2 ranks")
        waited_no_more_than_one_projection(work)


@case("2 ranks, Qwen3-MoE, ep unset (prime-rl's \"auto\") or not dividing the experts: an error naming model.ep")
def _(work):
    for ep, needle in (([], "prime-rl's default ep = \"auto\""), (["--model.ep=3"], "ep = 3")):
        p = torchrun(2, config(work), *MOE, *ep)
        if p.returncode == 0 or "model.ep" not in p.stderr or needle not in p.stderr:
            raise AssertionError(f"{ep}: exit {p.returncode}:\n{p.stderr[-2000:]}")


# Expert parallelism: each rank runs 8 / ep of tiny-moe's experts, the tokens travel to
# them and back by all-to-all; every step and the final weights, masters and moments
# (each expert's pieces from the ranks that hold them) match one process.
def loads_in_transformers(model_dir):
    """transformers reads every tensor of an expert-parallel run's checkpoint, none missing
    or left over, and each is the file's."""
    import transformers

    m, info = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32,
                                                                output_loading_info=True)
    if any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")):
        raise AssertionError(f"transformers loading {model_dir}: {info}")
    saved = load_file(os.path.join(model_dir, "model.safetensors"))
    got = m.state_dict()
    for name, t in saved.items():
        want = got.get(name)
        if want is None:  # transformers 5 holds a block's experts fused: gate_up_proj [E, 2I, D], down_proj [E, D, I]
            head, e, proj = re.fullmatch(r"(.*\.mlp\.experts)\.(\d+)\.(\w+)_proj\.weight", name).groups()
            fused, e = got[f"{head}.{'down' if proj == 'down' else 'gate_up'}_proj"], int(e)
            i = t.shape[0]
            want = fused[e] if proj == "down" else fused[e, :i] if proj == "gate" else fused[e, i:]
        if not torch.equal(want.float(), t.float()):
            raise AssertionError(f"transformers' {name} is not the checkpoint's")


def moe_reference(offload, extra=()):
    key = ("moe", offload, tuple(extra))
    if key not in _references:
        work = tempfile.mkdtemp(dir=ROOT)
        ok(one(config(work, offload=offload, clip=offload != "full"), *MOE, *extra, *EVERY_STEP), "one process")
        _references[key] = work
    return _references[key]


for world, ep_flags, offload in (
    (2, ["--model.ep=2"], "none"),
    (2, ["--model.ep=auto"], "optimizer"),
    (2, ["--model.ep=2"], "full"),
    (4, ["--model.ep=4"], "optimizer"),
    (4, ["--model.ep=2"], "full"),  # each expert split over dp_shard_mod_ep = 2 ranks
    (4, ["--model.ep=2", "--model.dp-replicate=2"], "none"),  # HSDP: replicas of an ep = 2 group
):

    @case(f"{world} ranks, Qwen3-MoE, {' '.join(ep_flags)}, offload = {offload}: every step and the final state "
          "match one process")
    def _(work, world=world, ep_flags=ep_flags, offload=offload):
        ref = moe_reference(offload)
        ok(torchrun(world, config(work, offload=offload, clip=offload != "full"), *MOE, *ep_flags,
                    "--dist.bucket-mib=0.01", *EVERY_STEP), "torchrun")
        same_steps(metrics(ref), metrics(work), f"{world} ranks")
        close_adam(ref, work, f"{world} ranks")
        names = os.listdir(os.path.join(work, "out", "checkpoints", "step_4"))
        if names.count("model.safetensors") != 1:
            raise AssertionError(f"the weights are not one whole file: {sorted(names)}")
        if world == 4 and offload == "optimizer":
            loads_in_transformers(os.path.join(work, "out", "checkpoints", "step_4"))




for ac, flags in (("full", ["--model.ac.freq=1"]), ("selective", SELECTIVE)):

    @case(f"2 ranks, Qwen3-MoE, ep = 2 with {ac} activation checkpointing: the exchange runs again in the "
          "recompute, as one process")
    def _(work, flags=flags):
        ref = moe_reference("optimizer")
        ok(torchrun(2, config(work), *MOE, "--model.ep=2", *flags, *EVERY_STEP), "torchrun")
        same_steps(metrics(ref), metrics(work), "2 ranks")
        close_adam(ref, work, "2 ranks")


@case("2 ranks, Qwen3-MoE, ep = 2 with debug.force_balanced_routing: as one process routing the same way")
def _(work):
    balanced = ["--model.debug.force-balanced-routing"]
    ref = moe_reference("optimizer", balanced)
    ok(torchrun(2, config(work), *MOE, "--model.ep=2", *balanced, *EVERY_STEP), "torchrun")
    same_steps(metrics(ref), metrics(work), "2 ranks")
    close_adam(ref, work, "2 ranks")


@case("2 ranks, Qwen3-MoE, ep = 2, unbalanced routing (the per-expert loop): as one process")
def _(work):
    # With moe_use_grouped_mm = false the experts run one by one, an expert without tokens
    # on no rows: its gradient (zeros) still comes in its block's backward.
    ref = moe_reference("optimizer", ["--model.moe-use-grouped-mm=false"])
    ok(torchrun(2, config(work), *MOE, "--model.ep=2", "--model.moe-use-grouped-mm=false", "--dist.bucket-mib=0.01",
                *EVERY_STEP), "torchrun")
    same_steps(metrics(ref), metrics(work), "2 ranks")
    close_adam(ref, work, "2 ranks")
    waited_no_more_than_one_projection(work)


for saved, resumed in (((4, "4"), (2, "2")), ((2, "2"), (1, "1")), ((1, "1"), (4, "2")), ((2, "1"), (4, "4"))):

    @case(f"Qwen3-MoE saved by {saved[0]} ranks with ep = {saved[1]}, resumed on {resumed[0]} with ep = "
          f"{resumed[1]}: continues as one process does")
    def _(work, saved=saved, resumed=resumed):
        ref = moe_reference("optimizer")
        launch = lambda n, cfg, ep: one(cfg, *MOE, *EVERY_STEP) if n == 1 else torchrun(
            n, cfg, *MOE, f"--model.ep={ep}", *EVERY_STEP)
        ok(launch(saved[0], config(work, steps=2), saved[1]), f"first part on {saved[0]}")
        ok(launch(resumed[0], config(work, steps=4, resume=2), resumed[1]), f"resume on {resumed[0]}")
        same_steps(metrics(ref), metrics(work), "resumed", first=3)
        close_adam(ref, work, "resumed")


def whole_bytes(work):
    """FP32 bytes of the tiny model's weights: all of them, and the root's (the tied
    embedding and the final norm), from the checkpoint of step 4."""
    d = os.path.join(work, "out", "checkpoints", "step_4")
    w = load_file(os.path.join(d, "model.safetensors"))
    return sum(4 * t.numel() for t in w.values()), 4 * (w["model.embed_tokens.weight"].numel() + w["model.norm.weight"].numel())


def held_whole(got, key):
    return [m["pipeline"][key] * 2**30 for m in got]


_ac_references = {}


def reference_ac(offload):
    """One process with activation checkpointing (same numbers as without, by design)."""
    if offload not in _ac_references:
        work = tempfile.mkdtemp(dir=ROOT)
        ok(one(config(work, offload=offload), "--model.ac", *EVERY_STEP), f"one process, {offload}, model.ac")
        _ac_references[offload] = (metrics(work), state(work, 2), state(work, 4), work)
    return _ac_references[offload]


# FSDP: with model.reshard_after_forward (prime-rl's default, the cases above) a block's
# weights are freed after its forward and gathered again for its backward; without it
# they stay until its backward. Same numbers either way, and the metrics show what was
# whole: after the forward the root alone, or every weight; between steps nothing.
# Activation offloading ("offload": a window of one block input, so the tiny model's
# first block's input goes to host memory and comes back) is checkpointing's arithmetic.
AC_FLAGS = {False: [], True: ["--model.ac"],
            "offload": ["--model.ac", "--model.ac-offloading.max-inflight-activations=1"]}
AC_LABELS = {False: "", True: ", model.ac", "offload": ", model.ac with activation offloading"}

for offload in ("none", "optimizer", "full"):
    for reshard, ac in ((True, False), (False, False), (True, True), (True, "offload")):
        label = ("reshard_after_forward" if reshard else "no reshard_after_forward") + AC_LABELS[ac]

        @case(f"2 ranks, offload = {offload}, {label}: one process's numbers, only the blocks in use whole")
        def _(work, offload=offload, reshard=reshard, ac=ac):
            flags = ([] if reshard else ["--no-model.reshard-after-forward"]) + AC_FLAGS[ac]
            ref_metrics = (reference(offload) if not ac else reference_ac(offload))[0]
            ok(torchrun(2, config(work, offload=offload), *flags, *EVERY_STEP), "torchrun")
            got = metrics(work)
            same_steps(ref_metrics, got, "2 ranks")
            close_adam(reference_dir(offload) if not ac else reference_ac(offload)[3], work, "2 ranks")
            total, root = whole_bytes(work)
            want = root if reshard else total
            moved = [m["pipeline"].get("ac_offload_to_host_gib", 0) for m in got]
            if (ac == "offload") != all(v > 0 for v in moved):
                raise AssertionError(f"block inputs moved to host memory per step: {moved}")
            for step, (after, rest) in enumerate(zip(held_whole(got, "fsdp_whole_after_forward_gib"),
                                                     held_whole(got, "fsdp_whole_at_rest_gib")), 1):
                if abs(after - want) > 1e-5 * want:
                    raise AssertionError(f"step {step}: {after:.0f} bytes whole after the forward, want {want}")
                if rest != 0:
                    raise AssertionError(f"step {step}: {rest:.0f} bytes whole between steps, want 0")




def six_blocks(work, offload):
    """A 6-block model (the tiny shape, deeper; random weights), fake data, no checkpoint."""
    d = os.path.join(work, "six")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump({"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 260,
                   "hidden_size": 128, "num_hidden_layers": 6, "num_attention_heads": 4,
                   "num_key_value_heads": 2, "head_dim": 32, "intermediate_size": 384, "rope_theta": 10000.0,
                   "max_position_embeddings": 32768, "rms_norm_eps": 1e-6, "tie_word_embeddings": True,
                   "attention_bias": False, "torch_dtype": "float32"}, f)
    path = os.path.join(work, "six.toml")
    with open(path, "w") as f:
        f.write(f"""max_steps = 3
output_dir = {json.dumps(os.path.join(work, "out"))}
dist_timeout_seconds = 20
[model]
name = {json.dumps(d)}
offload = "{offload}"
ac = "None"
ac_offloading = "None"
[model.debug]
random_init = true
[data]
type = "fake"
seq_len = 32
batch_size = 8
micro_batch_size = 2
""")
    block = 4 * (2 * 128 * 128 + 2 * 128 * 64 + 3 * 128 * 384 + 2 * 32 + 2 * 128)
    root = 4 * (260 * 128 + 128)
    return path, root, block


# The gathers are prefetched (the next block's starts while a block computes); with
# reshard_after_forward no more than two blocks are whole or in flight at once, as the
# planner counts, and without it every block, from step 1 on: each rank builds the
# model one parameter at a time and keeps only its pieces.
for offload in ("none", "full"):
    for reshard, ac in ((True, False), (True, True), (False, False)):
        label = ("reshard_after_forward" if reshard else "no reshard_after_forward") + (", model.ac" if ac else "")

        @case(f"2 ranks, 6 blocks, offload = {offload}, {label}: prefetched gathers hold what the planner counts")
        def _(work, offload=offload, reshard=reshard, ac=ac):
            cfg, root, block = six_blocks(work, offload)
            flags = ([] if reshard else ["--no-model.reshard-after-forward"]) + (["--model.ac"] if ac else [])
            ok(torchrun(2, cfg, *flags), "torchrun (no checkpoint at the end)")
            want = root + (2 if reshard else 6) * block
            peaks = held_whole(metrics(work), "fsdp_whole_peak_gib")
            if len(peaks) != 3:
                raise AssertionError(f"{len(peaks)} steps logged, want 3")
            for step, peak in enumerate(peaks, 1):  # step 1 too: the ranks never built the whole model
                if abs(peak - want) > 1e-5 * want:
                    raise AssertionError(f"step {step}: {peak:.0f} bytes whole at most, want {want} (root + "
                                         f"{2 if reshard else 6} blocks)")
            # Per micro-batch (2 a rank), every block ahead in the forward (6; the LM head too
            # in the first, after which the root stays whole), and in the backward each
            # block below the top one when it is gathered again (5).
            want_ahead = 1 + 2 * (6 + (5 if reshard else 0))
            for step, m in enumerate(metrics(work), 1):
                if m["pipeline"]["fsdp_gathers_ahead"] != want_ahead:
                    raise AssertionError(f"step {step}: {m['pipeline']['fsdp_gathers_ahead']} gathers prefetched, "
                                         f"want {want_ahead}")


# A checkpoint writes the whole weights (rank 0) but gathers them one at a time, after the
# update, when no weight is whole: what it holds at once stays below the step's root + two
# blocks, so every step's peak is the step's own (a checkpoint after step k counts in step
# k + 1's). Gathering them all at once, Llama-3.1-70B's 131 GiB would be on every GPU.
for offload in ("none", "full"):
    @case(f"2 ranks, 6 blocks, offload = {offload}, a checkpoint every step: the weights gathered one at a time")
    def _(work, offload=offload):
        cfg, root, block = six_blocks(work, offload)
        ok(torchrun(2, cfg, "--ckpt.interval=1"), "torchrun")
        want = root + 2 * block
        peaks = held_whole(metrics(work), "fsdp_whole_peak_gib")
        for step, peak in enumerate(peaks, 1):
            if abs(peak - want) > 1e-5 * want:
                raise AssertionError(f"step {step}: {peak:.0f} bytes whole at most, want {want} (root + 2 blocks)")
        # Every step's checkpoint holds the whole weights (the pieces put together).
        for step in (1, 2, 3):
            d = os.path.join(work, "out", "checkpoints", f"step_{step}")
            w = load_file(os.path.join(d, "model.safetensors"))
            if sum(4 * t.numel() for t in w.values()) != root + 6 * block:
                raise AssertionError(f"step {step}: the checkpoint's weights are not the whole model")


# full offload with one micro-batch a rank splits the tied embedding's update: the LM
# head's share, summed over the ranks, updates the rows no rank's batch reads as
# backward starts, each rank its piece; the piece's final gradient then updates the
# batch's rows. Three ranks cut the 260 x 128 embedding inside rows (pieces of 11,094
# elements), so a row is shared by two ranks. One process runs the same batch in three
# micro-batches (no split): the same numbers, up to the sums' order.
# Random ids read the rows that the pieces cut too (86 and 173); increasing ids (0 to 31 in
# every sample) only the first piece's rows, so the other two ranks stage nothing.
for data in ("random ids", "increasing ids"):
    @case(f"3 ranks, offload = full, one micro-batch each, {data}: the tied embedding split over pieces cut "
          "inside rows")
    def _(work, data=data):
        ids = "random" if data == "random ids" else "increasing"
        flags = ["--data.batch-size=6", "--data.type=fake", f"--data.input-ids={ids}"]
        ref = os.path.join(work, "ref")
        os.makedirs(ref)
        ok(one(config(ref, offload="full", clip=False), *flags, *EVERY_STEP), "one process")
        ok(torchrun(3, config(work, offload="full", clip=False), *flags, *EVERY_STEP), "torchrun")
        got = metrics(work)
        same_steps(metrics(ref), got, "3 ranks, split")
        close_adam(ref, work, "3 ranks, split")
        rows = [m["pipeline"].get("tied_batch_rows") for m in got]
        if not all(r and r > 0 for r in rows):
            raise AssertionError(f"tied_batch_rows {rows}: the ranks did not split the tied embedding")
        # The lookup read the union of the ranks' rows, gathered by rows (cut rows too), and
        # not the whole embedding: the whole is gathered with the LM head, so the update of
        # the other rows runs beside the forward.
        gathered = [m["pipeline"].get("fsdp_lookup_rows") for m in got]
        if gathered != rows:
            raise AssertionError(f"fsdp_lookup_rows {gathered}, want the batch rows {rows}")
        if any("tied_batch_rows" in m["pipeline"] for m in metrics(ref)):
            raise AssertionError("one process with three micro-batches split the tied embedding")


# HSDP (model.dp_replicate = 2 over 4 ranks): two shard groups of two ranks, each holding
# the whole state in two pieces; the gradients summed over the groups. One process's
# numbers, and a checkpoint of two pieces (the first group's) that any world resumes.
for offload in ("none", "optimizer", "full"):
    for reshard in (True, False):
        label = "reshard_after_forward" if reshard else "no reshard_after_forward"

        @case(f"HSDP 2 x 2, offload = {offload}, {label}: one process's numbers, two pieces saved")
        def _(work, offload=offload, reshard=reshard):
            flags = ["--model.dp-replicate=2"] + ([] if reshard else ["--no-model.reshard-after-forward"])
            ref_metrics = reference(offload)[0]
            ok(torchrun(4, config(work, offload=offload), *flags, *EVERY_STEP), "torchrun")
            got = metrics(work)
            same_steps(ref_metrics, got, "HSDP 2 x 2")
            close_adam(reference_dir(offload), work, "HSDP 2 x 2")
            pieces = sorted(f for f in os.listdir(os.path.join(work, "out", "checkpoints", "step_4")) if f.startswith("optimizer"))
            if pieces != ["optimizer-00000-of-00002.safetensors", "optimizer-00001-of-00002.safetensors"]:
                raise AssertionError(f"optimizer files {pieces}, want the two pieces of one shard group")
            total, root = whole_bytes(work)
            want = root if reshard else total
            for step, after in enumerate(held_whole(got, "fsdp_whole_after_forward_gib"), 1):
                if abs(after - want) > 1e-5 * want:
                    raise AssertionError(f"step {step}: {after:.0f} bytes whole after the forward, want {want}")


# A resume reads each checkpoint file back once, on one rank (files taken in turn), and
# a save has each rank sum the piece it wrote: at 70B scale no rank reads a terabyte.
# A file changed after the save must still stop every rank, naming it.
@case("2 ranks: a piece changed after the save is found by the rank that reads it, and every rank fails")
def _(work):
    ok(torchrun(2, config(work, steps=2)), "first part")
    path = os.path.join(work, "out", "checkpoints", "step_2", "optimizer-00001-of-00002.safetensors")
    with open(path, "r+b") as f:
        f.seek(os.path.getsize(path) - 100)
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 0x10]))
    p = torchrun(2, config(work, steps=4, resume=2))
    if p.returncode == 0:
        raise AssertionError("the resume ran from a changed checkpoint")
    # Files in the manifest's order: config.json, model, piece 0, piece 1, trainer state;
    # piece 1 is rank 1's to read, and rank 0 fails through the agreement, naming rank 1.
    for needle in ("optimizer-00001-of-00002.safetensors: checksum", "rank 1 failed"):
        if needle not in p.stderr:
            raise AssertionError(f"stderr lacks {needle!r}:\n{p.stderr[-3000:]}")


@case("HSDP: saved by 2 x 2 ranks, resumed on 1 process and on 2 x 1: continues as one process does")
def _(work):
    ref_metrics, _, ref_final = reference("optimizer")
    ok(torchrun(4, config(work, steps=2), "--model.dp-replicate=2", *EVERY_STEP), "first part, HSDP 2 x 2")
    base = os.path.join(work, "out")
    again = config(work, steps=4, resume=2)
    for name, run in (("one process", lambda: one(again, *EVERY_STEP)),
                      ("HSDP 2 x 1", lambda: torchrun(2, again, "--model.dp-replicate=2", *EVERY_STEP))):
        for step in (3, 4):
            shutil.rmtree(os.path.join(base, "checkpoints", f"step_{step}"), ignore_errors=True)
        ok(run(), f"resume on {name}")
        same_steps(ref_metrics, metrics(work), f"resumed on {name}", first=3)
        close_adam(reference_dir("optimizer"), work, f"resumed on {name}")


@case("HSDP: a dp_replicate that does not divide the world size is an error naming both")
def _(work):
    cfg = config(work, extra="")
    for world, run in ((1, lambda: one(cfg, "--model.dp-replicate=2")),
                       (3, lambda: torchrun(3, cfg, "--model.dp-replicate=2"))):
        p = run()
        if p.returncode == 0:
            raise AssertionError(f"world {world} with dp_replicate = 2 ran")
        if "model.dp_replicate" not in p.stderr or f"world size {world}" not in p.stderr:
            raise AssertionError(f"world {world}: the error does not name model.dp_replicate and the world size:\n{p.stderr[-1500:]}")


for saved, resumed, mode_from, mode_to in (
    (2, 1, "none", "none"),
    (2, 4, "optimizer", "optimizer"),
    (4, 2, "full", "full"),
    (1, 4, "none", "none"),
    (4, 1, "optimizer", "full"),
    (2, 2, "full", "none"),
):

    @case(f"saved by {saved} ranks ({mode_from}), resumed on {resumed} ({mode_to}): continues as one process does")
    def _(work, saved=saved, resumed=resumed, mode_from=mode_from, mode_to=mode_to):
        clip = mode_from == mode_to
        ref_metrics, ref_final = resumed_reference(mode_from, mode_to, clip)
        run = (lambda w, c: one(c, *EVERY_STEP)) if saved == 1 else (lambda w, c: torchrun(w, c, *EVERY_STEP))
        ok(run(saved, config(work, steps=2, offload=mode_from, clip=clip)), f"first part on {saved}")
        again = config(work, steps=4, offload=mode_to, resume=2, clip=clip)
        ok(one(again, *EVERY_STEP) if resumed == 1 else torchrun(resumed, again, *EVERY_STEP), f"resume on {resumed}")
        same_steps(ref_metrics, metrics(work), "resumed", first=3)
        close_adam(resumed_reference_dir(mode_from, mode_to, clip), work, "resumed")


@case("saved by 2 ranks (full) in weight files of 100 kB, resumed on 1 process: continues as one process does")
def _(work):
    ref_metrics, ref_final = resumed_reference("full", "full", False)
    ok(torchrun(2, config(work, steps=2, offload="full", clip=False), "--save.max-shard-bytes=100000", *EVERY_STEP),
       "first part on 2")
    saved = os.listdir(os.path.join(work, "out", "checkpoints", "step_2"))
    if "model.safetensors" in saved or "model.safetensors.index.json" not in saved:
        raise AssertionError(f"expected weight files and their index, the folder holds {sorted(saved)}")
    ok(one(config(work, steps=4, offload="full", resume=2, clip=False), *EVERY_STEP), "resume on 1")
    same_steps(ref_metrics, metrics(work), "resumed", first=3)
    close_adam(resumed_reference_dir("full", "full", False), work, "resumed")


@case("model.reduce_dtype = bfloat16 is used: close to one process, not the FP32 reduction's numbers")
def _(work):
    ref_metrics, _, ref_final = reference("none")
    ok(torchrun(2, config(work, offload="none"), "--model.reduce-dtype=bfloat16"), "torchrun")
    got = state(work, 4)
    d = max((got[k].reshape(-1)[: ref_final[k].numel()] - ref_final[k].reshape(-1)).abs().max().item() for k in got)
    if not 1e-6 < d < 1e-2:
        raise AssertionError(f"bf16 reduction moved the weights by {d:.3g} from one process (want 1e-6..1e-2)")
    for m, r in zip(metrics(work), ref_metrics):
        if abs(m["loss"] - r["loss"]) > 1e-2 * abs(r["loss"]):
            raise AssertionError(f"step {m['step']}: loss {m['loss']} vs {r['loss']}")


# With one micro-batch a step the tied embedding is split: then only the batch's rows of the
# piece's final gradient go to the host, as one process stages only the batch's rows.
for split in (False, True):
    @case("one rank, bf16, full" + (", tied embedding split" if split else "") +
          ": gradients reach the host in bf16 as in one process, not as FP32 pieces")
    def _(work, split=split):
        alone = os.path.join(work, "alone")
        os.makedirs(alone)
        flags = ["--compute-dtype=bf16"] + (["--data.batch-size=2"] if split else [])
        ok(one(config(alone, offload="full"), *flags), "one process")
        ok(torchrun(1, config(work, offload="full"), *flags), "torchrun")
        ref, got = metrics(alone), metrics(work)
        if len(ref) != len(got):
            raise AssertionError(f"{len(got)} steps against {len(ref)}")
        if split != all("tied_batch_rows" in m["pipeline"] for m in ref + got):
            raise AssertionError("the tied embedding was " + ("not " if split else "") + "split")
        for r, m in zip(ref, got):
            # An FP32 piece of one rank is the bf16 gradient widened: narrowed back, the same
            # values in half the bytes (twice one process's d2h_gib before); split, the piece's
            # batch rows alone (the whole piece before).
            if m["pipeline"]["d2h_gib"] != r["pipeline"]["d2h_gib"]:
                raise AssertionError(f"step {m['step']}: d2h_gib {m['pipeline']['d2h_gib']} vs "
                                     f"{r['pipeline']['d2h_gib']}")
            if abs(m["loss"] - r["loss"]) > 1e-6 * abs(r["loss"]):
                raise AssertionError(f"step {m['step']}: loss {m['loss']} vs {r['loss']}")


@case("two nodes of two ranks each (loopback): the same as one process")
def _(work):
    ref_metrics, _, ref_final = reference("optimizer")
    cfg = config(work)
    port = free_port()
    nodes = [torchrun(2, cfg, *EVERY_STEP, nnodes=2, node_rank=r, port=port, wait=False) for r in (0, 1)]
    for n in nodes:
        _, err = n.communicate(timeout=300)
        if n.returncode != 0:
            raise AssertionError(f"a node exited {n.returncode}\n{err[-3000:]}")
    same_steps(ref_metrics, metrics(work), "2 nodes")
    close_adam(reference_dir("optimizer"), work, "2 nodes")


def direct(world, cfg, port, extra_per_rank=None, steps_flag=(), file_limit=None):
    """Ranks started the way any launcher does: the variables, no torchrun.
    file_limit: {rank: bytes}, that rank's RLIMIT_FSIZE."""
    import resource

    procs = []
    for r in range(world):
        limit = (file_limit or {}).get(r)
        pre = (lambda lim=limit: resource.setrlimit(resource.RLIMIT_FSIZE, (lim, lim))) if limit else None
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(world), LOCAL_RANK=str(r), LOCAL_WORLD_SIZE=str(world),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        env.pop("TORCHELASTIC_USE_AGENT_STORE", None)
        args = [TRAIN, "@", cfg, "--device=cpu", *EXTRA, *steps_flag, *((extra_per_rank or {}).get(r, []))]
        procs.append(subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                      errors="replace", preexec_fn=pre))
    return procs


def wait_for_steps(work, n, procs, limit=120):
    t = time.time()
    path = os.path.join(work, "out", "metrics.jsonl")
    while time.time() - t < limit:
        if os.path.exists(path) and len(open(path).read().splitlines()) >= n:
            return
        if any(p.poll() is not None for p in procs):
            raise AssertionError("a rank exited early: " + " | ".join((p.communicate()[1] or "")[-800:] for p in procs))
        time.sleep(0.2)
    raise AssertionError(f"no {n} steps in {limit} s")


def fault(work, victim, sig, timeout_s, *needles):
    cfg = config(work, steps=100000, extra="", offload="none").replace(".toml", ".toml")
    with open(cfg) as f:
        text = f.read().replace("dist_timeout_seconds = 20", f"dist_timeout_seconds = {timeout_s}")
    with open(cfg, "w") as f:
        f.write(text.replace("interval = 2", "interval = 100000"))
    procs = direct(2, cfg, free_port())
    try:
        wait_for_steps(work, 3, procs)
        t = time.time()
        os.kill(procs[victim].pid, sig)
        survivor = procs[1 - victim]
        _, err = survivor.communicate(timeout=timeout_s + 60)
        took = time.time() - t
        if survivor.returncode == 0:
            raise AssertionError("the surviving rank exited 0")
        if took > timeout_s + 30:
            raise AssertionError(f"the surviving rank took {took:.0f} s (timeout {timeout_s} s)")
        for n in needles:
            if n not in err:
                raise AssertionError(f"'{n}' not in the survivor's error (exit {survivor.returncode}):\n{err[-2000:]}")
        return took
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()


@case("a rank that is killed: the other exits, naming it")
def _(work):
    fault(work, 1, signal.SIGKILL, 15, "primecfg-train[rank 0]: error:", "rank 1")


@case("a rank that hangs (SIGSTOP): the other exits within dist_timeout_seconds, naming it")
def _(work):
    fault(work, 1, signal.SIGSTOP, 8, "primecfg-train[rank 0]: error:", "rank 1 (no heartbeat")


@case("rank 0 (the store's host) killed: the other exits, naming it")
def _(work):
    fault(work, 0, signal.SIGKILL, 15, "primecfg-train[rank 1]: error:", "rank 0")


@case("one rank's checkpoint write fails (file-size limit): every rank fails, no checkpoint folder is left")
def _(work):
    procs = direct(2, config(work), free_port(), file_limit={1: 64 * 1024})
    errs = []
    for r, p in enumerate(procs):
        _, err = p.communicate(timeout=120)
        errs.append(err)
        if p.returncode == 0:
            raise AssertionError(f"rank {r} exited 0")
    if "rank 1 failed" not in errs[0] or "optimizer-00001-of-00002" not in errs[0]:
        raise AssertionError("rank 0's error does not name rank 1's write:\n" + errs[0][-1500:])
    left = os.listdir(os.path.join(work, "out", "checkpoints"))
    if left:
        raise AssertionError(f"left in checkpoints/: {left}")


@case("a config that differs between ranks is refused at start, by every rank")
def _(work):
    cfg = config(work)
    procs = direct(2, cfg, free_port(), extra_per_rank={1: ["--optim.lr=2e-3"]})
    for r, p in enumerate(procs):
        _, err = p.communicate(timeout=120)
        if p.returncode == 0 or "differs between ranks: rank 1 differs from rank 0" not in err:
            raise AssertionError(f"rank {r}: exit {p.returncode}\n{err[-2000:]}")
    if os.path.exists(os.path.join(work, "out", "metrics.jsonl")):
        raise AssertionError("a step ran")


def children(pid):
    """The processes whose parent is pid (torchrun's workers), from /proc."""
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        out.append(int(d))
            except (OSError, IndexError, ValueError):
                pass
    return sorted(out)


for interval in (2, 100000):

    @case(f"torchrun --max-restarts: a rank killed {'after a checkpoint' if interval == 2 else 'before any checkpoint'}; "
          "the restart continues, as the straight run")
    def _(work, interval=interval):
        steps = 24
        ref = tempfile.mkdtemp(dir=ROOT)
        ok(one(config(ref, steps=steps)), "one process")
        cfg = config(work, steps=steps)
        with open(cfg) as f:
            text = f.read()
        with open(cfg, "w") as f:
            f.write(text.replace("interval = 2", f"interval = {interval}"))
        p = torchrun(2, cfg, wait=False, restarts=1)
        out = os.path.join(work, "out")
        def due():  # step_4 saved, or (no checkpoints) 3 steps logged
            if interval == 2:
                return os.path.exists(os.path.join(out, "checkpoints", "step_4", "manifest.json"))
            path = os.path.join(out, "metrics.jsonl")
            return os.path.exists(path) and len(open(path).read().splitlines()) >= 3
        t = time.time()
        while not due() and p.poll() is None and time.time() - t < 120:
            time.sleep(0.02)
        workers = children(p.pid)
        if p.poll() is not None or len(workers) != 2:
            raise AssertionError(f"no two workers to kill (exit {p.poll()}, workers {workers})")
        os.kill(workers[1], signal.SIGKILL)
        _, err = p.communicate(timeout=300)
        if p.returncode != 0:
            raise AssertionError(f"the restarted job exited {p.returncode}\n{err[-3000:]}")
        want = "continuing from step" if interval == 2 else "no complete checkpoint yet, starting over"
        if "torchrun restart 1 of job" not in err or want not in err:
            raise AssertionError(f"no note '{want}':\n" + err[-3000:])
        got = metrics(work)
        if [m["step"] for m in got] != list(range(1, steps + 1)):
            raise AssertionError(f"metrics.jsonl steps: {[m['step'] for m in got]}")
        if interval != 2 and not os.path.exists(os.path.join(out, "metrics.after_step_0.jsonl")):
            raise AssertionError(f"the first attempt's metrics were not kept aside: {os.listdir(out)}")
        same_steps(metrics(ref), got, "restarted")
        close(state(ref, steps), state(work, steps), f"restarted, step {steps}")


@case("torchrun --max-restarts over two nodes (c10d rendezvous, --rdzv-id): a killed rank's job continues")
def _(work):
    steps = 24
    ref = tempfile.mkdtemp(dir=ROOT)
    ok(one(config(ref, steps=steps)), "one process")
    port = free_port()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=1", "--max-restarts=1",
           "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", f"--rdzv-id=job-{port}", "--no-python",
           TRAIN, "@", config(work, steps=steps), "--device=cpu", *EXTRA]
    agents = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace")
              for _ in range(2)]
    try:
        manifest = os.path.join(work, "out", "checkpoints", "step_4", "manifest.json")
        t = time.time()
        while not os.path.exists(manifest) and all(a.poll() is None for a in agents) and time.time() - t < 120:
            time.sleep(0.02)
        workers = children(agents[1].pid)
        if any(a.poll() is not None for a in agents) or len(workers) != 1:
            raise AssertionError(f"no worker to kill after step 4 (exits {[a.poll() for a in agents]})")
        os.kill(workers[0], signal.SIGKILL)
        errs = [a.communicate(timeout=300)[1] for a in agents]
    finally:
        for a in agents:
            if a.poll() is None:
                a.kill()
            a.wait()
    if any(a.returncode for a in agents):
        raise AssertionError(f"agents exited {[a.returncode for a in agents]}\n" + "\n=====\n".join(e[-6000:] for e in errs))
    if not any("continuing from step" in e for e in errs):
        raise AssertionError("no note of the restart continuing:\n" + "\n".join(e[-1500:] for e in errs))
    got = metrics(work)
    if [m["step"] for m in got] != list(range(1, steps + 1)):
        raise AssertionError(f"metrics.jsonl steps: {[m['step'] for m in got]}")
    same_steps(metrics(ref), got, "restarted over two nodes")
    close(state(ref, steps), state(work, steps), f"restarted over two nodes, step {steps}")


@case("torchrun --max-restarts: a folder the first attempt was refused stays refused, untouched")
def _(work):
    ok(one(config(work, steps=2)), "another run in the folder")
    before = open(os.path.join(work, "out", "metrics.jsonl")).read()
    p = torchrun(2, config(work, steps=4, offload="none"), restarts=1)
    if p.returncode == 0 or "holds another run" not in p.stderr or "the folder was not claimed by this job" not in p.stderr:
        raise AssertionError(f"exit {p.returncode}, want both attempts refused:\n{p.stderr[-3000:]}")
    if open(os.path.join(work, "out", "metrics.jsonl")).read() != before:
        raise AssertionError("the other run's metrics changed")
    if sorted(os.listdir(os.path.join(work, "out", "checkpoints"))) != ["step_2"]:
        raise AssertionError(f"checkpoints: {os.listdir(os.path.join(work, 'out', 'checkpoints'))}")


@case("a batch the ranks cannot share evenly is an error naming data.batch_size")
def _(work):
    p = torchrun(4, config(work).replace("", ""), "--data.batch-size=6")
    if p.returncode == 0 or "data.batch_size = 6" not in p.stderr:
        raise AssertionError(f"exit {p.returncode}\n{p.stderr[-2000:]}")


print(f"\n{passed} passed, {len(failed)} failed; largest difference from one process: {worst:.3g} (tolerance {TOL})")
if failed:
    for f in failed:
        print(f"  failed: {f}")
    print(f"the failed cases' folders are kept under {ROOT}")
    sys.exit(1)
shutil.rmtree(ROOT, ignore_errors=True)
