"""Byte n-gram reference points for language-model results: add-k tables and a Kneser-Ney 5-gram.

A bits-per-byte number means little alone: 3.2 bits/byte is poor for English prose and good for a
tiny model on source code. Three tables fitted on the train split and scored on exactly the test
windows the models are scored on say what the model has learned beyond byte frequencies (unigram),
beyond "which byte follows which" (bigram) and beyond "which byte follows which two" (trigram):

    p(y | h) = (count(h, y) + k) / (count(h) + 256 k)      h = the n - 1 previous bytes (add-k)

Each table's k is tuned on the validation windows (the value of K_GRID with the lowest validation
bits per byte, as a model's hyperparameters are) and the test windows are scored with that k. Add-k
is a weak bar beyond the trigram, so a 5-gram smoothed by interpolated Kneser-Ney (lm_kneser_ney:
nothing to tune, its discounts come from the counts) is scored on the same windows: the strong
count-based reference, four bytes of context. Each target is scored with the bytes the model saw
before it in its window: at a window's first position the model has seen one byte, so the trigram
table falls back to its bigram there and the 5-gram to the (k + 1)-gram of the k bytes seen. The
numbers go into the dataset's metadata (`baselines`, saved with every run in runs.jsonl) and from
there into summary.json, the printed notes and report.html.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from normkit_lab.lm_kneser_ney import KneserNey

VOCAB = 256
ORDERS = {"unigram": 1, "bigram": 2, "trigram": 3}
K_GRID = (0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1.0)
FIT, SCORED, TUNED = "train split", "test windows", "validation windows"
REFERENCE = "trigram"  # the strongest add-k table
STRONG, STRONG_ORDER, STRONG_SMOOTHING = "5-gram", 5, "interpolated Kneser-Ney"  # the strong bar, beside them


def _windows(stream: Tensor, starts: Tensor, seq_len: int) -> tuple[Tensor, Tensor, Tensor]:
    """(previous input byte, input byte, target) at every position of every window; the previous
    byte is -1 at a window's first position (the model has not seen one there)."""
    index = starts.long()[:, None] + torch.arange(seq_len + 1)[None, :]
    w = stream.long()[index]
    prev = torch.cat([torch.full((w.shape[0], 1), -1, dtype=torch.long), w[:, :-2]], dim=1)
    return prev.reshape(-1), w[:, :-1].reshape(-1), w[:, 1:].reshape(-1)


class _Counts:
    """The train split's byte and pair counts, and the triple counts of the triples `queries` ask about
    (a lookup of the 2^24 possible triples, so no 2^24-long count table is built)."""

    def __init__(self, train: Tensor, queries: Sequence[tuple[Tensor, Tensor, Tensor]]) -> None:
        s = train.numpy().astype(np.int32)
        self.uni = torch.from_numpy(np.bincount(s, minlength=VOCAB).astype(np.float64))
        self.bi = torch.from_numpy(np.bincount((s[:-1] << 8) | s[1:], minlength=VOCAB ** 2).astype(np.float64))
        self.bi_context = self.bi.view(VOCAB, VOCAB).sum(1)
        pairs = (s[:-2] << 8) | s[1:-1]  # a triple's context: the pair it starts with
        self.tri_context = torch.from_numpy(np.bincount(pairs, minlength=VOCAB ** 2).astype(np.float64))
        asked = np.unique(np.concatenate([_triples(*q)[1].numpy() for q in queries]).astype(np.int32))
        wanted = np.zeros(VOCAB ** 3, dtype=bool)
        wanted[asked] = True
        keys = (pairs << 8) | s[2:]
        self._keys, counts = np.unique(keys[wanted[keys]], return_counts=True)
        self._counts = counts.astype(np.float64)

    def _tri(self, keys: Tensor) -> Tensor:
        k = keys.numpy()
        at = np.searchsorted(self._keys, k).clip(max=max(len(self._keys) - 1, 0))
        found = self._keys[at] == k if len(self._keys) else np.zeros(len(k), dtype=bool)
        return torch.from_numpy(np.where(found, self._counts[at] if len(self._keys) else 0.0, 0.0))

    def bits(self, order: int, k: float, prev: Tensor, x: Tensor, y: Tensor) -> float:
        """Mean bits per target of the add-k table of `order` (trigram: bigram where prev is -1)."""
        uni = -torch.log2((self.uni[y] + k) / (self.uni.sum() + VOCAB * k))
        if order == 1:
            return float(uni.mean())
        bi = -torch.log2((self.bi[x * VOCAB + y] + k) / (self.bi_context[x] + VOCAB * k))
        if order == 2:
            return float(bi.mean())
        context, keys = _triples(prev, x, y)
        tri = -torch.log2((self._tri(keys) + k) / (self.tri_context[context] + VOCAB * k))
        return float(torch.where(prev >= 0, tri, bi).mean())


