"""Wall time of the commands that train nothing: `normkit list`, `show bnn`, `plugins`, `--help`.

    .venv/bin/python benchmarks/bench_cli_startup.py              # 7 runs each, median
    .venv/bin/python benchmarks/bench_cli_startup.py --runs 11

Each command runs as a fresh process (`normkit ...` next to this Python), output discarded. Two
columns: "cached", the usual case, where the plugin catalog (normkit_cli/catalog_cache.py) is
current (one untimed run fills it first), and "cold", with NORMKIT_NO_CATALOG_CACHE=1, what every
command cost before the catalog and what the first command after a plugin changes still costs. The
catalog lives in a temporary NORMKIT_CACHE_DIR, so the user's own is left alone. Target: under 1 s
cached on the 2-core development machine (docs/performance.md).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

NORMKIT = str(Path(sys.executable).with_name("normkit"))
COMMANDS = [["list"], ["show", "bnn"], ["plugins"], ["--help"]]
TARGET_S = 1.0


def _time(argv: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run([NORMKIT, *argv], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7, help="runs per command and column (median shown)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as cache:
        cached = {**os.environ, "NORMKIT_CACHE_DIR": cache}
        cached.pop("NORMKIT_NO_CATALOG_CACHE", None)
        cold = {**cached, "NORMKIT_NO_CATALOG_CACHE": "1"}
        _time(["list"], cached)  # fills the catalog
        print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}; median of {args.runs} runs")
        print(f"{'command':<18}{'cached (s)':>12}{'cold (s)':>10}  target")
        for argv in COMMANDS:
            warm = statistics.median(_time(argv, cached) for _ in range(args.runs))
            slow = statistics.median(_time(argv, cold) for _ in range(args.runs))
            verdict = "ok" if warm < TARGET_S else "MISSED"
            print(f"{'normkit ' + ' '.join(argv):<18}{warm:>12.2f}{slow:>10.2f}  < {TARGET_S:g} s {verdict}")


if __name__ == "__main__":
    main()
