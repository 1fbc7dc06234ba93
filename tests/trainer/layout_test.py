"""The trainer's layering (docs/architecture.md), checked on its sources.

Each folder of reference_trainer/ may include only the folders listed for it, so that
the shared vocabulary at the bottom never includes what is built on it; no folder
includes the program and its loop (the top-level files); outside distributed/ nothing
names a parallelism's implementation (distributed/sharding.hpp picks it); outside the
offload folders and the planner nothing tests the offload mode; nothing calls
std::filesystem::remove_all (base/remove_tree.hpp says why), neither the trainer nor
its tests (tests/trainer/, linked with LibTorch as well).

Usage: layout_test.py SOURCE_ROOT
"""

import pathlib
import re
import sys

# What each folder may include, besides itself. "options.hpp" is the one top-level
# header below the loop: what the user asked for (TrainerOptions, RunOptions).
ALLOWED = {
    "base": set(),
    "model": {"base"},
    "data": {"base"},
    "nn": {"base", "model"},
    "optim": {"base", "model", "nn"},
    # The architectures: each one's block (models/<name>/), listed in models/blocks.cpp,
    # which defines nn/block.hpp's make_block; nothing includes models/ but models/.
    "models": {"base", "model", "nn"},
    "distributed": {"base", "model", "nn", "options.hpp"},
    # The mode's memory models (offload/<mode>/memory.cpp) speak the planner's terms.
    "offload": {"base", "model", "nn", "optim", "distributed", "planner", "options.hpp"},
    "checkpoint": {"base", "model", "nn", "optim", "distributed", "offload", "options.hpp"},
    # The planner owns the memory models' interface (planner/memory_model.hpp), which each
    # mode implements beside its pipeline: it never includes offload/, so no folder cycle.
    "planner": {"base", "model", "nn", "optim", "distributed", "options.hpp"},
}
# The program and its loop: included by main.cpp, trainer.cpp and the tests only.
TOP = {"trainer.hpp", "support.hpp", "command_line.hpp", "metrics.hpp"}

INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.M)
MODE_TEST = re.compile(r"[!=]=\s*Offload::|Offload::\w+\s*[!=]=")


def remove_all_calls(rel, text):
    if re.search(r"\bremove_all\s*\(", text):
        return [f"{rel}: calls std::filesystem::remove_all, which LibTorch's CUDA wheels interpose with a copy "
                "that crashes; use remove_tree (base/remove_tree.hpp)"]
    return []


def main() -> int:
    root = pathlib.Path(sys.argv[1]) / "reference_trainer"
    problems = []
    sources = [p for p in root.rglob("*") if p.suffix in {".hpp", ".cpp", ".cuh", ".cu"}]
    # The parallelisms' classes: what distributed/sharding.hpp picks as `Sharding`.
    picked = re.findall(r"\busing\s+Sharding\s*=\s*(\w+)\s*;", (root / "distributed" / "sharding.hpp").read_text())
    if not picked:
        problems.append("distributed/sharding.hpp: no `using Sharding = ...;` to read the parallelism from")
    parallelisms = re.compile(r"\b(" + "|".join(picked or ["(?!)"]) + r")\b")
    for path in sources:
        rel = path.relative_to(root)
        text = path.read_text()
        folder = rel.parts[0] if len(rel.parts) > 1 else None
        for inc in INCLUDE.findall(text):
            head = inc.split("/")[0]
            if folder is None:
                continue  # the program may include anything
            if inc in TOP:
                problems.append(f"{rel}: includes {inc}, the program's own header (only main.cpp, trainer.cpp and tests may)")
            elif "/" not in inc:
                # Same-folder includes of nn/kernels/ (plain CUDA) are relative.
                if not (path.parent / inc).exists() and inc != "options.hpp":
                    problems.append(f"{rel}: includes {inc}, which is not in its folder")
                elif inc == "options.hpp" and "options.hpp" not in ALLOWED[folder]:
                    problems.append(f"{rel}: includes options.hpp; {folder}/ sits below the options")
            elif head != folder and head not in ALLOWED.get(folder, set()):
                problems.append(f"{rel}: includes {inc}; {folder}/ may include only "
                                f"{', '.join(sorted(ALLOWED[folder])) or 'itself'}")
        if folder != "distributed" and parallelisms.search(text):
            problems.append(f"{rel}: names a parallelism's class; outside distributed/ the parallelism is `Sharding` (distributed/sharding.hpp)")
        if rel.as_posix() != "base/remove_tree.hpp":
            problems += remove_all_calls(rel, text)
        if folder not in {"offload", "planner"} and MODE_TEST.search(text):
            problems.append(f"{rel}: tests the offload mode; a mode's behaviour lives in offload/<mode>/ (and its memory model beside it)")
    tests = pathlib.Path(sys.argv[1]) / "tests" / "trainer"
    for path in sorted(tests.glob("*.cpp")):
        problems += remove_all_calls(path.relative_to(tests.parent.parent), path.read_text())
    for p in sorted(problems):
        print(p)
    if problems:
        print(f"{len(problems)} layering problem(s); docs/architecture.md says which folder may include which")
        return 1
    print(f"layout: {len(sources)} files, layering holds")
    return 0


if __name__ == "__main__":
    sys.exit(main())
