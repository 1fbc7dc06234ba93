"""primecfg-train under faults: nothing lost, nothing silent.

Each case runs the real program on the tiny model (CPU) and checks one guarantee
of docs/reliability.md: pruning and resume keep every checkpoint that matters, a
used output_dir is refused, one writer per folder, a damaged checkpoint is named,
a NaN loss stops the run with valid metrics, a file-size limit is an error with no
partial checkpoint left, special files do not hang, usage errors exit 2.

usage: reliability_test.py PRIMECFG_TRAIN [WORDS]   (WORDS: run only the cases whose name has them)
"""

import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

TRAIN = sys.argv[1]
ONLY = sys.argv[2] if len(sys.argv) > 2 else ""
ROOT = tempfile.mkdtemp(prefix="reliability-")
passed, failed = 0, []


def toml(work, steps, extra="", ckpt="interval = 2"):
    path = os.path.join(work, "run.toml")
    with open(path, "w") as f:
        f.write(
            f"""max_steps = {steps}
output_dir = {json.dumps(os.path.join(work, "out"))}
{extra}
[model]
name = "primecfg/tiny"
attn = "sdpa"
compile = "None"
[data]
seq_len = 32
batch_size = 4
micro_batch_size = 2
[optim]
lr = 1e-3
[ckpt]
{ckpt}
"""
        )
    return path


def train(cfg, *args, timeout=300, limit=None):
    def preexec():
        if limit:
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return subprocess.run(
        [TRAIN, "@", cfg, "--device=cpu", *args], capture_output=True, text=True, errors="replace", timeout=timeout, preexec_fn=preexec
    )


def steps_in(folder):
    return sorted(int(n[5:]) for n in os.listdir(folder) if n.startswith("step_"))


def case(name):
    def wrap(fn):
        global passed
        if ONLY not in name:
            return fn
        work = os.path.join(ROOT, name.replace(" ", "_"))
        os.makedirs(work)
        try:
            fn(work)
            passed += 1
            print(f"ok {name}")
        except Exception as e:  # noqa: BLE001 - report every failure, go on
            failed.append(f"{name}: {e}")
            print(f"FAIL {name}: {e}")
        return fn

    return wrap


def expect(p, code, *needles):
    if p.returncode != code or any(n not in p.stderr for n in needles):
        raise AssertionError(f"want exit {code} with {needles}, got {p.returncode}:\n{p.stderr[-2000:]}")


@case("keep_last keeps the newest, resume from an older step moves later ones aside")
def _(work):
    cfg = toml(work, 6, ckpt="interval = 2\nkeep_last = 2")
    expect(train(cfg), 0)
    ck = os.path.join(work, "out", "checkpoints")
    assert steps_in(ck) == [4, 6], steps_in(ck)
    # A step that is not a checkpoint moves nothing.
    expect(train(toml(work, 8, ckpt="interval = 2\nkeep_last = 2\n[resume]\nstep = 5")), 1, "step_5",
           "not a complete checkpoint")
    assert steps_in(ck) == [4, 6], steps_in(ck)
    # Resume from 4 and run to 8: step_6 of the first run is kept aside, not overwritten.
    cfg = toml(work, 8, ckpt="interval = 2\nkeep_last = 2\n[resume]\nstep = 4")
    p = train(cfg)
    expect(p, 0, "moved to")
    assert steps_in(ck) == [6, 8], steps_in(ck)
    assert steps_in(os.path.join(ck, "abandoned_after_step_4")) == [6]
    kept = [json.loads(x)["step"] for x in open(os.path.join(work, "out", "metrics.after_step_4.jsonl"))]
    assert kept == [5, 6], kept
    now = [json.loads(x)["step"] for x in open(os.path.join(work, "out", "metrics.jsonl"))]
    assert now == list(range(1, 9)), now


