"""The device mesh and the token exchange on Gloo CPU ranks, against prime-rl's layout
and torch.distributed.

For each world below, torchrun starts exchange_rank (tests/trainer/exchange_rank.cpp)
on every rank; each writes which ranks its groups reached and what its all-to-alls
gave. This test checks:

- the groups: every dimension's group, found through that group's own backend, is
  the one prime-rl's mesh has (`parallel_dims.py`: world mesh (dp_replicate,
  dp_shard_mod_ep, dp_shard_in_ep, cp), row-major; ep = dp_shard_in_ep x cp; experts
  sharded over dp_shard_mod_ep), built here with numpy from the degrees alone;
- the exchange: the counts each rank learned are what the others send it, and the
  rows received and the gradient that came back are, bit for bit, what
  torch.distributed's all_to_all_single_autograd (the differentiable all-to-all that
  torchtitan's expert parallelism uses) gives on the same inputs and groups.

usage: exchange_test.py EXCHANGE_RANK
"""

import os
import socket
import subprocess
import sys
import tempfile

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed._functional_collectives import all_to_all_single_autograd
import torch.multiprocessing as mp
from safetensors.torch import load_file

RANK_BIN = sys.argv[1]
DIMS = ["world", "dp_replicate", "dp_shard_cp", "cp", "ep", "dp_shard_mod_ep"]
EXCHANGED = ["ep", "world"]


def mesh_groups(world, dp_replicate, ep, cp=1):
    """Every rank's group along each dimension, from prime-rl's mesh layout."""
    dp_shard = world // (dp_replicate * cp)
    in_ep, mod_ep = ep // cp, dp_shard * cp // ep
    grid = np.arange(world).reshape(dp_replicate, mod_ep, in_ep, cp)
    # Which axes of the grid each dimension spans.
    spans = {"world": (0, 1, 2, 3), "dp_replicate": (0,), "dp_shard_cp": (1, 2, 3), "cp": (3,),
             "ep": (2, 3), "dp_shard_mod_ep": (1,)}
    out = {}
    for name, axes in spans.items():
        rest = [a for a in range(4) if a not in axes]
        moved = np.transpose(grid, rest + list(axes)).reshape(-1, int(np.prod([grid.shape[a] for a in axes])))
        out[name] = [list(map(int, g)) for g in moved]
    return out


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def reference(rank, world, port, groups, ranks, results):
    """torch.distributed on Gloo: the same exchanges, on the inputs exchange_rank drew."""
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        handles = {}
        for name in EXCHANGED:  # every rank creates every group, in the same order
            for g in groups[name]:
                pg = dist.new_group(g) if len(g) < world else dist.group.WORLD
                if rank in g:
                    handles[name] = (pg, g)
        got = {}
        for name in EXCHANGED:
            pg, g = handles[name]
            r = ranks[rank]
            x = r[f"{name}.x"].clone().requires_grad_(True)
            y = all_to_all_single_autograd(x, r[f"{name}.recv"].tolist(), r[f"{name}.send"].tolist(), pg)
            y = torch.ops._c10d_functional.wait_tensor(y)
            (y * r[f"{name}.g"]).sum().backward()
            got[name] = (y.detach(), x.grad)
        results[rank] = got
    finally:
        dist.destroy_process_group()


def check(world, dp_replicate, ep):
    what = f"world {world}, dp_replicate {dp_replicate}, ep {ep}"
    with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR")) as out:
        p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                            f"--nproc-per-node={world}", "--no-python", RANK_BIN, out, str(dp_replicate), str(ep)],
                           capture_output=True, text=True, timeout=300, env={**os.environ, "TMPDIR": out})
        if p.returncode != 0:
            raise AssertionError(f"{what}: exchange_rank failed\n{p.stderr[-3000:]}")
        ranks = [load_file(os.path.join(out, f"rank{r}.safetensors")) for r in range(world)]
    groups = mesh_groups(world, dp_replicate, ep)
    for r in range(world):
        for name in DIMS:
            reached = [i for i, v in enumerate(ranks[r][f"group.{name}"].tolist()) if v == 1.0]
            want = next(g for g in groups[name] if r in g)
            if reached != sorted(want):
                raise AssertionError(f"{what}: rank {r}'s {name} group reached {reached}, prime-rl's mesh has {want}")
    for name in EXCHANGED:
        for r in range(world):
            g = next(g for g in groups[name] if r in g)
            sent_here = [int(ranks[j][f"{name}.send"][g.index(r)]) for j in g]
            if ranks[r][f"{name}.recv"].tolist() != sent_here:
                raise AssertionError(f"{what}: rank {r} learned {ranks[r][f'{name}.recv'].tolist()} rows over {name}, "
                                     f"the members send it {sent_here}")
    with mp.Manager() as m:
        results = m.dict()
        mp.spawn(reference, args=(world, free_port(), groups, ranks, results), nprocs=world, join=True)
        results = dict(results)
    for r in range(world):
        for name in EXCHANGED:
            y, dx = results[r][name]
            for label, ours, ref in (("rows", ranks[r][f"{name}.y"], y), ("gradient", ranks[r][f"{name}.dx"], dx)):
                if ours.shape != ref.shape or not torch.equal(ours, ref):
                    raise AssertionError(f"{what}: rank {r}'s {label} over {name} differ from torch.distributed's:\n"
                                         f"{ours}\n{ref}")
    print(f"ok: {what}")


def main():
    torch.set_num_threads(1)
    # Dense (ep 1), experts over pairs of ranks (sharded again over the other pair),
    # over all four, and inside each of two replicas.
    for world, dp_replicate, ep in ((4, 1, 1), (4, 1, 2), (4, 1, 4), (4, 2, 2)):
        check(world, dp_replicate, ep)


if __name__ == "__main__":
    main()
