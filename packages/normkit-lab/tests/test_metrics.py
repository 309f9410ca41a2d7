import math

import pytest

from normkit_lab.metrics import bits_per_byte, bits_per_token, perplexity


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