@case("a new run into a used output_dir is refused; clean = true starts over")
def _(work):
    expect(train(toml(work, 2)), 0)
    expect(train(toml(work, 2)), 1, os.path.join(work, "out"), "holds another run", "clean = true")
    expect(train(toml(work, 2, extra="clean = true")), 0)
    assert steps_in(os.path.join(work, "out", "checkpoints")) == [2]


@case("one writer per output_dir")
def _(work):
    first = subprocess.Popen(
        [TRAIN, "@", toml(work, 100000, ckpt="interval = 100000"), "--device=cpu"],
        stderr=subprocess.PIPE, text=True,
    )
    try:
        deadline = time.time() + 60
        while not os.path.exists(os.path.join(work, "out", "metrics.jsonl")) and time.time() < deadline:
            time.sleep(0.2)
        t0 = time.time()
        second = train(toml(os.path.join(work), 2, extra="clean = true"), timeout=60)
        expect(second, 1, "another primecfg-train", f"pid {first.pid}")
        assert time.time() - t0 < 30, "the second run waited instead of failing at once"
    finally:
        first.kill()
        first.wait()


def saved_run(work):
    expect(train(toml(work, 4)), 0)
    return os.path.join(work, "out", "checkpoints", "step_4")


def resume(work):
    return train(toml(work, 6, ckpt="interval = 2\n[resume]\nstep = 4"))


@case("a bit flipped in optimizer state is named on resume")
def _(work):
    step = saved_run(work)
    path = os.path.join(step, "optimizer.safetensors")
    with open(path, "r+b") as f:
        f.seek(os.path.getsize(path) - 100)
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 0x10]))
    expect(resume(work), 1, "optimizer.safetensors", "checksum")


def xxh64(data, seed=0):
    """XXH64 (the manifest's checksum), written from its published specification."""
    M = (1 << 64) - 1
    P1, P2, P3, P4, P5 = (0x9E3779B185EBCA87, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9,
                          0x85EBCA77C2B2AE63, 0x27D4EB2F165667C5)
    rotl = lambda x, r: ((x << r) | (x >> (64 - r))) & M
    u64 = lambda i: int.from_bytes(data[i:i + 8], "little")
    u32 = lambda i: int.from_bytes(data[i:i + 4], "little")

    def rnd(acc, lane):
        return (rotl((acc + lane * P2) & M, 31) * P1) & M

    n, i = len(data), 0
    if n >= 32:
        v = [(seed + P1 + P2) & M, (seed + P2) & M, seed, (seed - P1) & M]
        while i + 32 <= n:
            v = [rnd(v[k], u64(i + 8 * k)) for k in range(4)]
            i += 32
        h = (rotl(v[0], 1) + rotl(v[1], 7) + rotl(v[2], 12) + rotl(v[3], 18)) & M
        for x in v:
            h = (((h ^ rnd(0, x)) * P1) + P4) & M
    else:
        h = (seed + P5) & M
    h = (h + n) & M
    while i + 8 <= n:
        h = ((rotl(h ^ rnd(0, u64(i)), 27) * P1) + P4) & M
        i += 8
    if i + 4 <= n:
        h = ((rotl(h ^ ((u32(i) * P1) & M), 23) * P2) + P3) & M
        i += 4
    while i < n:
        h = (rotl(h ^ ((data[i] * P5) & M), 11) * P1) & M
        i += 1
    h ^= h >> 33
    h = (h * P2) & M
    h ^= h >> 29
    h = (h * P3) & M
    return h ^ (h >> 32)


def rewrite_in_checkpoint(step, name, edit):
    """Changes one file of a checkpoint and updates the manifest to match, as a
    careless tool (or a person) would: the checksums no longer catch it."""
    path = os.path.join(step, name)
    with open(path) as f:
        text = edit(f.read())
    with open(path, "w") as f:
        f.write(text)
    data = text.encode()
    mpath = os.path.join(step, "manifest.json")
    with open(mpath) as f:
        manifest = json.load(f)
    manifest["files"][name] = {"bytes": len(data), "xxh64": f"{xxh64(data):016x}"}
    with open(mpath, "w") as f:
        json.dump(manifest, f, indent=2)


