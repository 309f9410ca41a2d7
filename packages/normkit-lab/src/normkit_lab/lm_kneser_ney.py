"""An interpolated Kneser-Ney byte n-gram model: the strong count-based reference for language models.

Add-k tables (lm_baselines) give every unseen byte the same small share, which is a weak bar: a
5-gram smoothed by interpolated Kneser-Ney with modified discounts (Chen & Goodman, An Empirical
Study of Smoothing Techniques for Language Modeling, 1998, Section 3) scores far lower on the same
windows. For a context h (the n - 1 previous bytes) and its suffix h' (one byte shorter):

    p_n(y | h) = max(c(h y) - D(c), 0) / c(h) + gamma(h) p_{n-1}(y | h')
    gamma(h)   = (D1 N1(h) + D2 N2(h) + D3 N3+(h)) / c(h)        (N_k(h): bytes seen k times after h)

with p_{n-1} used alone where h was never seen, and p_0 uniform over the 256 bytes. The top order
counts occurrences, each lower order counts continuations (how many distinct bytes precede the
n-gram), and each order's discounts D1, D2, D3+ come from its own counts of counts, so nothing is
tuned. Every p_n(. | h) sums to 1 over the 256 bytes (c(h) is the sum of the counts after h).

Counting is numpy sorting of 40-bit keys: a 25 MB train split takes seconds.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

VOCAB = 256


@dataclass(frozen=True)
class _Level:
    """One order's counts of one kind (occurrences or continuations): the sorted n-gram keys, their
    counts, and per context (the key without its last byte) the total and how many of its bytes
    have count 1, 2 and 3 or more, with the order's discounts D1, D2, D3+ (index 0 unused)."""

    keys: np.ndarray
    counts: np.ndarray
    contexts: np.ndarray
    total: np.ndarray
    by_count: np.ndarray  # (contexts, 3): N1, N2, N3+
    discounts: np.ndarray  # (4,): 0, D1, D2, D3+


def _grouped(keys: np.ndarray, counts: np.ndarray) -> _Level:
    """A level from sorted unique keys and their counts."""
    context = keys >> 8
    starts = np.flatnonzero(np.r_[True, context[1:] != context[:-1]]) if len(keys) else np.zeros(0, np.int64)
    kinds = np.stack([counts == 1, counts == 2, counts >= 3], axis=1).astype(np.float64)
    total = np.add.reduceat(counts, starts) if len(keys) else np.zeros(0)
    by_count = np.add.reduceat(kinds, starts, axis=0) if len(keys) else np.zeros((0, 3))
    return _Level(keys, counts, context[starts], total, by_count, _discounts(counts))


def _discounts(counts: np.ndarray) -> np.ndarray:
    """Chen & Goodman's estimates from the counts of counts n1..n4, each kept in (0, k] for count k so
    that an unseen byte after a seen context keeps a share (a degenerate corpus falls back to 0.5 k)."""
    n = [float(np.sum(counts == k)) for k in (1, 2, 3, 4)]
    y = n[0] / (n[0] + 2 * n[1]) if n[0] > 0 and n[1] > 0 else 0.5
    out = np.zeros(4)
    for k in (1, 2, 3):
        estimate = k - (k + 1) * y * n[k] / n[k - 1] if n[k - 1] > 0 and n[k] > 0 else 0.5 * k
        out[k] = min(max(estimate, 0.05 * k), float(k))
    return out


