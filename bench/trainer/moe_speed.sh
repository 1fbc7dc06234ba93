#!/usr/bin/env bash
# Qwen3-MoE measured (issue 48 item 6) on the GPU machine, from the repository root:
#
#   bash bench/trainer/moe_speed.sh
#
# Qwen3-30B-A3B cut to its first LAYERS blocks (model.debug.num_layers: the same block
# shape, random init, bench/trainer/fake.toml's run) at SEQ tokens:
#   1. --calibrate times this model's routed block on this GPU, so that --plan predicts
#      the step from a measured MoE block (skipped where PLAN_PROFILE names a profile);
#   2. confirm_planner.sh trains it in `none`, `none` with the routed experts recomputed
#      (selective AC), `optimizer` and `full`: each row's peak GPU memory and step time
#      against --plan's prediction;
#   3. the PyTorch peer (torch_peer.py: the same routing, torch._grouped_mm experts),
#      eager and with torch.compile.
# Then one table: step, tokens/s, MFU (active parameters and the LM head, as both count
# them) and peak memory, ours in `none` against the compiled peer (target: 1.1x its
# tokens/s) and MFU against twice prime-rl's published 16.6% for this model.
# Everything lands in $RES, tarred as $OUT/moe-speed.tgz where OUT is set.
#
# Environment: LAYERS (4), SEQ (8192), STEPS (10), PLAN_PROFILE, PEERS ("eager compile"; empty:
#              no peer, e.g. where profile_gpu.sh timed it in the same call), PY, PRIMECFG_BIN,
#              RESULTS as in gpu_env.sh.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
RES=${RESULTS:-$ROOT/outputs/moe-speed}
LAYERS=${LAYERS:-4}
SEQ=${SEQ:-8192}
STEPS=${STEPS:-10}
MODEL=Qwen/Qwen3-30B-A3B
mkdir -p "$RES"
source bench/trainer/gpu_env.sh
export PRIMECFG_BIN=$BIN PY
echo "== GPU: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"

CUT=--model.debug.num-layers=$LAYERS
if [ -z "${PLAN_PROFILE:-}" ]; then
  t0=$(date +%s)
  timeout 300 "$TRAIN" @ bench/trainer/fake.toml --model.name=$MODEL $CUT --data.seq-len="$SEQ" \
    --calibrate="$RES/profile.toml" >"$RES/calibrate.log" 2>&1 || { tail -20 "$RES/calibrate.log"; exit 1; }
  echo "calibrate: $(($(date +%s) - t0)) s"
  export PLAN_PROFILE=$RES/profile.toml
fi

RESULTS=$RES/ours STEPS=$STEPS BUDGET_S=${BUDGET_S:-420} \
  ROWS="$MODEL:$SEQ:none:noac:$CUT $MODEL:$SEQ:none:selective:$CUT $MODEL:$SEQ:optimizer:noac:$CUT
        $MODEL:$SEQ:full:noac:$CUT" OUT= bash bench/trainer/confirm_planner.sh

for peer in ${PEERS-eager compile}; do
  flag=()
  [ $peer = compile ] && flag=(--compile)
  timeout 300 "$PY" bench/trainer/torch_peer.py --model $MODEL --layers "$LAYERS" --seq-len "$SEQ" \
    --steps 5 --warmup 3 "${flag[@]}" >"$RES/peer-$peer.log" 2>&1
  echo "peer $peer: rc=$?"
done

"$PY" - "$RES" "$SEQ" <<'EOF'
import glob, json, os, statistics, sys
res, seq = sys.argv[1], int(sys.argv[2])
rows = {}
for m in sorted(glob.glob(os.path.join(res, "ours", "*", "metrics.jsonl"))):
    r = [json.loads(l) for l in open(m) if l.strip().startswith("{")]
    if not r:
        continue
    name = os.path.basename(os.path.dirname(m))
    mode = next(x for x in ("none", "optimizer", "full") if f"{seq}{x}" in name)
    if "selective" in name:
        mode += " (selective AC)"
    later = [x for x in r[3:]] or r
    t = statistics.median(x["step_time_s"] for x in later)
    mfu = statistics.median(x["mfu"] for x in later if x.get("mfu") is not None)
    rows[f"ours {mode}"] = (t, mfu, max(x["peak_device_mem_gib"] for x in r))
for peer in ("eager", "compile"):
    p = os.path.join(res, f"peer-{peer}.log")
    lines = [l for l in open(p) if l.startswith("{")] if os.path.exists(p) else []
    if lines:
        j = json.loads(lines[-1])
        rows[f"peer {peer}"] = (j["step_time_s"], j["mfu"], j["peak_device_mem_gib"])
print(f"{'row':<28} {'step (s)':>9} {'tokens/s':>9} {'MFU':>7} {'peak GiB':>9}")
for name, (t, mfu, peak) in rows.items():
    print(f"{name:<28} {t:>9.4f} {seq / t:>9.0f} {100 * mfu:>6.1f}% {peak:>9.2f}")
ours, peer = rows.get("ours none"), rows.get("peer compile")
if ours and peer:
    print(f"ours none: {peer[0] / ours[0]:.3f}x the compiled peer's tokens/s (target 1.1x)")
if ours:
    print(f"ours none: MFU {100 * ours[1]:.1f}% (target 33.2%, twice prime-rl's 16.6% at 16,384 tokens)")
EOF
cat "$RES/ours/table.md" 2>/dev/null
[ -n "${OUT:-}" ] && tar czf "$OUT/moe-speed.tgz" --exclude=checkpoints -C "$(dirname "$RES")" "$(basename "$RES")"
exit 0