@case("a checkpoint whose config.json changes the computation is refused, naming each key and both values")
def _(work):
    step = saved_run(work)
    with open(os.path.join(step, "model.safetensors"), "rb") as f:  # the checksum helper is checked first
        want = json.load(open(os.path.join(step, "manifest.json")))["files"]["model.safetensors"]["xxh64"]
        assert f"{xxh64(f.read()):016x}" == want, "xxh64 in this test disagrees with the manifest"

    def edit(text):
        c = json.loads(text)
        c["rope_theta"] = c["rope_theta"] * 10
        c["rms_norm_eps"] = 0.1
        return json.dumps(c, indent=2)

    rewrite_in_checkpoint(step, "config.json", edit)
    p = resume(work)
    expect(p, 1, os.path.join(step, "config.json"), "rope_theta:", "rms_norm_eps: 0.1 in the checkpoint")
    # Token ids do not change what the model computes: a checkpoint that only differs there resumes.
    work2 = os.path.join(work, "ids")
    os.makedirs(work2)
    step = saved_run(work2)
    rewrite_in_checkpoint(step, "config.json", lambda t: json.dumps(dict(json.loads(t), bos_token_id=7), indent=2))
    expect(resume(work2), 0)


@case("a truncated or missing checkpoint file is named on resume")
def _(work):
    step = saved_run(work)
    path = os.path.join(step, "model.safetensors")
    os.truncate(path, os.path.getsize(path) - 8)
    expect(resume(work), 1, "model.safetensors", "bytes")
    shutil.rmtree(os.path.join(work, "out"))
    step = saved_run(work)
    os.remove(os.path.join(step, "optimizer.safetensors"))
    expect(resume(work), 1, "optimizer.safetensors", "missing")


@case("a checkpoint whose folder disagrees with its step is refused")
def _(work):
    step = saved_run(work)
    os.rename(step, step[:-1] + "5")
    p = train(toml(work, 6, ckpt="interval = 2\n[resume]\nstep = 5"))
    expect(p, 1, "step_5", "disagrees")


@case("a killed run's temporary checkpoint is removed")
def _(work):
    ck = os.path.join(work, "out", "checkpoints")
    expect(train(toml(work, 2)), 0)
    os.makedirs(os.path.join(ck, ".step_3.tmp"))
    open(os.path.join(ck, ".step_3.tmp", "model.safetensors"), "w").write("partial")
    expect(train(toml(work, 4, ckpt="interval = 2\n[resume]\nstep = 2")), 0)
    assert not os.path.exists(os.path.join(ck, ".step_3.tmp"))


@case("a NaN loss stops the run; metrics.jsonl stays valid JSON")
def _(work):
    cfg = toml(work, 50, ckpt="interval = 1000")
    with open(cfg) as f:
        text = f.read().replace("lr = 1e-3", "lr = 1e30\nmax_norm = \"None\"")
    with open(cfg, "w") as f:
        f.write(text)
    p = train(cfg)
    expect(p, 1, "the loss is", "stopping")

    def no_constants(name):
        raise ValueError(f"{name} is not JSON")

    lines = [json.loads(x, parse_constant=no_constants) for x in open(os.path.join(work, "out", "metrics.jsonl"))]
    assert lines and lines[-1]["loss"] is None or lines[-1]["grad_norm"] is None, lines[-1]
    assert not os.path.exists(os.path.join(work, "out", "checkpoints", f"step_{lines[-1]['step']}"))


@case("a file-size limit fails the checkpoint with its name, no partial folder left")
def _(work):
    p = train(toml(work, 2), limit=1 << 20)  # the tiny model's weights are about 2 MB
    expect(p, 1, ".safetensors")
    ck = os.path.join(work, "out", "checkpoints")
    left = os.listdir(ck) if os.path.isdir(ck) else []
    assert left == [], left


