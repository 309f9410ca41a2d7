"""CPU time of the language-model reference tables on `pysrc`: the add-k tables and the Kneser-Ney 5-gram.

    .venv/bin/python benchmarks/bench_lm_baselines.py             # 3 runs, median
    .venv/bin/python benchmarks/bench_lm_baselines.py --runs 5

Every language-model comparison fits them once per process on the whole train split (25 MB of
the standard library's source with Python 3.11), so they must cost seconds, not minutes. Reads the
corpus once (untimed), then times the 5-gram's counting alone and `ngram_baselines` whole (every
table, scored on gpt-tiny's test windows: 512 windows of 32 bytes), in process CPU time. Target:
under 10 s of CPU for every table (docs/experiments.md, "Reference tables").
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import time

from normkit_lab.lm_baselines import ngram_baselines
from normkit_lab.lm_kneser_ney import KneserNey

SEQ_LEN, EVAL_WINDOWS, TEST_WINDOWS = 32, 128, 512
TARGET_S = 10.0
text_data = importlib.import_module("normkit_lab.datasets.text")  # the package also exports a function `text`


def _cpu(fn) -> float:
    start = time.process_time()
    fn()
    return time.process_time() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="runs of each (median shown)")
    args = parser.parse_args()
    root = text_data.stdlib_root()
    corpus = text_data.Corpus()
    for path in text_data.stdlib_files(root):
        rel = path.relative_to(root).as_posix()
        corpus.add(rel, path.read_bytes(), text_data.split_of(text_data.name_index(rel)))
    streams = corpus.streams()
    val = text_data.ByteWindows(streams["val"], SEQ_LEN, EVAL_WINDOWS)
    test = text_data.ByteWindows(streams["test"], SEQ_LEN, TEST_WINDOWS)
    fit = [_cpu(lambda: KneserNey(streams["train"].numpy(), 5)) for _ in range(args.runs)]
    every: list[float] = []
    for _ in range(args.runs):
        every.append(_cpu(lambda: ngram_baselines(streams["train"], streams["val"], val.starts, streams["test"],
                                                  test.starts, SEQ_LEN)))
    total = statistics.median(every)
    print(f"train split {len(streams['train']) / 1e6:.1f} MB: 5-gram counting {statistics.median(fit):.2f} s of CPU, "
          f"every table {total:.2f} s (target under {TARGET_S:.0f} s: {'met' if total < TARGET_S else 'MISSED'})")


if __name__ == "__main__":
    main()
