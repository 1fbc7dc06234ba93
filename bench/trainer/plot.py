#!/usr/bin/env python3
"""Plots of the trainer benchmark, drawn from the tables in docs/performance.md.

    python3 bench/trainer/plot.py [docs/performance.md] [--out docs/img]

Writes trainer-throughput.png (tokens/s per run and shape, PyTorch eager = 1),
trainer-memory.png (peak GPU memory and host RSS per run and shape) and
planner.png (the planner's predicted peak against the measured one). Needs matplotlib.
The tables are the source of truth; the plots only draw them.
"""
import argparse
import os
import re

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def section(text, title):
    start = text.index(title)
    end = text.find("\n## ", start + 1)
    return text[start:end if end != -1 else len(text)]


def first_table(text):
    """The first markdown table of a section (a section may hold several)."""
    lines = text.splitlines()
    start = next(i for i, l in enumerate(lines) if l.startswith("| "))
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    return "\n".join(lines[start:end])


def table_rows(text):
    rows = []
    for line in text.splitlines():
        if not line.startswith("| ") or line.startswith("| ---") or line.startswith("| model"):
            continue
        rows.append([c.strip() for c in line.strip().strip("|").split("|")])
    return rows


def number(cell):
    m = re.search(r"-?[0-9]+(\.[0-9]+)?", cell.replace("*", ""))
    return float(m.group(0)) if m else None


def throughput_and_memory(rows, out):
    shapes = []
    data = {}
    for r in rows:
        model, seq, run = r[0], r[1], r[2].replace("primecfg ", "").replace("`", "")
        run = re.sub(r"\s*\(.*\)$", "", run)  # "PyTorch eager (next call)": a note on the row
        run = {"torch.compile": "PyTorch compile"}.get(run, run)  # report.py's name for it
        shape = f"{model.split('/')[-1]} @ {seq}"
        if shape not in shapes:
            shapes.append(shape)
        # A run listed twice (e.g. again beside a peer): the later figures win, blanks keep
        # the earlier ones.
        row = {"tps": number(r[4]), "gpu": number(r[6]), "rss": number(r[7])}
        old = data.setdefault((shape, run), {})
        old.update({k: v for k, v in row.items() if v is not None or k not in old})
    runs = ["none", "optimizer", "full", "PyTorch eager", "PyTorch compile", "HF transformers",
            "HF transformers + Liger"]
    fig, ax = plt.subplots(figsize=(10, 4))
    width = 0.12
    for k, run in enumerate(runs):
        xs, ys = [], []
        for i, shape in enumerate(shapes):
            eager = data.get((shape, "PyTorch eager"), {}).get("tps")
            v = data.get((shape, run), {}).get("tps")
            if eager and v:
                xs.append(i + (k - (len(runs) - 1) / 2) * width)
                ys.append(v / eager)
        ax.bar(xs, ys, width, label=run)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(shapes)), shapes)
    ax.set_ylabel("tokens/s relative to PyTorch eager")
    ax.set_title("primecfg-train per offload mode, NVIDIA H200 (docs/performance.md)")
    ax.legend(fontsize=8, ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.1))
    fig.tight_layout()
    fig.savefig(os.path.join(out, "trainer-throughput.png"), dpi=120)

    fig, ax = plt.subplots(figsize=(9, 4))
    for k, run in enumerate(runs[:4]):
        xs = [i + (k - 1.5) * 0.2 for i in range(len(shapes))]
        gpu = [data.get((s, run), {}).get("gpu") or 0 for s in shapes]
        rss = [data.get((s, run), {}).get("rss") or 0 for s in shapes]
        bars = ax.bar(xs, gpu, 0.2, label=f"{run}: peak GPU")
        ax.bar(xs, rss, 0.2, bottom=gpu, alpha=0.35, color=bars.patches[0].get_facecolor(),
               label=f"{run}: host RSS")
    ax.set_xticks(range(len(shapes)), shapes)
    ax.set_ylabel("GiB")
    ax.set_title("Peak GPU memory (solid) and host RSS (light) per run")
    ax.legend(fontsize=7, ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.1))
    fig.tight_layout()
    fig.savefig(os.path.join(out, "trainer-memory.png"), dpi=120)


def planner(text, out):
    points = []
    for r in table_rows(section(text, "### The largest model per mode")):
        predicted, measured = number(r[5]), number(r[6]) if r[6] else None
        if predicted and measured:
            points.append((predicted, measured, f"{r[0].split('/')[-1]} {r[2].strip('`')}{' ac' if r[3] == 'on' else ''}"))
    fig, ax = plt.subplots(figsize=(5, 5))
    top = max(max(p, m) for p, m, _ in points) * 1.1
    ax.plot([0, top], [0, top], color="gray", linewidth=0.8)
    ax.fill_between([0, top], [0, top * 0.9], [0, top * 1.1], color="gray", alpha=0.15, label="within 10%")
    for p, m, label in points:
        ax.scatter([p], [m])
        ax.annotate(label, (p, m), fontsize=7, xytext=(4, -10), textcoords="offset points")
    ax.set_xlabel("planner: predicted peak allocated (GiB)")
    ax.set_ylabel("measured peak allocated (GiB)")
    ax.set_title("Memory planner against real runs")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "planner.png"), dpi=120)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("doc", nargs="?", default="docs/performance.md")
    ap.add_argument("--out", default="docs/img")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    text = open(a.doc).read()
    # The newest full run: report.py puts it first in docs/performance.md ("## Full
    # benchmark run", older ones "## Latest run"), or its page for one run ("## Trainer:").
    marks = [m for m in ("## Full benchmark run", "## Latest run", "## Trainer:") if m in text]
    latest = min(marks, key=text.index)
    throughput_and_memory(table_rows(first_table(section(text, latest))), a.out)
    wrote = ["trainer-throughput.png", "trainer-memory.png"]
    if "### The largest model per mode" in text:
        planner(text, a.out)
        wrote.append("planner.png")
    print(f"wrote {', '.join(wrote)} in {a.out}")


if __name__ == "__main__":
    main()