@case("a metrics.jsonl write that fails mid-line leaves whole lines only; a resume carries no torn line")
def _(work):
    # A file-size limit that falls inside the second line written after a resume from
    # step 16 (metrics.jsonl is then the largest file the run writes).
    expect(train(toml(work, 16, ckpt="interval = 16")), 0)
    out = os.path.join(work, "out")
    first = open(os.path.join(out, "metrics.jsonl"), "rb").read()
    line = len(first) // 16
    limit = len(first) + line + line // 2
    assert os.path.getsize(os.path.join(out, "config.toml")) < limit, "config.toml outgrew the limit"
    p = train(toml(work, 24, ckpt="interval = 100000\n[resume]\nstep = 16"), limit=limit)
    expect(p, 1, "metrics.jsonl: write failed", "the file ends with the last whole line")
    data = open(os.path.join(out, "metrics.jsonl"), "rb").read()
    assert data.endswith(b"\n") and len(data) < limit, (len(data), limit, data[-80:])
    steps = [json.loads(x)["step"] for x in data.decode().splitlines()]
    assert steps == list(range(1, 18)), steps
    # Resumed again from step 16: what moves aside is whole lines too.
    expect(train(toml(work, 18, ckpt="interval = 100000\n[resume]\nstep = 16")), 0)
    aside = [json.loads(x)["step"] for x in open(os.path.join(out, "metrics.after_step_16.jsonl"))]
    assert aside == [17], aside


with open(TRAIN, "rb") as _f:
    ASAN = b"__asan_init" in _f.read()  # AddressSanitizer maps terabytes of shadow: no ulimit -v


@case("host memory that runs out is said plainly, with the allocation and the planner's host estimate")
def _(work):
    if ASAN:
        print("skip (an AddressSanitizer build cannot start under ulimit -v; the release build runs this case)")
        return

    def small_address_space():
        resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))

    p = subprocess.run(
        [TRAIN, "--device=cpu", "--model.name=Qwen/Qwen3-0.6B", "--data.type=fake", "--data.seq-len=512",
         "--data.batch-size=1", "--data.micro-batch-size=1", "--max-steps=30", f"--output-dir={work}/out"],
        capture_output=True, text=True, errors="replace", timeout=300, preexec_fn=small_address_space)
    expect(p, 1, "error: host memory ran out:", " MiB)", "The planner's host estimate for this config",
           "on --device=cpu", "address-space limit (ulimit -v) is 3.00 GiB")


@case("activation offloading's host buffer that cannot be had is said as such, with the planner's host estimate")
def _(work):
    if ASAN:
        print("skip (an AddressSanitizer build cannot start under ulimit -v; the release build runs this case)")
        return
    # 40 small blocks at 131,072 tokens: the weights and state take about 130 MB, the 39
    # offloaded block inputs (FP32 on the CPU) 2.4 GiB, asked for before block 0 computes.
    model = os.path.join(work, "deep")
    os.makedirs(model)
    with open(os.path.join(model, "config.json"), "w") as f:
        json.dump({"model_type": "qwen3", "vocab_size": 260, "hidden_size": 128, "num_hidden_layers": 40,
                   "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "intermediate_size": 256,
                   "tie_word_embeddings": True}, f)

    # The address space a process has before it allocates anything depends on the build
    # (a CUDA wheel maps more and larger libraries than the CPU one): the limit starts
    # at 3 GiB and grows by 1 GiB until the run gets past its first allocations. Every run
    # below that limit must fail as host memory, and the buffer (2.44 GiB) must be what
    # fails before any limit lets the run through.
    for limit_gib in range(3, 25):
        def small_address_space(limit=limit_gib << 30):
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

        p = subprocess.run(
            [TRAIN, "--device=cpu", f"--model.name={model}", "--model.debug.random-init", "--data.type=fake",
             "--data.seq-len=131072", "--data.batch-size=1", "--data.micro-batch-size=1", "--max-steps=1",
             "--model.ac", "--model.ac-offloading.max-inflight-activations=1", f"--output-dir={work}/out"],
            capture_output=True, text=True, errors="replace", timeout=300, preexec_fn=small_address_space)
        if "(model.ac_offloading) could not allocate" in p.stderr or p.returncode == 0:
            break
        expect(p, 1, "error: host memory ran out:")
    expect(p, 1, "error: host memory ran out: activation offloading (model.ac_offloading) could not allocate 2.44 GiB",
           "39 block inputs of 64.0 MiB", "The planner's host estimate for this config")


