"""Ghost batches (`bn(ghost=2)`): exact against torch's batch norm applied ghost batch by ghost batch.

The reference for outputs and gradients is `F.batch_norm` on each chunk of the batch; for running
buffers, the mean of what each chunk's update gives from the same starting buffers (one update per
step with the chunks' mean statistic). For other batch-statistics norms (bnn, brn, plugins') the
reference is the same layer without ghost= run on each chunk alone from the same buffers.
"""

from __future__ import annotations

import copy
import pickle
import warnings

import pytest
import torch
import torch.nn.functional as F

import normkit
from normkit.errors import NormShapeError, SpecError
from normkit.testing import autograd_node_names, check_norm


def _batch(n: int = 8, c: int = 4, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, c, 3, 3, generator=g, dtype=torch.float64) * 2 + 0.5


@pytest.mark.parametrize("momentum", [0.1, None])
def test_bn_ghost_equals_torch_batch_norm_chunk_by_chunk(momentum: float | None) -> None:
    layer = normkit.build(f"bn(ghost=2,momentum={'none' if momentum is None else momentum})", 4).double()
    with torch.no_grad():
        layer.weight.uniform_(0.5, 1.5)
        layer.bias.uniform_(-0.5, 0.5)
    weight, bias = layer.weight.detach().clone().requires_grad_(True), layer.bias.detach().clone().requires_grad_(True)
    mean, var = torch.zeros(4, dtype=torch.float64), torch.ones(4, dtype=torch.float64)
    for step in range(3):
        x = _batch(seed=step)
        xa, xb = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
        out = layer(xa)
        factor = momentum if momentum is not None else 1 / (step + 1)
        starts = [(mean.clone(), var.clone()) for _ in range(4)]
        ref = torch.cat([F.batch_norm(chunk, m, v, weight, bias, True, factor, 1e-5)
                         for chunk, (m, v) in zip(xb.split(2), starts, strict=True)])
        mean, var = (torch.stack([m for m, _ in starts]).mean(0), torch.stack([v for _, v in starts]).mean(0))
        torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
        g = torch.randn_like(out)
        out.backward(g)
        ref.backward(g)
        torch.testing.assert_close(xa.grad, xb.grad, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(layer.running_mean, mean, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(layer.running_var, var, rtol=1e-12, atol=1e-12)
        assert int(layer.num_batches_tracked) == step + 1  # one step, one count, as without ghost=
    torch.testing.assert_close(layer.weight.grad, weight.grad)
    torch.testing.assert_close(layer.bias.grad, bias.grad)
    layer.eval()  # eval: the running statistics, whatever the batch
    x = _batch(n=3)
    torch.testing.assert_close(layer(x), F.batch_norm(x, mean, var, layer.weight, layer.bias, False, 0.0, 1e-5))


@pytest.mark.parametrize("spec", ["bnn(noise=0)", "bnn", "brn", "bn+relu+pn", "zca(group_size=2)"])
def test_every_batch_norm_ghost_is_the_layer_run_chunk_by_chunk(spec: str) -> None:
    ghosted = normkit.build(f"{spec}+relu" if spec == "bnn" else spec, 8, ghost=2)
    plain = copy.deepcopy(ghosted)
    plain.partition = normkit.build(spec.split("+")[0], 8).partition  # the same layer, whole-batch statistics
    assert ghosted.partition.ghost == 2 and plain.partition.ghost is None
    # bnn's noise: its ghost batches draw it in their regrouped order, not chunk by chunk (normkit-normalnorm's
    # test_ghost_fused.py), so with noise on only the buffers (which the noise does not touch) compare.
    noisy = spec == "bnn"
    for step in range(2):
        x = _batch(n=6, c=8, seed=step).float()
        start = {n: b.clone() for n, b in plain.named_buffers()}
        torch.manual_seed(step)
        out = ghosted(x)
        outs, ends = [], []
        torch.manual_seed(step)
        for chunk in x.split(2):
            for n, b in plain.named_buffers():
                b.copy_(start[n])
            outs.append(plain(chunk))
            ends.append({n: b.clone() for n, b in plain.named_buffers()})
        if not noisy:
            torch.testing.assert_close(out, torch.cat(outs), rtol=1e-5, atol=1e-6)  # reference vs fused path
        for n, b in plain.named_buffers():
            expected = torch.stack([e[n] for e in ends]).mean(0) if b.is_floating_point() else ends[-1][n]
            b.copy_(expected)
            torch.testing.assert_close(dict(ghosted.named_buffers())[n], expected, rtol=1e-6, atol=1e-7)


def test_ghost_of_the_whole_batch_is_plain_bn() -> None:
    x = _batch().float()
    ghosted, plain = normkit.build("bn(ghost=8)", 4), normkit.build("bn", 4)
    torch.testing.assert_close(ghosted(x), plain(x), rtol=0, atol=0)
    torch.testing.assert_close(ghosted.running_var, plain.running_var, rtol=0, atol=0)


def test_a_remainder_is_a_last_smaller_ghost_batch_and_bad_values_fail_in_one_line() -> None:
    layer = normkit.build("bn(ghost=2)", 4)
    x = torch.randn(5, 4, 3, 3)
    ref = torch.cat([F.batch_norm(c, None, None, training=True) for c in x.split(2)])
    torch.testing.assert_close(layer(x), ref)
    chunk_means = torch.stack([c.mean(dim=(0, 2, 3)) for c in x.split(2)])
    weighted = (chunk_means * torch.tensor([2.0, 2.0, 1.0]).view(3, 1)).sum(0) / 5  # = the batch mean
    torch.testing.assert_close(layer.running_mean, 0.1 * weighted)
    with pytest.raises(NormShapeError, match="more than 1 value per channel"):
        normkit.build("bn(ghost=2)", 4)(torch.randn(3, 4))  # a last ghost batch of one value per channel
    with pytest.raises(SpecError, match="ghost must be a number of samples >= 1"):
        normkit.build("bn(ghost=0)", 4)
    with pytest.raises(SpecError, match="unknown parameter 'ghost' for 'gn'"):
        normkit.build("gn(ghost=2)", 4)
    with pytest.raises(SpecError, match="expects int | none"):
        normkit.build("bn(ghost=1.5)", 4)


def test_ghost_is_declared_for_batch_norms_only() -> None:
    params = {d["name"]: d["parameters"] for d in normkit.available()}
    assert "ghost" in params["bn"] and "ghost" in params["brn"]
    assert "ghost" not in params["gn"] and "ghost" not in params["ln"]
    assert normkit.parse("bnn(ghost=2)").text == "bnn(ghost=2)"
    assert str(normkit.build("bnn(ghost=2)", 4).partition) == "batch(ghost=2)"


def test_ghost_without_running_statistics_also_splits_in_eval() -> None:
    layer = normkit.build("bn(ghost=2,track_running_stats=false)", 4).eval()
    x = _batch().float()
    ref = torch.cat([F.batch_norm(c, None, None, layer.weight, layer.bias, True) for c in x.split(2)])
    torch.testing.assert_close(layer(x), ref)


def test_ghost_pickles_and_to_torch_refuses() -> None:
    layer = normkit.build("bn(ghost=2)", 4)
    layer(torch.randn(4, 4, 2, 2))
    clone = pickle.loads(pickle.dumps(layer))
    assert clone.partition.ghost == 2
    x = torch.randn(6, 4, 2, 2)
    torch.testing.assert_close(clone(x), layer(x))
    summary = normkit.to_torch(torch.nn.Sequential(layer))
    assert "ghost batches" in str(summary)


@pytest.mark.parametrize("spec", ["bn(ghost=2)", "bnn(ghost=2)"])
def test_ghost_norms_pass_the_conformance_suite(spec: str) -> None:
    check_norm(spec, 8, **({"gradcheck_overrides": {"noise": 0}} if spec.startswith("bnn") else {}))


def test_bn_and_bnn_run_all_ghost_batches_as_one_grouped_tensor_and_others_batch_by_batch() -> None:
    from normkit import ghost

    assert ghost._groups_only(normkit.build("bn(ghost=2)", 8))
    assert ghost._groups_only(normkit.build("bnn(ghost=2)", 8))
    assert not ghost._groups_only(normkit.build("brn(ghost=2)", 8))  # its own forward: one call per ghost batch
    assert not ghost._groups_only(normkit.build("bn(ghost=2)+relu+pn", 8, activation="relu"))


def _ghost_warnings(model: torch.nn.Module, batches: list[int], channels: int = 4) -> list[str]:
    """The GhostBatchTooLarge messages training `model` on batches of these sizes gives."""
    from normkit.ghost import GhostBatchTooLarge

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for n in batches:
            model(torch.randn(n, channels, 2, 2))
    return [str(w.message) for w in caught if issubclass(w.category, GhostBatchTooLarge)]


def test_a_ghost_larger_than_the_training_batch_warns_once_per_layer() -> None:
    model = torch.nn.Sequential(normkit.build("bn(ghost=32)", 4), normkit.build("bnn(ghost=16)", 4))
    messages = _ghost_warnings(model, [8, 8, 8])
    assert messages == [
        "normkit: bn(ghost=32) (4 channels) has ghost=32 but trains on batches of 8 samples, so it normalizes over "
        "the whole batch of 8, not ghost batches of 32; use ghost= at most the training batch size",
        "normkit: bnn(ghost=16) (4 channels) has ghost=16 but trains on batches of 8 samples, so it normalizes over "
        "the whole batch of 8, not ghost batches of 16; use ghost= at most the training batch size"]


def test_a_shorter_last_batch_after_full_ones_and_eval_do_not_warn() -> None:
    layer = normkit.build("bn(ghost=4)", 4)
    assert _ghost_warnings(layer, [16, 16, 3]) == []  # an epoch's last batch of 3 after batches of 16
    assert _ghost_warnings(normkit.build("bn(ghost=4)", 4).eval(), [2]) == []  # eval: running statistics
    assert _ghost_warnings(normkit.build("bn(ghost=4)", 4), [4, 2]) == []  # a batch of exactly ghost fits


@pytest.mark.parametrize(("spec", "shape", "channel_dim", "channels_last"), [
    ("bn(ghost=2)", (8, 4, 3, 3), 1, False),
    ("bn(ghost=4,momentum=none)", (8, 5, 7), -1, False),
    ("bn(ghost=3)", (9, 3, 4, 2), 1, True),
    ("bn(ghost=2,track_running_stats=false)", (6, 4, 5), 1, False),
])
def test_bn_ghost_batches_take_torchs_kernel_regrouped_and_equal_the_reference_path(
        spec: str, shape: tuple[int, ...], channel_dim: int, channels_last: bool) -> None:
    fused = normkit.build(spec, shape[channel_dim], channel_dim=channel_dim).double()
    with torch.no_grad():
        fused.weight.uniform_(0.5, 1.5)
        fused.bias.uniform_(-0.5, 0.5)
    reference = copy.deepcopy(fused)
    reference.recording = True  # the grouped reference path
    for step in range(2):
        x = torch.randn(shape, dtype=torch.float64, generator=torch.Generator().manual_seed(step)) * 2 + 0.5
        x = x.contiguous(memory_format=torch.channels_last) if channels_last else x
        xa, xb = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
        out, ref = fused(xa), reference(xb)
        assert "NativeBatchNormBackward0" in autograd_node_names(out)
        assert "NativeBatchNormBackward0" not in autograd_node_names(ref)
        assert out.is_contiguous(memory_format=torch.channels_last) == channels_last
        torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10)
        grad = torch.randn_like(out)
        out.backward(grad)
        ref.backward(grad)
        torch.testing.assert_close(xa.grad, xb.grad, rtol=1e-10, atol=1e-10)
        for name, buffer in reference.named_buffers():
            torch.testing.assert_close(dict(fused.named_buffers())[name], buffer, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(fused.weight.grad, reference.weight.grad, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(fused.bias.grad, reference.bias.grad, rtol=1e-10, atol=1e-10)
