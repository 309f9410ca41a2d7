import itertools
import math

import pytest

from normkit_lab.runs.lm_metrics import bits_per_byte, bits_per_token, perplexity


def test_uniform_bytes_cost_eight_bits():
    loss = math.log(256)  # a model that predicts every byte uniformly
    assert bits_per_byte(loss) == pytest.approx(8.0)
    assert bits_per_token(loss) == pytest.approx(8.0)
    assert perplexity(loss) == pytest.approx(256.0)


def test_bits_per_byte_divides_by_bytes_per_token():
    assert bits_per_byte(math.log(2) * 3, bytes_per_token=4.0) == pytest.approx(0.75)
    with pytest.raises(ValueError, match="bytes_per_token"):
        bits_per_byte(1.0, bytes_per_token=0.0)


def test_zero_loss_and_overflow():
    assert bits_per_byte(0.0) == 0.0
    assert perplexity(0.0) == 1.0
    assert perplexity(1e6) == math.inf


def _record(val_loss: float):
    from normkit_lab.records import EpochRecord

    return EpochRecord(0, 1.0, 0.5, val_loss, 0.5, None, 1.0, 100.0, 10.0, 0.1)


def test_epoch_records_get_bits_per_byte_only_for_byte_datasets():
    from normkit_lab.datasets import DatasetBundle
    from normkit_lab.runs.training import add_bits_per_byte

    text = DatasetBundle("t", [], [], [], 256, 0, 16, metadata={"bytes_per_token": 1.0})
    record = _record(math.log(256))
    add_bits_per_byte(record, text)
    assert record.val_bpb == pytest.approx(8.0) and record.test_bpb is None
    record.test_loss = math.log(16)  # the test split's loss, once the record carries one
    add_bits_per_byte(record, text)
    assert record.test_bpb == pytest.approx(4.0)
    images = _record(1.0)
    add_bits_per_byte(images, DatasetBundle("i", [], [], [], 10, 1, 8))
    assert images.val_bpb is None and images.test_bpb is None


# -- reference tables and the last-epochs metric ------------------------------------------------


def test_ngram_baselines_score_a_predictable_stream() -> None:
    """A stream cycling a, b, c, d: a unigram table knows only the four bytes (2 bits each), a bigram
    and a trigram table know which follows which (near 0 bits); each k is tuned on validation (the
    smallest of the grid wins on such a regular stream, and scores near 0)."""
    import math

    import torch

    from normkit_lab.lm_baselines import K_GRID, ngram_baselines

    stream = torch.tensor(list(b"abcd" * 5000), dtype=torch.uint8)
    starts = torch.arange(0, 1000, 10)
    b = ngram_baselines(stream, stream, starts, stream, starts, seq_len=8)
    assert b["targets"] == 100 * 8 and b["fit"] == "train split" and b["tuned"] == "validation windows"
    assert b["unigram_bpb"] == pytest.approx(2.0, abs=1e-3)
    k = min(K_GRID)
    assert b["bigram_k"] == b["trigram_k"] == k
    assert b["bigram_bpb"] == pytest.approx(-math.log2((5000 + k) / (5000 + 256 * k)), abs=1e-3)
    assert b["trigram_bpb"] <= b["bigram_bpb"] < 0.01


def test_the_trigram_table_uses_two_bytes_of_context_and_backs_off_at_a_window_start() -> None:
    """a b -> c and x b -> d: one byte (b) cannot tell c from d, two can. At each window's first
    position the model has seen one byte only, so the trigram table scores it as the bigram does."""
    import torch

    from normkit_lab.lm_baselines import _Counts, _windows

    stream = torch.tensor(list(b"abcxbd" * 2000), dtype=torch.uint8)
    starts = torch.arange(0, 600, 6)  # windows starting at each 'a'
    windows = _windows(stream, starts, 6)
    counts = _Counts(stream, [windows])
    bigram, trigram = counts.bits(2, 0.001, *windows), counts.bits(3, 0.001, *windows)
    assert bigram == pytest.approx(2 / 6, abs=0.01)  # after b: c or d, 1 bit, at 2 of 6 positions
    assert trigram < 0.01  # a b -> c, x b -> d: every position known
    first = [w[:1] for w in _windows(stream, starts, 1)]  # first positions only: no second byte of context
    assert counts.bits(3, 0.001, *first) == pytest.approx(counts.bits(2, 0.001, *first))