def _contexts(stream: Tensor, starts: Tensor, seq_len: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    """(the `width` bytes before each target that the model has seen in its window, most recent last
    and -1 where it has not; the targets) for every position of every window."""
    index = starts.long()[:, None] + torch.arange(seq_len + 1)[None, :]
    w = stream.long()[index].numpy()
    padded = np.concatenate([np.full((len(w), width - 1), -1, dtype=np.int64), w[:, :-1]], axis=1)
    history = np.lib.stride_tricks.sliding_window_view(padded, width, axis=1)  # (windows, seq_len, width)
    return history.reshape(-1, width), w[:, 1:].reshape(-1)


def _triples(prev: Tensor, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
    """(context pair, triple) keys of each target (prev -1, a window's first position, reads as 0)."""
    context = prev.clamp(min=0) * VOCAB + x
    return context, context * VOCAB + y


def ngram_baselines(train: Tensor, val: Tensor, val_starts: Tensor, test: Tensor, test_starts: Tensor,
                    seq_len: int) -> dict[str, Any]:
    """Unigram, bigram and trigram bits per byte on the test windows (`test[s+1 : s+seq_len+1]` for each
    start s): add-k tables fitted on the `train` byte stream, each k tuned on the validation windows;
    and the interpolated Kneser-Ney 5-gram's (`fivegram_bpb`), fitted on the same stream."""
    val_windows, test_windows = _windows(val, val_starts, seq_len), _windows(test, test_starts, seq_len)
    counts = _Counts(train, [val_windows, test_windows])
    out: dict[str, Any] = {}
    for name, order in ORDERS.items():
        k = min(K_GRID, key=lambda c: counts.bits(order, c, *val_windows))
        out[f"{name}_bpb"] = round(counts.bits(order, k, *test_windows), 4)
        out[f"{name}_k"] = k
    strong = KneserNey(train.numpy(), STRONG_ORDER)
    out["fivegram_bpb"] = round(strong.bits(*_contexts(test, test_starts, seq_len, STRONG_ORDER - 1)), 4)
    return {**out, "fit": FIT, "scored": SCORED, "tuned": TUNED, "smoothing": "add-k",
            "fivegram_smoothing": STRONG_SMOOTHING, "train_bytes": int(train.numel()),
            "targets": int(test_windows[2].numel())}


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


def reference_table(baselines: Mapping[str, Any]) -> str:
    """The strongest table the baselines hold: trigram, or bigram for results recorded before it."""
    return REFERENCE if _finite(baselines.get(f"{REFERENCE}_bpb")) else "bigram"


def below(values: Mapping[int, float], baselines: Mapping[str, Any], table: str) -> int:
    """How many of the runs' values (bits per byte, by seed) are below the table's."""
    return sum(v < baselines[f"{table}_bpb"] for v in values.values())


def note(baselines: Mapping[str, Any], rows: Sequence[Any], unit: str) -> str | None:
    """One line for the printed notes and report.html; None unless the metric is in bits per byte. The
    5-gram (recorded since it was added) is named beside the add-k tables, with its own count."""
    if unit != "bits/byte":
        return None
    table = reference_table(baselines)
    runs = sum(len(r.values) for r in rows)
    count = sum(below(r.values, baselines, table) for r in rows)
    scores = ", ".join(f"{name} {baselines[f'{name}_bpb']:.2f}" for name in ORDERS
                       if _finite(baselines.get(f"{name}_bpb")))
    tuned = f" (add-k, k tuned on the {baselines['tuned']})" if baselines.get("tuned") else ""
    strong, strong_count = "", ""
    if _finite(baselines.get("fivegram_bpb")):
        strong = f"; {STRONG} {baselines['fivegram_bpb']:.2f} ({baselines.get('fivegram_smoothing', STRONG_SMOOTHING)})"
        passed = sum(below(r.values, baselines, "fivegram") for r in rows)
        strong_count = f", {passed} of {runs} below the {STRONG}"
        if runs and not passed:
            size = (f"all {baselines['train_bytes'] / 1e6:.1f} MB of the {baselines['fit']}"
                    if _finite(baselines.get("train_bytes")) else f"the whole {baselines['fit']}")
            strong_count += (f" (none passes it: it counts every 5-gram of {size}, four bytes of context; a model "
                             f"must learn more than that from the text it reads)")
    return (f"reference tables fitted on the {baselines['fit']} and scored on the same {baselines['scored']}"
            f"{tuned}: {scores}{strong} bits/byte; {count} of {runs} finished runs end below the {table}"
            f"{strong_count}")


def row_fields(baselines: Mapping[str, Any] | None, values: Mapping[int, float]) -> dict[str, Any]:
    """The summary.json keys a row gets: the tables' scores and how many of its seeds end below them."""
    names = [f"{name}_bpb" for name in (*ORDERS, "fivegram")]
    if baselines is None:
        return {**dict.fromkeys(names), "seeds_below_bigram": None, "seeds_below_trigram": None,
                "seeds_below_fivegram": None}
    trigram, fivegram = _finite(baselines.get("trigram_bpb")), _finite(baselines.get("fivegram_bpb"))
    return {**{n: baselines.get(n) for n in names}, "seeds_below_bigram": below(values, baselines, "bigram"),
            "seeds_below_trigram": below(values, baselines, "trigram") if trigram else None,
            "seeds_below_fivegram": below(values, baselines, "fivegram") if fivegram else None}
