"""Are two `normkit compare` results directories the same numbers? For a refactor that must not change
results: every value of runs.jsonl, summary.json and summary.csv is compared exactly (floats by repr),
with the columns that measure the machine masked (seconds, CPU seconds, samples/s, peak MB, load average,
host, torch version).

    python benchmarks/same_numbers.py RESULTS_BEFORE RESULTS_AFTER      # exit 0: identical, 1: not

Used for the normkit-lab layout move (docs/lab-layout.md): `normkit compare --norms bn,bnn,gn+pn`
before and after gave identical files under this mask.
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path
from typing import Any

MASKED = frozenset({"epoch_time_s", "throughput", "peak_mem_mb", "time_per_epoch_s", "throughput_samples_s", "host",
                    "torch_version", "cpu_time_s", "cpu_time_per_epoch_s", "load_avg", "load_avg_max"})
FILES = ("runs.jsonl", "summary.json", "summary.csv")


def masked(value: Any) -> Any:
    """`value` with MASKED keys replaced at every depth and every scalar as its repr (exact comparison)."""
    if isinstance(value, dict):
        return {k: ("<masked>" if k in MASKED else masked(v)) for k, v in value.items()}
    if isinstance(value, list):
        return [masked(v) for v in value]
    return repr(value)


def records(path: Path) -> list[Any]:
    if path.suffix == ".jsonl":
        return [masked(json.loads(line)) for line in path.read_text().splitlines() if line.strip()]
    if path.suffix == ".csv":
        with path.open(newline="") as f:
            return [masked(row) for row in csv.DictReader(f)]
    loaded = json.loads(path.read_text())
    return masked(loaded if isinstance(loaded, list) else [loaded])


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: same_numbers.py RESULTS_BEFORE RESULTS_AFTER", file=sys.stderr)
        return 2
    before, after = (Path(a) for a in argv)
    differ = 0
    for name in FILES:
        a, b = records(before / name), records(after / name)
        if a == b:
            print(f"{name}: identical ({len(a)} records)")
            continue
        differ += 1
        first = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
        print(f"{name}: DIFFERENT ({len(a)} vs {len(b)} records, first difference at record {first})")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