def test_the_note_holds_models_to_the_trigram_and_reads_older_results() -> None:
    from types import SimpleNamespace

    from normkit_lab.lm_baselines import note, row_fields

    rows = [SimpleNamespace(values={0: 2.5, 1: 2.8}), SimpleNamespace(values={0: 3.0})]
    new = {"unigram_bpb": 4.8, "bigram_bpb": 3.6, "trigram_bpb": 2.7, "fit": "train split",
           "scored": "test windows", "tuned": "validation windows"}
    line = note(new, rows, "bits/byte")
    assert "unigram 4.80, bigram 3.60, trigram 2.70 bits/byte" in line and line.endswith("1 of 3 finished runs "
                                                                                          "end below the trigram")
    assert row_fields(new, rows[0].values)["seeds_below_trigram"] == 1
    strong = {**new, "fivegram_bpb": 2.6, "fivegram_smoothing": "interpolated Kneser-Ney"}
    line = note(strong, rows, "bits/byte")
    assert "trigram 2.70; 5-gram 2.60 (interpolated Kneser-Ney) bits/byte" in line
    assert line.endswith("1 of 3 finished runs end below the trigram, 1 of 3 below the 5-gram")
    assert row_fields(strong, {0: 2.5, 1: 2.65})["seeds_below_fivegram"] == 1
    beaten = note({**strong, "fivegram_bpb": 1.9, "train_bytes": 25_274_493}, rows, "bits/byte")
    assert beaten.endswith("0 of 3 below the 5-gram (none passes it: it counts every 5-gram of all 25.3 MB of the "
                           "train split, four bytes of context; a model must learn more than that from the text it "
                           "reads)")
    assert row_fields(new, rows[0].values)["seeds_below_fivegram"] is None
    old = {"unigram_bpb": 4.8, "bigram_bpb": 3.6, "fit": "train split", "scored": "test windows"}
    assert note(old, rows, "bits/byte").endswith("3 of 3 finished runs end below the bigram")
    assert row_fields(old, rows[0].values)["seeds_below_trigram"] is None


def _source_bytes():
    """Real text: a few of this Python's standard library files, as one byte stream."""
    import sysconfig
    from pathlib import Path

    import numpy as np

    root = Path(sysconfig.get_paths()["stdlib"])
    data = b"".join((root / name).read_bytes() for name in ("os.py", "textwrap.py", "shlex.py"))
    return np.frombuffer(data, dtype=np.uint8)


def test_the_kneser_ney_model_sums_to_one_over_the_256_bytes() -> None:
    """Every order, after contexts seen often, seen once, never seen, and with only some bytes seen
    (a window's first positions): p(. | h) is a distribution over the 256 bytes with no zero."""
    import numpy as np

    from normkit_lab.lm_kneser_ney import KneserNey

    for length in (0, 3, 5):  # a stream shorter than the order counts nothing: uniform, still a distribution
        p = KneserNey(np.arange(length, dtype=np.uint8), 5).probabilities(np.array([[-1, -1, 1, 2]] * 256),
                                                                          np.arange(256))
        assert p.sum() == pytest.approx(1.0) and p.min() > 0
    stream = _source_bytes()
    for order in (1, 2, 3, 4, 5):
        model = KneserNey(stream, order)
        for history in (b"self", b"def ", b"\x00\x01\x02\x03", b"\xff" + b"ort", b"port"):
            for seen in range(order):
                row = [-1] * (order - 1 - seen) + list(history[len(history) - seen:] if seen else b"")
                p = model.probabilities(np.array([row] * 256), np.arange(256))
                assert p.sum() == pytest.approx(1.0, abs=1e-9) and p.min() > 0, (order, history, seen)