@case("an environment variable the trainer used to read is noted, naming the option that replaced it")
def _(work):
    env = dict(os.environ, PRIMECFG_PEAK_TFLOPS="989", PRIMECFG_OFFLOAD_TIMEOUT_S="5", PRIMECFG_EVENT_POOL="0")
    p = subprocess.run([TRAIN, "@", toml(work, 2), "--device=cpu"], capture_output=True, text=True,
                       errors="replace", timeout=300, env=env)
    expect(p, 0, "PRIMECFG_PEAK_TFLOPS=989 is not read any more: use --peak-tflops instead",
           "PRIMECFG_OFFLOAD_TIMEOUT_S=5 is not read any more: use --offload.timeout-s instead",
           "PRIMECFG_EVENT_POOL=0 is not read any more: no option replaces it")


@case("a FIFO as data, config.json or weights is an error, not a hang")
def _(work):
    fifo = os.path.join(work, "data.fifo")
    os.mkfifo(fifo)
    cfg = toml(work, 2)
    with open(cfg) as f:
        text = f.read().replace("seq_len = 32", f"seq_len = 32\npath = {json.dumps(fifo)}")
    with open(cfg, "w") as f:
        f.write(text)
    expect(train(cfg, timeout=60), 1, "data.fifo", "not a regular file")
    model = os.path.join(work, "model")
    os.makedirs(model)
    os.mkfifo(os.path.join(model, "config.json"))
    cfg = toml(work, 2, extra="clean = true")
    with open(cfg) as f:
        text = f.read().replace('"primecfg/tiny"', json.dumps(model))
    with open(cfg, "w") as f:
        f.write(text)
    expect(train(cfg, timeout=60), 1, "config.json", "not a regular file")
    # a FIFO in place of the weights
    os.remove(os.path.join(model, "config.json"))
    with open(os.path.join(model, "config.json"), "w") as f:
        json.dump({"model_type": "qwen3", "vocab_size": 260, "hidden_size": 128, "num_hidden_layers": 2,
                   "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "intermediate_size": 384,
                   "tie_word_embeddings": True}, f)
    os.mkfifo(os.path.join(model, "model.safetensors"))
    expect(train(cfg, timeout=60), 1, "model.safetensors", "not a regular file")


@case("usage errors and unwritable standard output exit 2, config errors 1")
def _(work):
    p = subprocess.run([TRAIN, "--compute-dtype=fp64"], capture_output=True, text=True)
    expect(p, 2, "--compute-dtype")
    p = subprocess.run([TRAIN, "--plan-gpu-memory=80"], capture_output=True, text=True)
    expect(p, 2, "only applies with --plan")
    p = subprocess.run([TRAIN, "@", os.path.join(work, "missing.toml")], capture_output=True, text=True)
    expect(p, 2, "missing.toml")
    p = subprocess.run([TRAIN, "--device=cuda:x"], capture_output=True, text=True)
    expect(p, 2, "cuda:x")
    p = subprocess.run([TRAIN, "--optim.lr=-1"], capture_output=True, text=True)
    expect(p, 1, "optim.lr")
    for args in (["--help"], ["--print-default"], ["--plan", "--plan-gpu-memory=80", "--plan-host-memory=100"]):
        with open("/dev/full", "w") as full:
            p = subprocess.run([TRAIN, *args], stdout=full, stderr=subprocess.PIPE, text=True)
        expect(p, 2, "cannot write to standard output")