def _unique(keys: np.ndarray, in_place: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Sorted unique keys and how often each occurs (`in_place`: sorts `keys` itself, no copy)."""
    if in_place:
        keys.sort()
    else:
        keys = np.sort(keys)
    if not len(keys):
        return keys, np.zeros(0)
    starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])
    return keys[starts], np.diff(np.r_[starts, len(keys)]).astype(np.float64)


def _prefixes(keys: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The (n-1)-grams that sorted n-gram keys start with, and their summed counts (still sorted)."""
    if not len(keys):
        return keys, counts
    prefix = keys >> 8
    starts = np.flatnonzero(np.r_[True, prefix[1:] != prefix[:-1]])
    return prefix[starts], np.add.reduceat(counts, starts)


def _lookup(keys: np.ndarray, values: np.ndarray, queries: np.ndarray) -> np.ndarray:
    """values[keys == query] for each query, 0 where the key is absent (rows for 2-D values)."""
    if not len(keys):
        return np.zeros((len(queries), *values.shape[1:]))
    at = np.searchsorted(keys, queries).clip(max=len(keys) - 1)
    found = keys[at] == queries
    picked = values[at]
    return np.where(found.reshape((-1,) + (1,) * (values.ndim - 1)), picked, 0.0)


class KneserNey:
    """An interpolated Kneser-Ney byte model of `order` fitted on one byte stream.

        model = KneserNey(train_bytes, order=5)
        p = model.probabilities(contexts, targets)   # contexts: (N, order-1), -1 = not seen
    """

    def __init__(self, stream: np.ndarray, order: int = 5) -> None:
        if not 1 <= order <= 5:
            raise ValueError(f"order must be 1 to 5 (keys of at most 40 bits), got {order}")
        self.order = order
        s = np.asarray(stream, dtype=np.uint8)
        length = max(len(s) - order + 1, 0)
        keys = np.zeros(length, dtype=np.int64)
        for i in range(order):  # in place: a 25 MB split's keys are 200 MB
            keys <<= 8
            keys |= s[i:i + length]
        unique, counts = _unique(keys, in_place=True)
        del keys
        # occurrences per order, each from the one above (its prefixes: drops at most order - 1
        # n-grams at the stream's end), and continuations of each lower order (distinct left bytes)
        self.occurrences: dict[int, _Level] = {}
        self.continuations: dict[int, _Level] = {}
        for n in range(order, 0, -1):
            self.occurrences[n] = _grouped(unique, counts)
            if n > 1:
                suffixes, left = _unique(unique & ((1 << (8 * (n - 1))) - 1))
                self.continuations[n - 1] = _grouped(suffixes, left)
                unique, counts = _prefixes(unique, counts)

    def probabilities(self, contexts: np.ndarray, targets: np.ndarray) -> np.ndarray:
        """p(target | context) for each row: `contexts` holds the previous bytes (most recent last,
        `order - 1` columns, -1 where the model has not seen one, left of the seen ones); a row with
        k bytes of context is scored by the (k + 1)-gram model, its top order counting occurrences."""
        contexts = np.asarray(contexts, dtype=np.int64).reshape(len(targets), self.order - 1)
        targets = np.asarray(targets, dtype=np.int64)
        seen = (contexts >= 0).sum(axis=1)
        out = np.zeros(len(targets))
        for k in np.unique(seen):
            rows = seen == k
            history = contexts[rows][:, self.order - 1 - k:] if k else np.zeros((int(rows.sum()), 0), np.int64)
            out[rows] = self._top(history, targets[rows])
        return out

    def _top(self, history: np.ndarray, targets: np.ndarray) -> np.ndarray:
        """p_{k+1}(y | the k bytes of `history`), built up from the uniform distribution."""
        k = history.shape[1]
        p = np.full(len(targets), 1.0 / VOCAB)
        for n in range(1, k + 2):
            level = self.occurrences[n] if n == k + 1 else self.continuations[n]
            context = np.zeros(len(targets), dtype=np.int64)
            for column in range(k - n + 1, k):
                context = (context << 8) | history[:, column]
            p = _interpolate(level, context, (context << 8) | targets, p)
        return p

    def bits(self, contexts: np.ndarray, targets: np.ndarray) -> float:
        """Mean bits per target: -log2 p averaged over the rows."""
        return float(-np.log2(self.probabilities(contexts, targets)).mean())


def _interpolate(level: _Level, context: np.ndarray, key: np.ndarray, lower: np.ndarray) -> np.ndarray:
    """One order on top of the order below: discounted counts plus gamma(h) times the lower order."""
    count = _lookup(level.keys, level.counts, key)
    total = _lookup(level.contexts, level.total, context)
    by_count = _lookup(level.contexts, level.by_count, context)
    discount = level.discounts[np.minimum(count, 3).astype(np.int64)]
    seen = total > 0
    safe = np.where(seen, total, 1.0)
    gamma = by_count @ level.discounts[1:] / safe
    return np.where(seen, np.maximum(count - discount, 0.0) / safe + gamma * lower, lower)
