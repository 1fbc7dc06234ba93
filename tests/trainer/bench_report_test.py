"""bench/trainer/report.py on results written by hand: the numbers it derives.

run_gpu.sh calls report.py at the end of a GPU run that costs minutes of a rented machine;
a report that fails, or divides by the wrong bandwidth, loses that run. Here every figure
is computed by hand from the inputs below.

Usage: bench_report_test.py SOURCE_ROOT
"""

import json
import pathlib
import subprocess
import sys
import tempfile

GIB = 2**30


def metrics(folder, step_s, pipeline, steps=6):
    folder.mkdir(parents=True)
    with open(folder / "metrics.jsonl", "w") as f:
        for i in range(steps):
            # The first three steps are left out of the medians: make them slow.
            row = {"step_time_s": step_s * (3 if i < 3 else 1), "tokens_per_s": 8192 / step_s, "mfu": 0.5,
                   "peak_device_mem_gib": 20.0, "host_mem_gib": {"rss": 1.0}, "loss": 10.0 - i}
            if pipeline:
                row["pipeline"] = pipeline
            f.write(json.dumps(row) + "\n")


def main():
    root = pathlib.Path(sys.argv[1])
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        res = pathlib.Path(tmp) / "results"
        res.mkdir()
        metrics(res / "qwen0.6b-8k-none", 0.125, None)
        # optimizer: 24 GiB each way; 100 GB/s both ways at once -> 48 GiB / 100 GB/s.
        metrics(res / "qwen0.6b-8k-optimizer", 0.6, {"d2h_gib": 24.0, "h2d_gib": 24.0})
        # full: bound by the CPU update (0.5 s), PCIe one way at 50 GB/s: 6 GiB -> 0.129 s.
        metrics(res / "qwen0.6b-8k-full", 0.55,
                {"d2h_gib": 6.0, "h2d_gib": 5.0, "cpu_update_s": 0.5, "cpu_threads": 15, "copy_wait_s": 0.01,
                 "drain_s": 0.02})
        peer = {"gpu": "Test GPU", "torch": "2.x", "step_time_s": 0.123, "tokens_per_s": 8192 / 0.123, "mfu": 0.6,
                "peak_device_mem_gib": 22.0, "host_rss_gib": 2.0, "first_step_s": 30.0,
                "pcie_h2d_gbs": 55.0, "pcie_d2h_gbs": 50.0, "pcie_duplex_gbs": 100.0}
        (res / "qwen0.6b-8k-compile.json").write_text(json.dumps(peer) + "\n")
        out = pathlib.Path(tmp) / "performance.md"
        out.write_text("# Performance\n\nintro\n\n## Older section\n\nkept\n")
        run = subprocess.run([sys.executable, str(root / "bench/trainer/report.py"), str(res), str(out),
                              "--commit", "abc1234", "--date", "2026-12-04 04:00 UTC"],
                             capture_output=True, text=True)
        if run.returncode != 0:
            print(run.stdout, run.stderr)
            sys.exit("report.py failed")
        text = out.read_text()

        def expect(what, line):
            if line not in text:
                failures.append(f"{what}: no line\n  {line}")

        opt_pcie = 48 * GIB / 100e9
        expect("optimizer against the duplex bound",
               f"| Qwen/Qwen3-0.6B | 8192 | 0.600 | 0.125 | {opt_pcie:.3f} | {opt_pcie:.3f} | "
               f"{0.6 / opt_pcie:.2f} |")
        full_pcie = 6 * GIB / 50e9
        expect("full against the CPU update",
               f"| Qwen/Qwen3-0.6B | 8192 | 0.550 | 0.125 | {full_pcie:.3f} | 0.500 | 0.500 | 1.10 | 15 | 0.010 | "
               f"0.020 |")
        expect("PCIe figures", "host->device 55.0 GB/s, device->host 50.0 GB/s, both at once 100.0 GB/s")
        expect("the new section first", "intro\n\n## Full benchmark run: 2026-12-04 04:00 UTC, commit `abc1234`")
        expect("the old section kept", "## Older section\n\nkept\n")
        expect("none against torch.compile", f"`none` tokens/s = {0.123 / 0.125:.2f}x torch.compile")
    for f in failures:
        print("FAIL", f)
    if failures:
        sys.exit(1)
    print("ok: report.py's tables, bounds and placement")


if __name__ == "__main__":
    main()