def test_the_kneser_ney_model_matches_the_formula_computed_with_dictionaries() -> None:
    """The numpy counting (keys, prefixes, continuations) against the recursion written out with
    Counters over the same bytes, at random contexts of every length and random targets."""
    from collections import Counter, defaultdict

    import numpy as np

    from normkit_lab.lm_kneser_ney import KneserNey, _discounts

    data = bytes(_source_bytes()[:20000])
    grams = {5: Counter(data[i:i + 5] for i in range(len(data) - 4))}
    for n in (4, 3, 2, 1):  # each order's occurrences as the prefixes of the order above, as the model counts
        grams[n] = Counter()
        for g, k in grams[n + 1].items():
            grams[n][g[:-1]] += k
    continuations = {n: Counter(g[1:] for g in grams[n + 1]) for n in (1, 2, 3, 4)}

    def level(counts):
        total, kinds = defaultdict(float), defaultdict(lambda: [0, 0, 0])
        for g, k in counts.items():
            total[g[:-1]] += k
            kinds[g[:-1]][min(k, 3) - 1] += 1
        return counts, total, kinds, _discounts(np.array(list(counts.values()), dtype=float))

    top = {n: level(grams[n]) for n in grams}
    lower = {n: level(continuations[n]) for n in continuations}

    def p(history: bytes, y: int) -> float:
        prob = 1 / 256
        for n in range(1, len(history) + 2):
            counts, total, kinds, d = top[n] if n == len(history) + 1 else lower[n]
            context = history[len(history) - n + 1:] if n > 1 else b""
            if total.get(context, 0):
                c = counts.get(context + bytes([y]), 0)
                gamma = sum(d[i + 1] * kinds[context][i] for i in range(3)) / total[context]
                prob = max(c - d[min(c, 3)], 0) / total[context] + gamma * prob
        return prob

    model = KneserNey(np.frombuffer(data, dtype=np.uint8), 5)
    rng = np.random.default_rng(0)
    for _ in range(100):
        at, seen = int(rng.integers(4, len(data))), int(rng.integers(0, 5))
        y = data[at] if rng.random() < 0.8 else int(rng.integers(256))
        row = [-1] * (4 - seen) + list(data[at - seen:at])
        assert model.probabilities(np.array([row]), np.array([y]))[0] == pytest.approx(p(data[at - seen:at], y))


def test_the_kneser_ney_five_gram_uses_four_bytes_of_context() -> None:
    """After `bcd` comes e or f; `abcd` and `xbcd` tell which. The 4-gram cannot (about 1 bit at those
    positions), the 5-gram can; and on real text each order scores below the one before."""
    import numpy as np
    import torch

    from normkit_lab.lm_baselines import _contexts
    from normkit_lab.lm_kneser_ney import KneserNey

    stream = torch.tensor(list(b"abcdexbcdf" * 500), dtype=torch.uint8)
    starts = torch.arange(0, 1000, 10)
    history, targets = _contexts(stream, starts, 9, 4)
    assert history[0].tolist() == [-1, -1, -1, ord("a")] and history[3].tolist() == list(b"abcd")
    assert targets[3] == ord("e")
    four, five = KneserNey(stream.numpy(), 4), KneserNey(stream.numpy(), 5)
    assert four.bits(history[:, 1:], targets) > 0.15 and five.bits(history, targets) < 0.05
    text = _source_bytes()
    cut = len(text) * 9 // 10
    train, test = text[:cut], torch.from_numpy(text[cut:].copy())
    starts = torch.arange(0, len(test) - 65, 64)
    history, targets = _contexts(test, starts, 64, 4)
    scores = [KneserNey(train, n).bits(history[:, 5 - n:], targets) for n in (1, 2, 3, 4, 5)]
    assert all(a > b for a, b in itertools.pairwise(scores)) and np.isfinite(scores).all()


def test_the_baselines_hold_the_five_gram_beside_the_add_k_tables() -> None:
    import torch

    from normkit_lab.lm_baselines import ngram_baselines

    text = torch.from_numpy(_source_bytes().copy())
    cut = len(text) * 8 // 10
    train, rest = text[:cut], text[cut:]
    val, test = rest[:len(rest) // 2], rest[len(rest) // 2:]
    b = ngram_baselines(train, val, torch.arange(0, len(val) - 33, 40), test, torch.arange(0, len(test) - 33, 40),
                        seq_len=32)
    assert b["fivegram_bpb"] < b["trigram_bpb"] < b["bigram_bpb"]
    assert b["fivegram_smoothing"] == "interpolated Kneser-Ney"


def test_the_last_epochs_metric_is_a_mean_that_selects_nothing() -> None:
    from normkit_lab.metrics import METRICS, run_value

    epochs = [{"test_bpb": v, "val_bpb": 9 - v} for v in (5.0, 4.0, 3.0, 2.9, 3.1)]
    last3 = METRICS["test_bpb_last3"]
    assert run_value(epochs, last3, "final") == pytest.approx(3.0)
    assert run_value(epochs, last3, "best-val") == pytest.approx(3.0)  # no epoch is picked
    assert run_value(epochs[:2], last3, "final") == pytest.approx(4.5)  # fewer epochs: their mean
    assert run_value([*epochs, {"test_bpb": None}], last3, "final") is None
    assert METRICS["test_bpb"].default_margin == 0.05 and not last3.higher_is_better
