import math

import pytest

from normkit_lab.lm_metrics import bits_per_byte, bits_per_token, perplexity


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
    from normkit_lab.training import EpochRecord

    return EpochRecord(0, 1.0, 0.5, val_loss, 0.5, None, 1.0, 100.0, 10.0, 0.1)


def test_epoch_records_get_bits_per_byte_only_for_byte_datasets():
    from normkit_lab.datasets import DatasetBundle
    from normkit_lab.training import add_bits_per_byte

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