@case("--help lists every model preset and model_type the trainer accepts, and each it lists is accepted")
def _(work):
    p = subprocess.run([TRAIN, "--help"], capture_output=True, text=True)
    expect(p, 0)
    help_text = p.stdout
    para = p.stdout[p.stdout.index("Model presets (model.name):") :].split("\nOr a local HF directory")[0]
    listed = [n.strip(" .\n") for n in para.split(":", 1)[1].split(",")]
    # The resolver's own list, as its error for an unknown name gives it.
    p = subprocess.run([TRAIN, "--model.name=no/such-model", "--plan"], capture_output=True, text=True)
    expect(p, 1, "is neither a preset")
    accepted = p.stderr.split("is neither a preset (", 1)[1].split(") nor", 1)[0].split(", ")
    if sorted(listed) != sorted(accepted):
        raise AssertionError(f"--help lists {listed}, the trainer accepts {accepted}")
    for name in listed:
        p = subprocess.run([TRAIN, f"--model.name={name}", "--plan", "--plan-gpu-memory=80", "--plan-host-memory=100"],
                           capture_output=True, text=True)
        expect(p, 0)
        if name not in p.stdout:
            raise AssertionError(f"--plan for {name} does not name it:\n{p.stdout[:500]}")
    # The model_type values a local directory may hold, against the loader's own list.
    types = help_text.split("(config.json's model_type: ", 1)[1].split(";", 1)[0].split(", ")
    os.makedirs(f"{work}/m")
    with open(f"{work}/m/config.json", "w") as f:
        json.dump({"model_type": "no_such_type"}, f)
    p = subprocess.run([TRAIN, f"--model.name={work}/m", "--plan"], capture_output=True, text=True)
    expect(p, 1, '"no_such_type" is not supported (')
    known = p.stderr.split('"no_such_type" is not supported (', 1)[1].split(" are)", 1)[0].split(", ")
    if sorted(types) != sorted(known):
        raise AssertionError(f"--help names model_type {types}, the loader reads {known}")


@case("a deferral of moment write-backs where none happen is a usage error naming the option and why")
def _(work):
    cfg = toml(work, 2)
    for args, needle in (
        (["--offload.deferred-share=0.5"], "clipping (optim.max_norm"),
        (["--offload.deferred-share=0.5", "--optim.max-norm=None", "--model.offload=full"], 'model.offload = "full"'),
        (["--offload.deferred-share=0.5", "--optim.max-norm=None", "--model.offload=optimizer"], "no GPU"),
    ):
        p = train(cfg, *args)
        expect(p, 2, needle)
        if "command line --offload.deferred-share" not in p.stderr:
            raise AssertionError(f"{args}: the error does not name the flag: {p.stderr}")
    # 0 asks for nothing: the run goes.
    expect(train(cfg, "--offload.deferred-share=0"), 0)


@case("a CUDA graph asked for where it cannot be is an error naming the option and why")
def _(work):
    p = train(toml(work, 2), "--cuda-graph")
    expect(p, 1, "cuda_graph = true")
    if "CUDA device" not in p.stderr:
        raise AssertionError(f"the error does not say why: {p.stderr}")
    # Off, on the CPU, is what runs anyway.
    expect(train(toml(work, 2), "--no-cuda-graph", "--clean"), 0)


@case("a machine profile given to a run that chooses no pipeline by it is a usage error naming it")
def _(work):
    cfg = toml(work, 2)
    p = train(cfg, f"--plan-profile={work}/my-machine.toml")
    expect(p, 2, "plan_profile")
    if "chooses none" not in p.stderr or "command line" not in p.stderr:
        raise AssertionError(f"the error does not say where and why: {p.stderr}")
    if os.path.exists(f"{work}/out/metrics.jsonl"):
        raise AssertionError("the refused run trained")
    # --calibrate writes a profile and reads none.
    p = subprocess.run([TRAIN, f"--calibrate={work}/c.toml", f"--plan-profile={work}/my-machine.toml"],
                       capture_output=True, text=True)
    expect(p, 2, "reads no profile")


