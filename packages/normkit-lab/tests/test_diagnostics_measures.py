"""Diagnostics measures on inputs with known answers (normality, power shares, noise robustness)."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from scipy import stats
from torch import nn

import normkit
from normkit_lab.diagnostics import measure_layers, noise_robustness, power_shares, qq_r2, running_lambdas
from normkit_lab.diagnostics.power import TERMS, PowerAccumulator
from normkit_lab.diagnostics.sampling import sample_batches


def g(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# -- Q-Q normality ----------------------------------------------------------------------------


def test_gaussian_samples_have_r2_near_one_and_skewed_ones_lower():
    gauss = torch.randn(8, 2000, generator=g())
    skewed = torch.randn(8, 2000, generator=g(1)).exp()  # log-normal, heavily right-skewed
    assert qq_r2(gauss).min() > 0.995
    assert qq_r2(skewed).max() < 0.8


def test_qq_r2_matches_scipy_probplot():
    x = torch.randn(3, 300, generator=g(2)) ** 3
    expected = [stats.probplot(row.numpy())[1][2] ** 2 for row in x]
    assert torch.allclose(qq_r2(x), torch.tensor(expected, dtype=torch.float32), atol=1e-5)


def test_constant_rows_give_zero_not_nan():
    r2 = qq_r2(torch.full((2, 50), 3.0))
    assert torch.equal(r2, torch.zeros(2))


# -- power decomposition ----------------------------------------------------------------------


def test_collapsed_channels_put_all_power_at_dataset_scale():
    constants = torch.tensor([1.0, -2.0, 0.5, 3.0])
    y = constants.view(1, 4, 1).expand(16, 4, 64)  # channel-wise constant: same value everywhere
    assert power_shares(y)["dataset"] == pytest.approx(1.0, abs=1e-6)


def test_iid_noise_puts_power_at_pixel_scale():
    shares = power_shares(torch.randn(32, 8, 256, generator=g(3)))
    assert shares["pixel_mean"] + shares["pixel_var"] > 0.98
    assert shares["dataset"] < 0.01


def test_instance_constant_values_put_power_at_instance_scale():
    y = torch.randn(64, 8, 1, generator=g(4)).expand(64, 8, 32)  # constant over space, varies by input
    assert power_shares(y)["instance"] > 0.95


def test_shares_sum_to_one_and_zeros_are_finite():
    y = torch.randn(8, 4, 5, 5, generator=g(5)) * 3 + torch.randn(1, 4, 1, 1, generator=g(6))
    assert sum(power_shares(y).values()) == pytest.approx(1.0, abs=1e-6)
    assert power_shares(torch.zeros(4, 3, 9)) == dict.fromkeys(TERMS, 0.0)


def test_accumulating_batches_equals_one_big_batch():
    y = torch.randn(20, 3, 16, generator=g(7)) + 0.5
    acc = PowerAccumulator()
    acc.add(y[:7])
    acc.add(y[7:])
    whole = power_shares(y)
    assert all(acc.shares()[t] == pytest.approx(whole[t], abs=1e-5) for t in TERMS)


# -- model-level measures ---------------------------------------------------------------------


def tiny_net(norm: str, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), normkit.build(norm, 8, activation="relu"),
        nn.Conv2d(8, 8, 3, padding=1), normkit.build(norm, 8, activation="relu"),
        nn.Conv2d(8, 8, 3, padding=1), normkit.build(norm, 8, activation="relu"),
    )


def batches(count: int = 2) -> list[torch.Tensor]:
    return [torch.randn(16, 3, 6, 6, generator=g(10 + i)) for i in range(count)]


def test_noise_robustness_is_zero_without_noise_and_positive_with_it():
    net = tiny_net("bn")
    quiet = noise_robustness(net, batches(), delta=0.0, draws=1)
    noisy = noise_robustness(net, batches(), delta=0.5, draws=2)
    assert [(c["k"], c["l"]) for c in quiet["table"]] == [(1, 2), (1, 3), (2, 3)]
    assert all(c["zeta"] == 0.0 for c in quiet["table"])
    assert all(c["zeta"] > 0.01 for c in noisy["table"])


def test_measures_leave_the_model_and_global_rng_unchanged():
    net = tiny_net("bnn").train()
    before = {k: v.clone() for k, v in net.state_dict().items()}
    rng = torch.get_rng_state()
    rows = measure_layers(net, batches(), mode="batch", channels=4)
    measure_layers(net, batches(), mode="eval")
    noise_robustness(net, batches(), draws=1)
    assert net.training and all(m.training for m in net.modules())
    assert all(torch.equal(before[k], v) for k, v in net.state_dict().items())
    assert torch.equal(rng, torch.get_rng_state())
    assert all(not layer.probes for layer in net.modules() if isinstance(layer, normkit.NormLayer))
    assert [r["depth"] for r in rows] == [1, 2, 3]
    assert all(0.5 < r["qq_r2"] <= 1 for r in rows)
    assert all(sum(r["power"].values()) == pytest.approx(1.0, abs=1e-5) for r in rows)


def test_running_lambdas_only_for_layers_that_keep_one():
    assert len(running_lambdas(tiny_net("bnn"))) == 3
    assert running_lambdas(tiny_net("bn")) == []
    assert running_lambdas(tiny_net("lnn")) == []


class AugmentingDataset(torch.utils.data.Dataset):
    """Draws from every generator per item, as random augmentations do."""

    def __len__(self) -> int:
        return 40

    def __getitem__(self, i: int):
        random.random()
        np.random.rand()
        return torch.rand(3), 0


def test_sampling_batches_leaves_every_generator_where_it_was():
    states = torch.get_rng_state(), random.getstate(), np.random.get_state()[1].copy()
    batches = sample_batches(AugmentingDataset(), count=3, batch_size=16)
    assert [len(b) for b in batches] == [16, 16, 8]  # a tail of at least 8 samples is kept
    after = torch.get_rng_state(), random.getstate(), np.random.get_state()[1]
    assert torch.equal(states[0], after[0]) and states[1] == after[1] and (states[2] == after[2]).all()
