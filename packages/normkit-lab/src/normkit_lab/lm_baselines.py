"""Byte n-gram reference points for language-model results: what a unigram and a bigram table score.

A bits-per-byte number means little alone: 3.2 bits/byte is poor for English prose and good for a
tiny model on source code. Two tables fitted on the train split and scored on exactly the test
windows the models are scored on say what the model has learned beyond byte frequencies (unigram)
and beyond "which byte follows which" (bigram):

    unigram  p(y) = (count(y) + 1) / (N + 256)                    (add-one smoothing)
    bigram   p(y | x) = (count(x, y) + 1) / (count(x) + 256)       x = the previous byte

Each test target y is scored with its own previous byte x (the window's input at that position),
so the tables see exactly the bytes the model is scored on. The numbers go into the dataset's
metadata (`baselines`, saved with every run in runs.jsonl) and from there into summary.json, the
printed notes and report.html.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

VOCAB = 256
FIT, SCORED = "train split", "test windows"


def _windows(stream: Tensor, starts: Tensor, seq_len: int) -> tuple[Tensor, Tensor]:
    index = starts.long()[:, None] + torch.arange(seq_len + 1)[None, :]
    w = stream.long()[index]
    return w[:, :-1].reshape(-1), w[:, 1:].reshape(-1)


def ngram_baselines(train: Tensor, test: Tensor, starts: Tensor, seq_len: int) -> dict[str, Any]:
    """Unigram and bigram bits per byte: tables fitted on the `train` byte stream (add-one smoothed),
    scored on the targets of the test windows (`test[s+1 : s+seq_len+1]` for each start s)."""
    x, y = _windows(test, starts, seq_len)
    stream = train.long()
    uni = torch.bincount(stream, minlength=VOCAB).double() + 1.0
    uni_logp = torch.log2(uni / uni.sum())
    pairs = torch.bincount(stream[:-1] * VOCAB + stream[1:], minlength=VOCAB * VOCAB).double().view(VOCAB, VOCAB)
    bi = pairs + 1.0
    bi_logp = torch.log2(bi / bi.sum(dim=1, keepdim=True))
    return {"unigram_bpb": round(float(-uni_logp[y].mean()), 4), "bigram_bpb": round(float(-bi_logp[x, y].mean()), 4),
            "fit": FIT, "scored": SCORED, "smoothing": "add-one", "targets": int(y.numel())}


def baselines_of(rows: Iterable[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The baselines recorded with the runs (runs.jsonl rows or RunResult extras); None when none is."""
    for row in rows:
        extras = row.get("extras") if isinstance(row, Mapping) else getattr(row, "extras", None)
        found = ((extras or {}).get("dataset") or {}).get("baselines")
        if isinstance(found, dict) and _finite(found.get("bigram_bpb")) and _finite(found.get("unigram_bpb")):
            return dict(found)
    return None


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def below_bigram(values: Mapping[int, float], baselines: Mapping[str, Any]) -> int:
    """How many of the runs' values (bits per byte, by seed) are below the bigram table's."""
    return sum(v < baselines["bigram_bpb"] for v in values.values())


def note(baselines: Mapping[str, Any], rows: Sequence[Any], unit: str) -> str | None:
    """One line for the printed notes and report.html; None unless the metric is in bits per byte."""
    if unit != "bits/byte":
        return None
    runs = sum(len(r.values) for r in rows)
    below = sum(below_bigram(r.values, baselines) for r in rows)
    return (f"reference tables fitted on the {baselines['fit']} and scored on the same {baselines['scored']}: "
            f"unigram {baselines['unigram_bpb']:.2f}, bigram {baselines['bigram_bpb']:.2f} bits/byte; "
            f"{below} of {runs} finished runs end below the bigram")


def row_fields(baselines: Mapping[str, Any] | None, values: Mapping[int, float]) -> dict[str, Any]:
    """The summary.json keys a row gets: the two tables' scores and its seeds below the bigram."""
    if baselines is None:
        return {"unigram_bpb": None, "bigram_bpb": None, "seeds_below_bigram": None}
    return {"unigram_bpb": baselines["unigram_bpb"], "bigram_bpb": baselines["bigram_bpb"],
            "seeds_below_bigram": below_bigram(values, baselines)}