@case("a GPU allocation record asked for on the CPU is an error naming the option, before the run starts")
def _(work):
    cfg = toml(work, 2)
    p = train(cfg, f"--profile.memory={work}/run.mem.pickle")
    expect(p, 1, "profile.memory")
    if "CUDA allocator" not in p.stderr:
        raise AssertionError(f"the error does not say why: {p.stderr}")
    if os.path.exists(f"{work}/run.mem.pickle") or os.path.exists(f"{work}/out/metrics.jsonl"):
        raise AssertionError("the refused run wrote files")


@case("a launcher's variables that are malformed or inconsistent are usage errors naming them")
def _(work):
    plan = [TRAIN, "--plan", "--plan-gpu-memory=80", "--plan-host-memory=100"]
    for env, needle in (
        (dict(WORLD_SIZE="2"), "RANK is not"),
        (dict(WORLD_SIZE="two", RANK="0"), "WORLD_SIZE=two"),
        (dict(WORLD_SIZE="2", RANK="2"), "RANK=2"),
        (dict(WORLD_SIZE="4", RANK="0", LOCAL_WORLD_SIZE="8"), "LOCAL_WORLD_SIZE=8"),
        (dict(WORLD_SIZE="2", RANK="0", MASTER_PORT="70000"), "MASTER_PORT=70000"),
        (dict(WORLD_SIZE="2", RANK="0", TORCHELASTIC_USE_AGENT_STORE="yes"), "TORCHELASTIC_USE_AGENT_STORE=yes"),
    ):
        p = subprocess.run(plan, capture_output=True, text=True, env=dict(os.environ, **env))
        expect(p, 2, needle)
    # A sharded-run option without a launcher is said to have no effect, not dropped.
    p = subprocess.run(plan + ["--dist.bucket-mib=4"], capture_output=True, text=True)
    expect(p, 0, "dist.bucket_mib has no effect in one process")
    # A plan of several ranks reads them: no such note there.
    p = subprocess.run(plan + ["--dist.bucket-mib=4", "--plan-world-size=2"], capture_output=True, text=True)
    expect(p, 0)
    if "has no effect" in p.stderr:
        raise AssertionError(f"--plan-world-size=2: {p.stderr}")
    # --plan under a launcher plans its world: 2 ranks here.
    p = subprocess.run(plan, capture_output=True, text=True, env=dict(os.environ, WORLD_SIZE="2", RANK="0"))
    expect(p, 0)
    if "Ranks: 2 (WORLD_SIZE)" not in p.stdout:
        raise AssertionError("--plan under WORLD_SIZE=2 does not plan 2 ranks:\n" + p.stdout[:600])


