#!/usr/bin/env python3
"""The JSON Schemas: checked in and current, and in agreement with primecfg.

1. `primecfg schema --as X` must equal schemas/X.schema.json (run
   `ninja -C build schemas` after changing a config struct).
2. check-jsonschema, an independent draft-07 validator, must reach the same
   verdict as `primecfg validate` on the corpus and on tests/lib/schema_cases,
   except for the rules a schema cannot express (listed below), which only
   primecfg catches.
"""
import pathlib
import shutil
import subprocess
import sys

primecfg, root = sys.argv[1], pathlib.Path(sys.argv[2])
schemas = root / "schemas"
failures = []

for kind in ("sft", "trainer", "rl"):
    generated = subprocess.run([primecfg, "schema", "--as", kind], capture_output=True, text=True, check=True).stdout
    checked_in = schemas / f"{kind}.schema.json"
    if not checked_in.exists() or checked_in.read_text() != generated:
        failures.append(f"{checked_in} is stale: run `ninja -C build schemas` and commit the result")

checker = shutil.which("check-jsonschema")
if checker is None:
    sys.exit("check-jsonschema is not installed (tools/bootstrap.sh installs it)")

# Cross-field rules that only code can check.
primecfg_only = {"sft_batch_not_divisible.toml"}

corpus = root / "tests/corpus/prime-rl-configs"
cases = []  # (file, root type)
targets = {"s": "sft", "t": "trainer", "r": "rl"}
for line in (corpus / "SOURCES.md").read_text().splitlines():
    cells = [c.strip() for c in line.split("|")]
    if len(cells) > 4 and cells[1] in ("559b44772", "9975d8868") and cells[2].endswith(".toml"):
        target = cells[3].split()[0]
        kind = {"SFTConfig": "sft", "TrainerConfig": "trainer", "RLConfig": "rl"}.get(target)
        if kind:
            cases.append((corpus / cells[1] / cells[2], kind))
for case in sorted((root / "tests/lib/schema_cases").glob("*.toml")):
    cases.append((case, case.name.split("_")[0]))

checked = 0
for path, kind in cases:
    ours = subprocess.run([primecfg, "validate", "--as", kind, str(path)], capture_output=True, text=True)
    theirs = subprocess.run([checker, "--schemafile", str(schemas / f"{kind}.schema.json"), str(path)],
                            capture_output=True, text=True)
    if ours.returncode not in (0, 1):
        failures.append(f"{path}: primecfg exit {ours.returncode}: {ours.stderr}")
        continue
    ours_valid, theirs_valid = ours.returncode == 0, theirs.returncode == 0
    checked += 1
    if path.name in primecfg_only:
        if ours_valid or not theirs_valid:
            failures.append(f"{path}: expected primecfg to reject and the schema to accept")
    elif ours_valid != theirs_valid:
        failures.append(f"{path} ({kind}): primecfg says {'valid' if ours_valid else 'invalid'}, "
                        f"check-jsonschema says {'valid' if theirs_valid else 'invalid'}\n{ours.stderr}{theirs.stdout}")

for f in failures:
    print("FAIL:", f)
print(f"{checked} files compared")
sys.exit(1 if failures else 0)
