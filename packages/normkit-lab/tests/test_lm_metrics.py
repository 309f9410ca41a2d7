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
    table knows which follows which (near 0 bits: add-one smoothing gives each of the 255 unseen bytes one
count, so the right one gets 5001 / 5256)."""
    import math

    import torch

    from normkit_lab.lm_baselines import ngram_baselines

    stream = torch.tensor(list(b"abcd" * 5000), dtype=torch.uint8)
    starts = torch.arange(0, 1000, 10)
    b = ngram_baselines(stream, stream, starts, seq_len=8)
    assert b["targets"] == 100 * 8 and b["fit"] == "train split"
    assert b["unigram_bpb"] == pytest.approx(-math.log2(5001 / 20256), abs=1e-3)  # 2 bits, smoothed
    assert b["bigram_bpb"] == pytest.approx(-math.log2(5001 / 5256), abs=2e-3)


def test_the_last_epochs_metric_is_a_mean_that_selects_nothing() -> None:
    from normkit_lab.metrics import METRICS, run_value

    epochs = [{"test_bpb": v, "val_bpb": 9 - v} for v in (5.0, 4.0, 3.0, 2.9, 3.1)]
    last3 = METRICS["test_bpb_last3"]
    assert run_value(epochs, last3, "final") == pytest.approx(3.0)
    assert run_value(epochs, last3, "best-val") == pytest.approx(3.0)  # no epoch is picked
    assert run_value(epochs[:2], last3, "final") == pytest.approx(4.5)  # fewer epochs: their mean
    assert run_value([*epochs, {"test_bpb": None}], last3, "final") is None
    assert METRICS["test_bpb"].default_margin == 0.05 and not last3.higher_is_better