@case("a rendezvous port already in use is an error naming MASTER_PORT, at once, not a timeout")
def _(work):
    import socket

    with socket.socket() as held:
        held.bind(("", 0))
        held.listen()
        port = held.getsockname()[1]
        env = dict(os.environ, WORLD_SIZE="1", RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        # (A wait for the store's 3600 s timeout would end in subprocess's TimeoutExpired.)
        p = subprocess.run([TRAIN, "@", toml(work, 2), "--device=cpu"], capture_output=True, text=True, env=env, timeout=300)
        expect(p, 1, "cannot listen", f"127.0.0.1:{port}", "MASTER_PORT")


@case("a TrainerConfig's settings are all applied or refused by name")
def _(work):
    cfg = os.path.join(work, "trainer.toml")
    with open(cfg, "w") as f:
        f.write(f"""max_steps = 4
output_dir = {json.dumps(os.path.join(work, "out"))}
[model]
name = "primecfg/tiny"
attn = "sdpa"
compile = "None"
[data.fake]
seq_len = 16
batch_size = 2
micro_batch_size = 1
[ckpt]
interval = 2
""")
    expect(train(cfg), 0)
    # resume is read (it used to be dropped when the file was a TrainerConfig)
    with open(cfg, "a") as f:
        f.write("[resume]\nstep = 2\n")
    expect(train(cfg), 0, "moved to")
    with open(cfg, "a") as f:
        f.write("[loss]\ntype = \"ipo\"\n")
    expect(train(cfg), 1, "loss", "RL-trainer setting")


@case("a value the trainer accepts but does not apply gets a note naming it")
def _(work):
    cfg = toml(work, 1, extra="dist_timeout_seconds = 60")
    p = train(cfg, "--model.reshard-after-forward=false")
    expect(p, 0, "dist_timeout_seconds", "has no effect", "model.reshard_after_forward")


@case("prime-rl's newer settings are applied, refused by name, or noted")
def _(work):
    cfg = toml(work, 1)
    # Refused where set: each names its key, and nothing trains.
    for flags, needle in [
        (["--val.data.name=held-out"], "val: validation during training"),
        (["--run.name=exp"], "run.name"),
        (["--log.json-logging"], "log.json_logging"),
        (["--log.log-data"], "log.log_data"),
        (["--data.subsets=['a']", "--data.splits=['train']"], "data.subsets"),
        (["--data.probabilities=[1.0]"], "data.probabilities"),
        (["--monitors.file.path=elsewhere.jsonl"], "monitors.file.path"),
        (["--no-monitors.file"], "monitors.file"),
    ]:
        expect(train(cfg, *flags), 1, needle)
    assert not os.path.exists(os.path.join(work, "out", "metrics.jsonl"))
    # Accepted without effect: a note names each one; the default file sink is what runs.
    p = train(cfg, "--log.vf-level=debug", "--log.interval=1", "--log.ranks-filter=[0]", "--data.num-workers=2",
              "--data.stopping-strategy=first_exhausted", "--weight-broadcast.type=nccl",
              "--monitors.file.path=metrics.jsonl")
    expect(p, 0, "log.vf_level", "log.interval", "log.ranks_filter", "data.num_workers", "data.stopping_strategy",
           "weight_broadcast: has no effect")
    assert os.path.exists(os.path.join(work, "out", "metrics.jsonl"))
    # A TrainerConfig's fake data: a seed or generated samples are refused; the rollout transport is noted.
    fake = os.path.join(work, "trainer.toml")
    with open(fake, "w") as f:
        f.write(f"""max_steps = 1
output_dir = {json.dumps(os.path.join(work, "fake"))}
[model]
name = "primecfg/tiny"
attn = "sdpa"
compile = "None"
[data.fake]
seq_len = 16
batch_size = 2
[rollout_transport]
type = "filesystem"
""")
    expect(train(fake), 0, "rollout_transport: has no effect")
    expect(train(fake, "--data.fake.seed=3"), 1, "data.fake.seed")
    expect(train(fake, "--data.fake.generate-samples"), 1, "data.fake.generate_samples")


@case("a crash says so, with the stack, and the process still dies of its signal")
def _(work):
    import signal

    cfg = toml(work, 100000, ckpt="interval = 100000")
    p = subprocess.Popen([TRAIN, "@", cfg, "--device=cpu"], stderr=subprocess.PIPE, text=True, errors="replace")
    deadline = time.time() + 60
    metrics = os.path.join(work, "out", "metrics.jsonl")
    while not (os.path.exists(metrics) and os.path.getsize(metrics) > 0) and time.time() < deadline:
        time.sleep(0.1)
    p.send_signal(signal.SIGSEGV)
    err = p.communicate(timeout=60)[1]
    assert p.returncode == -signal.SIGSEGV, (p.returncode, err[-2000:])
    assert "primecfg-train: fatal: SIGSEGV" in err and "primecfg-train(" in err, err[-2000:]


shutil.rmtree(ROOT, ignore_errors=True)
print(f"{passed} passed, {len(failed)} failed")
sys.exit(1 if failed else 0)
