"""Wall time of two `run` calls of the Ray executor (one digits run each): each starting its own local Ray
instance, or both inside one `session()` (as a comparison's looks and a suite's rounds are).

    .venv/bin/python benchmarks/bench_ray_session.py separate
    .venv/bin/python benchmarks/bench_ray_session.py session

Needs normkit-lab[ray]. Run the two modes alternately: the difference is the cost of one more start of the
instance and its workers (each imports torch).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import tempfile
import time
from pathlib import Path

from normkit_lab.executors import ExecutorOptions
from normkit_lab.executors.ray import RayExecutor
from normkit_lab.runs.execute import Job
from normkit_lab.study.compare import check, create_store
from normkit_lab.study.config import build_config
from normkit_lab.study.plan import compare_plan


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=["separate", "session"])
    args = parser.parse_args()
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    cfg = build_config({"dataset": "digits", "norms": "bn,gn", "seeds": 1, "epochs": 1, "batch_size": 128})
    check(cfg)
    with tempfile.TemporaryDirectory() as tmp:
        store = create_store(cfg, Path(tmp) / "out")
        jobs = [Job.make(cfg, item, store) for item in compare_plan(cfg)]
        executor = RayExecutor(ExecutorOptions(kind="ray"))
        start = time.perf_counter()
        with executor.session() if args.mode == "session" else contextlib.nullcontext():
            for job in jobs:
                executor.run([job], lambda kind, value: None)
        elapsed = time.perf_counter() - start
    print(f"{args.mode}: {elapsed:.1f} s of wall time for two run calls, load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
