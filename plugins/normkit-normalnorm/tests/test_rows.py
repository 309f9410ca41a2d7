"""lnn's C row kernel (`rows.c` through `rows.py`): the same function as the Inductor path's math
(`compiled.forward_math`/`backward_math`, run eagerly), its noise, edge values, threads, when it
is taken, and that a machine without a C compiler falls back."""

from __future__ import annotations

import logging
import math
import os
import subprocess
import sys

import pytest
import torch
from normkit import build
from torch.utils._python_dispatch import TorchDispatchMode

from normkit_normalnorm import compiled, rows
from normkit_normalnorm.functional import normality_norm
from normkit_normalnorm.fused import FusedConfig
from normkit_normalnorm.stage import NormalityStep

pytestmark = pytest.mark.skipif(rows.library() is None, reason="no C compiler for rows.c")


# rows.c against the eager float32 path: each is float32 rounding away from the float64 function, the
# eager path by up to ~6e-4 on rows with an outlier (its Newton step's one-pass moments; 300 seeds measured
# on an AVX2 machine) and the CPU's vector width moves where that happens, so two float32 paths are compared
# at 2e-3. Each path's own accuracy is tested against float64 (rows.c within 1e-4 of it, below); a wrong term, or
# other noise, moves values by 1e-2 or more.
EAGER_ATOL = 2e-3


def config(**changes) -> FusedConfig:
    base = {"partition": "layer", "groups": 1, "tokens": True, "training": True, "eps": 1e-5, "alpha": 1.0,
            "noise": 0.0, "momentum": 0.0, "lambda_min": None, "lambda_max": None, "detach_lambda": False}
    return FusedConfig(**{**base, **changes})


def tokens(n: int, s: int, c: int, seed: int = 0) -> torch.Tensor:
    """A skewed (N, C, S) view of channels-last tokens (the layer's x3 for channel_dim=-1)."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, s, c, generator=g).exp() * 1.5 - 0.5).transpose(1, 2)


def reference(x3, weight, bias, seed, dy, cfg, dtype=torch.float64):
    """(out, dx, dweight, dbias) of the Inductor path's math run eagerly in `dtype`."""
    cast = [None if t is None else t.to(dtype) for t in (x3, weight, bias)]
    out, y, log1p_a, power, *stats = compiled.forward_math(*cast, seed, cfg=cfg)
    dx, dw, db = compiled.backward_math(dy.to(dtype), cast[0], cast[1], y, log1p_a, power, bias is not None, *stats,
                                        cfg=cfg)
    return out, dx, dw, db


def kernel(x3, weight, bias, seed, dy, cfg):
    leaves = [None if t is None else t.clone().requires_grad_() for t in (x3, weight, bias)]
    out = rows.normality_rows(*leaves, seed, cfg)
    grads = torch.autograd.grad(out, [t for t in leaves if t is not None], dy)
    it = iter(grads)
    return out.detach(), *[None if t is None else next(it) for t in leaves]


def assert_close(got, want, rtol, atol):
    for name, a, b in zip(("out", "dx", "dweight", "dbias"), got, want):
        if b is None:
            assert a is None, name
            continue
        torch.testing.assert_close(a.double(), b.double(), rtol=rtol, atol=atol, msg=lambda m, n=name: f"{n}: {m}")


@pytest.mark.parametrize("options", [
    {}, {"alpha": 0.5}, {"lambda_min": 0.9, "lambda_max": 1.05}, {"lambda_min": 0.98}, {"detach_lambda": True},
    {"noise": 1.0}, {"noise": 0.4, "alpha": 0.7}], ids=str)
@pytest.mark.parametrize("affine", ["weight and bias", "weight", "none"])
def test_matches_the_inductor_paths_math(options, affine):
    """Against compiled.forward_math/backward_math in float64 (noise included: the same seed gives the
    same hash normal); 6 tokens of 48 channels (paired noise rows) and 7 tokens (unpaired)."""
    for n_tokens in (6, 7):
        x3 = tokens(1, n_tokens, 48)
        g = torch.Generator().manual_seed(1)
        weight = torch.rand(48, generator=g) + 0.5 if affine != "none" else None
        bias = torch.randn(48, generator=g) if affine == "weight and bias" else None
        dy = torch.randn(x3.shape, generator=g)
        seed = torch.tensor([987654], dtype=torch.int32)
        cfg = config(**options)
        assert_close(kernel(x3, weight, bias, seed, dy, cfg), reference(x3, weight, bias, seed, dy, cfg),
                     rtol=2e-5, atol=5e-5)


def test_float32_agrees_with_the_eager_float32_math_closely():
    """Both in float32, on a larger step: the same operations, so only rounding order differs."""
    x3 = tokens(4, 65, 192, seed=3)
    g = torch.Generator().manual_seed(4)
    weight, bias, dy = torch.rand(192, generator=g) + 0.5, torch.randn(192, generator=g), torch.randn(x3.shape)
    seed = torch.tensor([5], dtype=torch.int32)
    cfg = config(noise=1.0)
    assert_close(kernel(x3, weight, bias, seed, dy, cfg), reference(x3, weight, bias, seed, dy, cfg, torch.float32),
                 rtol=1e-4, atol=1e-4)


def test_noise_is_the_hash_normal_of_the_compiled_path():
    """y = x + noise * mean|x - mean x| * z with z = compiled.standard_normal (tokens order)."""
    x3 = tokens(2, 5, 64)
    seed = torch.tensor([42], dtype=torch.int32)
    clean = rows.normality_rows(x3, None, None, seed, config())
    noisy = rows.normality_rows(x3, None, None, seed, config(noise=0.5))
    scale = (clean - clean.mean(1, keepdim=True)).abs().mean(1, keepdim=True)
    z = compiled.standard_normal(x3, seed, tokens=True)
    torch.testing.assert_close(noisy, clean + 0.5 * scale * z, rtol=1e-5, atol=1e-5)


def test_edge_rows_stay_finite():
    """A constant token, a token with one huge outlier, a token of two channels, a single token."""
    x = torch.randn(3, 16)
    x[0] = 7.0
    x[1, 3] = 1e30
    seed = torch.tensor([1], dtype=torch.int32)
    for x3 in (x.unsqueeze(0).transpose(1, 2), torch.randn(1, 4, 2).transpose(1, 2), torch.randn(1, 1, 16).transpose(1, 2)):
        leaf = x3.clone().requires_grad_()
        out = rows.normality_rows(leaf, None, None, seed, config(noise=1.0))
        out.backward(torch.ones_like(out))
        assert torch.isfinite(out).all() and torch.isfinite(leaf.grad).all()
    constant = rows.normality_rows(x.unsqueeze(0).transpose(1, 2), None, None, seed, config())[0, :, 0]
    assert torch.equal(constant, torch.zeros(16))  # h = 0 exactly: the transform maps it to 0


def test_results_do_not_depend_on_the_thread_count():
    """Rows are independent and dweight/dbias are summed per chunk of rows, in chunk order, whichever
    thread took a chunk: every result is bit-identical on 1 and 2 threads and from run to run
    (200 tokens: more rows than chunks, so chunks hold several rows)."""
    x3 = tokens(2, 100, 96)
    weight, bias, dy = torch.rand(96) + 0.5, torch.randn(96), torch.randn(x3.shape)
    seed = torch.tensor([3], dtype=torch.int32)
    threads = torch.get_num_threads()
    try:
        results = []
        for count in (1, 2, 2):
            torch.set_num_threads(count)
            results.append(kernel(x3, weight, bias, seed, dy, config(noise=1.0)))
    finally:
        torch.set_num_threads(threads)
    for other in results[1:]:
        assert all(torch.equal(a, b) for a, b in zip(results[0], other))


def test_taken_for_per_token_layer_steps_from_its_own_threshold(monkeypatch):
    calls = []
    original = rows.normality_rows
    monkeypatch.setattr(rows, "normality_rows", lambda *a: calls.append(a[4]) or original(*a))
    monkeypatch.setattr(compiled, "run", lambda *a: pytest.fail("the Inductor path ran"))
    monkeypatch.setattr(rows, "MIN_ELEMENTS", 4096)
    lnn = build("lnn", 64, channel_dim=-1)
    x = torch.randn(2, 40, 64, requires_grad=True)
    lnn(x).sum().backward()  # 5120 values: taken
    assert len(calls) == 1 and calls[0].tokens and calls[0].noise == 1.0
    lnn(torch.randn(2, 20, 64, requires_grad=True)).sum().backward()  # below rows.MIN_ELEMENTS: eager
    monkeypatch.setenv("NORMKIT_NN_ROWS", "0")
    lnn(x).sum().backward()  # switched off, below Inductor's MIN_ELEMENTS: the eager path
    monkeypatch.setattr(compiled, "MIN_ELEMENTS", 4096)
    with pytest.raises(pytest.fail.Exception):
        lnn(x).sum().backward()  # switched off, above it: the Inductor path (failing here on purpose)
    assert len(calls) == 1


def test_layer_output_equals_the_eager_paths_function(monkeypatch):
    """Through the layer (kernel=auto, noise off): the rows path and the eager fused path (float32)
    both give the float64 eager function, to float32 rounding.

    Judged against float64, not against each other: each float32 path loses up to ~6e-4 (absolute,
    on outputs and gradients of size ~1-8) on rows with an outlier, through the one-pass moments
    of the Newton step; measured over 200 seeds on an AVX2 machine (CI failed once comparing the
    two float32 paths at 1e-4 on an unseeded input). A wrong term in lambda moves them by >1e-2.
    """
    monkeypatch.setattr(rows, "MIN_ELEMENTS", 1024)
    g = torch.Generator().manual_seed(7)
    lnn = build("lnn(noise=0)", 32, channel_dim=-1)
    x = torch.randn(3, 20, 32, generator=g).exp()
    with torch.no_grad():
        lnn.weight.copy_(torch.rand(32, generator=g) + 0.5)
        lnn.bias.copy_(torch.randn(32, generator=g))

    def run(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        leaf = x.to(dtype).clone().requires_grad_()
        out = lnn.to(dtype)(leaf)
        out.backward(torch.ones_like(out))
        return out.detach().double(), leaf.grad.double()

    rows_path = run(torch.float32)
    monkeypatch.setenv("NORMKIT_NN_COMPILE", "0")
    eager_path = run(torch.float32)
    exact = run(torch.float64)
    for path in (rows_path, eager_path):
        for got, want in zip(path, exact):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=EAGER_ATOL)


def test_without_a_c_compiler_the_other_paths_run_once_warned():
    """In a child process (the library is built once per process): CC names no compiler."""
    code = """
import logging, torch
from normkit_normalnorm import rows
logging.basicConfig(level=logging.WARNING, format="%(message)s")
from normkit_normalnorm.fused import FusedConfig
from torch.utils._python_dispatch import TorchDispatchMode
cfg = FusedConfig("layer", 1, True, True, 1e-5, 1.0, 0.0, 0.0, None, None, False)
x3 = torch.randn(2, 8, 4).transpose(1, 2)
print(rows.applies(x3, None, None, cfg), rows.applies(x3, None, None, cfg))
"""
    env = {**os.environ, "CC": "/nonexistent/normkit-test-cc"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120,
                          check=False)
    assert done.returncode == 0 and done.stdout.strip() == "False False", done.stderr[-2000:]
    warnings = [line for line in done.stderr.splitlines() if "row kernel" in line]
    assert len(warnings) == 1 and "lnn runs the same math on torch ops instead" in warnings[0], done.stderr[-2000:]


def test_a_library_that_cannot_be_loaded_falls_back_once_warned(monkeypatch, caplog):
    """Built, but not loadable (a temporary directory mounted noexec refuses to map it): one warning."""
    monkeypatch.setattr(rows, "_library", [])

    def refuse(path, *args, **kwargs):
        raise OSError(f"{path}: failed to map segment from shared object")

    monkeypatch.setattr(rows.ctypes, "CDLL", refuse)
    with caplog.at_level(logging.WARNING, logger="normkit.normalnorm"):
        assert rows.library() is None and rows.library() is None
    assert [r.getMessage().count("failed to map") for r in caplog.records] == [1]


def test_cc_is_split_as_a_shell_would(monkeypatch):
    monkeypatch.setenv("CC", "ccache gcc -m64")
    assert rows._compiler() == ["ccache", "gcc", "-m64"]
    monkeypatch.setenv("CC", " ")
    assert rows._compiler() is None or len(rows._compiler()) == 1


def test_applies_only_to_float32_channels_last_tokens():
    x3 = torch.randn(2, 8, 4).transpose(1, 2)
    assert rows.applies(x3, None, None, config())
    assert not rows.applies(x3.double(), None, None, config())
    assert not rows.applies(x3.contiguous(), None, None, config())  # (N, C, S) memory: not rows
    assert not rows.applies(x3, None, None, config(tokens=False))
    assert not rows.applies(x3, None, None, config(partition="instance"))
    assert not rows.applies(x3, torch.ones(4, dtype=torch.float64), None, config())
    assert math.isfinite(float(normality_norm(x3, None, None, partition="layer", tokens=True, training=True).sum()))


def test_logs_nothing_when_built(caplog):
    with caplog.at_level(logging.WARNING, logger="normkit.normalnorm"):
        assert rows.library() is not None
    assert caplog.records == []


def test_a_second_backward_with_retain_graph_reads_the_same_saved_values():
    """The saved buffers are recycled after backward, but not under retain_graph: a forward in between
    must not overwrite what the second backward reads."""
    x3 = tokens(2, 9, 32)
    weight = (torch.rand(32) + 0.5).requires_grad_()
    leaf = x3.clone().requires_grad_()
    seed = torch.tensor([9], dtype=torch.int32)
    out = rows.normality_rows(leaf, weight, None, seed, config(noise=1.0))
    first = torch.autograd.grad(out, (leaf, weight), torch.ones_like(out), retain_graph=True)
    rows.normality_rows(tokens(2, 9, 32, seed=5).requires_grad_(), weight, None, seed, config(noise=1.0))
    second = torch.autograd.grad(out, (leaf, weight), torch.ones_like(out))
    assert all(torch.equal(a, b) for a, b in zip(first, second))


@pytest.mark.parametrize(("spec", "shape", "channel_dim"), [("bnn", (6, 5, 3, 3), 1), ("lnn", (3, 5, 13), -1)])
def test_grouped_weight_gradient_is_the_same_whether_or_not_the_graph_is_kept(spec, shape, channel_dim):
    """rows.c makes the weight gradient's product dy * y in place of the saved y only when the graph is freed
    after the backward; under retain_graph torch multiplies and y stays for the next backward. All three give
    the same gradients bit for bit."""
    layer = build(spec, shape[channel_dim], channel_dim=channel_dim)
    x = torch.randn(shape, requires_grad=True)
    grad = torch.randn(shape)
    out = layer(x)
    inputs = (x, layer.weight, layer.bias)
    kept = [torch.autograd.grad(out, inputs, grad, retain_graph=True) for _ in range(2)]
    freed = torch.autograd.grad(out, inputs, grad)
    for got in (kept[1], freed):
        assert all(torch.equal(a, b) for a, b in zip(got, kept[0]))


# One lnn training step through the layer, in a child process (the library is built once per process):
# prints the warnings about the row kernel, and saves the output and the input's gradient to argv[1].
STEP = """
import logging, sys, torch
from normkit import build
logging.basicConfig(level=logging.WARNING, format="%(message)s")
torch.manual_seed(0)
lnn = build("lnn", 64, channel_dim=-1)
x = torch.randn(2, 200, 64).exp()  # 25,600 values: between the row kernel's 2^14 and Inductor's 2^20
x[0, 7, 3] = 1e30  # an outlier: its token is 0 on every path
x.requires_grad_()
out = lnn(x)
out.backward(torch.ones_like(out))
torch.save({"out": out.detach(), "grad": x.grad}, sys.argv[1])
"""


def step(tmp_path, name, cc=None):
    env = {k: v for k, v in os.environ.items() if k != "CC"}
    if cc is not None:
        env["CC"] = cc
    path = tmp_path / f"{name}.pt"
    done = subprocess.run([sys.executable, "-c", STEP, str(path)], capture_output=True, text=True, env=env,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    warnings = [line for line in done.stderr.splitlines() if "row kernel" in line]
    return torch.load(path), warnings


def test_without_the_row_kernel_lnn_draws_the_same_hash_noise(tmp_path):
    """A machine without a C compiler (or with a CC that cannot build the kernel) runs the same math with
    the same noise: before, it drew torch.randn there, and a resume elsewhere silently changed the noise."""
    built, none = step(tmp_path, "built")
    assert none == []
    for name, cc in (("absent", "/nonexistent/normkit-test-cc"), ("cplusplus", "g++"),
                     ("unbalanced", "gcc '-O2")):
        got, warnings = step(tmp_path, name, cc)
        if name == "cplusplus" and not warnings:  # g++ built it as C: the kernel itself ran
            assert torch.equal(got["out"], built["out"])
            continue
        assert len(warnings) == 1 and "on torch ops instead" in warnings[0], (name, warnings)
        for key in ("out", "grad"):
            assert torch.isfinite(got[key]).all(), (name, key)
            torch.testing.assert_close(got[key], built[key], rtol=1e-4, atol=EAGER_ATOL, msg=lambda m, n=name: f"{n}: {m}")
        assert torch.equal(got["out"][0, 7], torch.zeros(64))


def test_describe_says_which_path_and_compiler_without_building(monkeypatch):
    assert rows.describe()["path"] == "rows.c" and rows.describe()["compiler"]
    monkeypatch.setenv("CC", "/nonexistent/normkit-test-cc")
    assert rows.describe() == {"path": "torch ops", "compiler": None, "enabled": True}
    monkeypatch.setenv("CC", "gcc 'unbalanced")
    assert rows.describe()["path"] == "torch ops"


def _inference_pair(spec: str, shape: tuple[int, ...], channel_dim: int, monkeypatch) -> tuple:
    """(rows.c's inference output, the eager fused path's, the float64 reference's) of a trained-then-eval layer."""
    torch.manual_seed(0)
    layer = build(spec, shape[channel_dim], channel_dim=channel_dim)
    with torch.no_grad():
        layer.weight.uniform_(0.5, 1.5)
        layer.bias.normal_()
    x = torch.randn(shape).exp() - 0.8  # skewed, so lambda_hat and running_lambda are far from 1
    layer(x * 1.5)
    layer(x)  # running statistics (bnn) from two training steps
    layer.eval()
    with torch.no_grad():
        fast = layer(x)
        monkeypatch.setenv("NORMKIT_NN_ROWS", "0")
        eager = layer(x)
        reference = layer.double()(x.double())
        monkeypatch.delenv("NORMKIT_NN_ROWS")
    return fast, eager, reference


@pytest.mark.parametrize(("spec", "shape", "channel_dim"), [
    ("lnn", (2, 12, 48), -1), ("bnn", (3, 8, 5, 7), 1), ("bnn(lambda_min=0.5,lambda_max=1.2)", (3, 8, 35), 1)])
def test_inference_forward_is_one_call_with_the_eager_paths_values(spec, shape, channel_dim, monkeypatch):
    """lnn under no_grad and bnn in eval take rows.c's inference functions (no noise, nothing saved): the
    eager path's function to float32 rounding, and at least as close to the float64 reference."""
    monkeypatch.setattr(rows, "MIN_ELEMENTS", 512)
    if spec == "lnn":  # per-token rows take it from the compiled path's threshold (the grouped functions below it)
        monkeypatch.setattr(compiled, "MIN_ELEMENTS", 512)
    calls = []
    original = rows.inference
    monkeypatch.setattr(rows, "inference", lambda *a, **k: calls.append(out := original(*a, **k)) or out)
    fast, eager, reference = _inference_pair(spec, shape, channel_dim, monkeypatch)
    assert calls and calls[0] is not None  # taken (float32); the float64 call declined
    torch.testing.assert_close(fast, eager, rtol=1e-4, atol=EAGER_ATOL)
    assert (fast.double() - reference).abs().max() <= (eager.double() - reference).abs().max() + 1e-6


def test_inference_declines_where_the_eager_path_must_run():
    """Noise drawn in training (its torch.randn stream stays the eager path's), float64, other partitions
    and small inputs give None."""
    x3 = tokens(2, 300, 64)
    common = {"eps": 1e-5, "alpha": 1.0, "lambda_min": None, "lambda_max": None, "running_mean": None,
              "running_var": None, "running_lambda": None}
    assert rows.inference(x3, None, None, partition="layer", tokens=True, training=False, noise=1.0,
                          **common) is not None
    assert rows.inference(x3, None, None, partition="layer", tokens=True, training=True, noise=0.0,
                          **common) is not None
    assert rows.inference(x3, None, None, partition="layer", tokens=True, training=True, noise=1.0, **common) is None
    assert rows.inference(x3.double(), None, None, partition="layer", tokens=True, training=False, noise=0.0,
                          **common) is None
    assert rows.inference(x3, None, None, partition="group", tokens=True, training=False, noise=0.0,
                          **common) is None
    assert rows.inference(x3[:, :, :10], None, None, partition="layer", tokens=True, training=False, noise=0.0,
                          **common) is None
    assert rows.inference(x3.transpose(1, 2).contiguous().transpose(1, 2).contiguous(), None, None,
                          partition="batch", tokens=False, training=False, noise=0.0, **common) is None


def _record_grouped_calls(monkeypatch) -> list[FusedConfig]:
    """The configuration of every later call of rows.normality_groups (which still runs)."""
    calls: list[FusedConfig] = []
    original = rows.normality_groups
    monkeypatch.setattr(rows, "normality_groups", lambda *a: calls.append(a[3]) or original(*a))
    return calls


def _training_step(spec: str, shape: tuple[int, ...], channel_dim: int) -> tuple[torch.Tensor, ...]:
    """(out, dx, dweight, dbias, *buffers) of one seeded training step on a skewed input."""
    torch.manual_seed(0)
    layer = build(spec, shape[channel_dim], channel_dim=channel_dim)
    with torch.no_grad():
        layer.weight.uniform_(0.5, 1.5)
        layer.bias.normal_()
    x = (torch.randn(shape).exp() - 0.8).requires_grad_()
    out = layer(x)
    out.backward(torch.randn(shape))
    return out.detach(), x.grad, layer.weight.grad, layer.bias.grad, *(b.clone() for b in layer.buffers())


@pytest.mark.parametrize(("spec", "shape", "channel_dim"), [
    ("bnn", (8, 16, 4, 4), 1), ("lnn", (4, 8, 32), -1), ("lnn", (4, 8, 6, 6), 1), ("gnn(groups=4)", (4, 16, 3, 3), 1),
    ("inn", (4, 8, 5, 5), 1), ("bnn(detach_lambda=true,lambda_min=0.9,noise=0.7)", (8, 16, 9), 1),
    # every float rows.c receives packed (eps, alpha, noise, the clamp, the momentum) distinct from the others
    ("lnn(alpha=0.5,eps=0.001,noise=0.3,lambda_min=0.8,lambda_max=1.2)", (4, 8, 32), -1),
    ("bnn(alpha=0.7,eps=0.01,momentum=0.3,noise=0.2)", (8, 6, 3, 3), 1)])
def test_small_training_steps_take_the_grouped_functions_with_the_eager_paths_noise(spec, shape, channel_dim,
                                                                                     monkeypatch):
    """Under the compiled paths' thresholds a float32 training step of any partition is two calls into rows.c
    (nn_groups_forward_packed/backward_packed), drawing torch.randn's noise as the eager path does: outputs, gradients and
    running buffers agree with the eager path's to float32 rounding under the same seed."""
    calls = _record_grouped_calls(monkeypatch)
    grouped = _training_step(spec, shape, channel_dim)
    assert len(calls) == 1 and calls[0].training
    monkeypatch.setenv("NORMKIT_NN_ROWS", "0")
    eager = _training_step(spec, shape, channel_dim)
    assert len(calls) == 1  # switched off: the eager path
    for got, want in zip(grouped, eager, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=EAGER_ATOL)


@pytest.mark.parametrize(("spec", "shape", "channel_dim"), [
    ("bnn", (8, 16, 4, 4), 1),  # an even N: run k's noise pairs with run k + N / 2 inside the channel
    ("bnn(noise=0.7,momentum=0.3)", (7, 6, 3, 3), 1),  # an odd N: each value computes its own pair
    ("lnn", (4, 8, 6, 6), 1), ("gnn(groups=4)", (4, 16, 3, 3), 1), ("inn", (5, 8, 5, 5), 1),
    ("lnn", (4, 8, 32), -1)])
def test_grouped_steps_from_the_hash_noise_threshold_draw_the_compiled_paths_noise(spec, shape, channel_dim,
                                                                                    monkeypatch):
    """From rows.HASH_NOISE_FROM values (lowered to 0 here) the grouped functions draw compiled.standard_normal's
    hash noise in C, seeded as compiled._seed, so they take over the Inductor path's steps with its noise: the
    values agree with that path's math (run eagerly) to float32 rounding under the same seed. Another noise (or
    another pairing of its values) moves values by 1e-2 or more."""
    monkeypatch.setattr(rows, "HASH_NOISE_FROM", 0)
    calls = _record_grouped_calls(monkeypatch)
    grouped = _training_step(spec, shape, channel_dim)
    assert len(calls) == 1 and calls[0].noise > 0
    monkeypatch.setenv("NORMKIT_NN_COMPILE", "eager")  # compiled.forward_math/backward_math, uncompiled
    monkeypatch.setattr(compiled, "MIN_ELEMENTS", 0)
    hashed = _training_step(spec, shape, channel_dim)
    assert len(calls) == 1
    for got, want in zip(grouped, hashed, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_large_grouped_steps_do_not_depend_on_the_thread_count(monkeypatch):
    """From HASH_NOISE_FROM values (lowered here) the noise is drawn per value and a batch partition's weight/bias
    sums are made per channel in C: one order of arithmetic whichever thread takes a group, so 1 and 2 threads
    give the same bits."""
    monkeypatch.setattr(rows, "HASH_NOISE_FROM", 0)
    threads = torch.get_num_threads()
    try:
        results = []
        for count in (1, 2):
            torch.set_num_threads(count)
            results.append(_training_step("bnn", (8, 24, 5, 5), 1) + _training_step("gnn(groups=4)", (4, 16, 3, 3), 1))
    finally:
        torch.set_num_threads(threads)
    for one, two in zip(*results, strict=True):
        assert torch.equal(one, two)


def test_a_large_float32_step_runs_in_c_with_the_compiled_paths_noise(monkeypatch):
    """A bnn training step of 2^20 values (where Inductor's code used to run, compiling for about a minute on
    its first step): rows.c's grouped functions, nothing compiled, the hash noise; the same values as the compiled
    path's math under the same seed."""
    shape = (16, 64, 32, 32)
    assert math.prod(shape) == rows.HASH_NOISE_FROM == compiled.MIN_ELEMENTS
    calls = _record_grouped_calls(monkeypatch)
    monkeypatch.setattr(compiled, "run", lambda *a: pytest.fail("Inductor's path was taken"))
    grouped = _training_step("bnn", shape, 1)
    assert len(calls) == 1
    monkeypatch.undo()
    monkeypatch.setenv("NORMKIT_NN_COMPILE", "eager")
    hashed = _training_step("bnn", shape, 1)
    for got, want in zip(grouped, hashed, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


class _RecordOps(TorchDispatchMode):
    """The aten operations dispatched while active, and the sizes (values) of the tensors torch.empty/empty_like
    allocated, each in order."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []
        self.allocated: list[int] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        out = func(*args, **(kwargs or {}))
        if func in (torch.ops.aten.empty.memory_format, torch.ops.aten.empty_like.default):
            self.allocated.append(out.numel())
        return out


def _eval_forward(spec: str, shape: tuple[int, ...], channel_dim: int, grad: bool) -> torch.Tensor:
    """A seeded layer's output in eval after one training step, on a skewed input, under grad mode (the input
    requiring grad) or under no_grad."""
    torch.manual_seed(0)
    layer = build(spec, shape[channel_dim], channel_dim=channel_dim)
    if layer.weight is not None:
        with torch.no_grad():
            layer.weight.uniform_(0.5, 1.5)
            layer.bias.normal_()
    x = torch.randn(shape).exp() - 0.8
    layer(x)
    layer.eval()
    with torch.set_grad_enabled(grad):
        return layer(x.requires_grad_(grad)).detach()


@pytest.mark.parametrize(("spec", "shape", "channel_dim"), [
    ("gnn(groups=4)", (4, 16, 3, 3), 1), ("inn", (4, 8, 5, 5), 1), ("lnn", (4, 8, 6, 6), 1), ("lnn", (4, 8, 32), -1),
    ("bnn(track_running_stats=false)", (6, 8, 3, 3), 1), ("gnn(groups=4,affine=false)", (4, 16, 3, 3), 1)])
def test_inference_in_the_grouped_functions_writes_the_output_alone_with_the_same_bits(spec, shape, channel_dim,
                                                                                      monkeypatch):
    """Without a gradient and without noise the grouped forward keeps log1p|h| in its scratch and writes only the
    output (no saved values: no allocation larger than the output): the same bits as the same eval forward with
    gradients, which saves them."""
    calls = _record_grouped_calls(monkeypatch)
    with_grad = _eval_forward(spec, shape, channel_dim, grad=True)
    with _RecordOps() as recorded:
        without = _eval_forward(spec, shape, channel_dim, grad=False)
    assert [c.training for c in calls] == [True, False, True, False]  # a training step, then eval, twice
    assert (calls[1].grad_enabled, calls[3].grad_enabled) == (True, False)
    assert torch.equal(with_grad, without)
    assert max(recorded.allocated[-2:]) == math.prod(shape)  # the eval call's statistics and output


def test_inference_without_saved_values_stays_finite_on_constant_groups_and_outliers():
    """A constant group (variance 0), an outlier whose square overflows and a tiny batch: finite outputs, the
    same bits as the forward that saves its values."""
    layer = build("gnn(groups=2)", 4).eval()
    x = torch.randn(3, 4, 5)
    x[0, :2] = 7.0
    x[1, 3, 2] = 3e38
    outs = []
    for grad in (True, False):
        with torch.set_grad_enabled(grad):
            outs.append(layer(x.clone().requires_grad_(grad)).detach())
    assert torch.isfinite(outs[1]).all()
    assert torch.equal(*outs)


def test_large_inference_takes_the_grouped_functions_except_noise_and_token_rows(monkeypatch):
    """From compiled.MIN_ELEMENTS values (lowered here) an eval forward without gradients of a group, instance or
    layer partition takes the grouped functions (before, about 180 torch ops of the eager path); a training
    forward without gradients stays on the eager path (torch.randn's noise), and per-token rows on
    rows.inference's row kernel."""
    monkeypatch.setattr(compiled, "MIN_ELEMENTS", 64)
    calls = _record_grouped_calls(monkeypatch)
    fast = _eval_forward("gnn(groups=4)", (4, 16, 3, 3), 1, grad=False)
    assert [c.training for c in calls] == [True, False]
    monkeypatch.setenv("NORMKIT_NN_ROWS", "0")
    eager = _eval_forward("gnn(groups=4)", (4, 16, 3, 3), 1, grad=False)
    assert len(calls) == 2
    torch.testing.assert_close(fast, eager, rtol=1e-4, atol=EAGER_ATOL)
    monkeypatch.delenv("NORMKIT_NN_ROWS")
    layer = build("gnn(groups=4)", 16)
    with torch.no_grad():
        layer(torch.randn(4, 16, 3, 3))  # training, no gradient: the eager path
        build("lnn", 32, channel_dim=-1).eval()(torch.randn(4, 8, 32))  # token rows: rows.inference
    assert len(calls) == 2


def test_a_large_inference_forward_runs_in_c_with_the_eager_paths_values(monkeypatch):
    """gnn in eval under no_grad at 2^20 values: one call into rows.c, nothing saved; the eager path's values to
    float32 rounding, and bit for bit the grouped functions' values with gradients."""
    shape = (16, 64, 32, 32)
    assert math.prod(shape) == compiled.MIN_ELEMENTS
    calls = _record_grouped_calls(monkeypatch)
    fast = _eval_forward("gnn(groups=32)", shape, 1, grad=False)
    assert [(c.training, c.grad_enabled) for c in calls] == [(True, True), (False, False)]  # training, inference
    assert torch.equal(fast, _eval_forward("gnn(groups=32)", shape, 1, grad=True))
    monkeypatch.setenv("NORMKIT_NN_ROWS", "0")
    torch.testing.assert_close(fast, _eval_forward("gnn(groups=32)", shape, 1, grad=False), rtol=1e-4,
                               atol=EAGER_ATOL)


def test_grouped_layout_describes_the_groups_in_memory_order():
    """(count, runs, length, step, stride, s_inner, channels, dims) of rows.c's grouped functions, for a tensor in
    memory order: (N, C, *) by channels, (N, *, C) for channels-last tokens, whose only grouping is per token."""
    assert rows.grouped_layout((2, 6, 5), "batch", 1, False) == (6, 2, 5, 5, 30, 5, 6, (0, 2))
    assert rows.grouped_layout((2, 6, 5), "group", 3, False) == (6, 1, 10, 10, 0, 5, 6, (0, 2))
    assert rows.grouped_layout((2, 6, 5), "instance", 1, False) == (12, 1, 5, 5, 0, 5, 6, (0, 2))
    assert rows.grouped_layout((2, 6, 5), "layer", 1, False) == (2, 1, 30, 30, 0, 5, 6, (0, 2))
    assert rows.grouped_layout((2, 6, 1, 5), "batch", 1, False) == (6, 2, 5, 5, 30, 5, 6, (0, 2, 3))
    assert rows.grouped_layout((2, 5, 6), "layer", 1, True) == (10, 1, 6, 6, 0, 0, 6, (0, 1))
    assert rows.grouped_layout((2, 5, 3, 6), "layer", 1, True) == (30, 1, 6, 6, 0, 0, 6, (0, 1, 2))
    assert rows.grouped_layout((2, 5, 6), "batch", 1, True) is None


@pytest.mark.parametrize(("spec", "shape", "channel_dim"), [
    ("bnn", (8, 16, 4, 4), 1), ("lnn", (4, 8, 32), -1), ("lnn", (2, 3, 5, 12), -1), ("gnn(groups=4)", (4, 16, 3, 3), 1),
    ("bnn(momentum=none)", (6, 4, 3), 1)])
def test_the_layers_direct_call_equals_the_functional_route_bit_for_bit(spec, shape, channel_dim, monkeypatch):
    """The layer calls rows.c's grouped functions on its input as it is (stage.py's `_small_step`: no views of x,
    no autograd node but the Function's); `normality_compiled` reaches the same function through the (N, C, S)
    view. Two training steps each way under one seed: outputs, gradients and running buffers identical."""
    direct = _training_steps(spec, shape, channel_dim, "GroupsFunctionBackward")
    monkeypatch.setattr(NormalityStep, "_small_step", lambda *_: None)  # the functional route only
    functional = _training_steps(spec, shape, channel_dim, None)
    for got, want in zip(direct, functional, strict=True):
        assert torch.equal(got, want)


def _training_steps(spec: str, shape: tuple[int, ...], channel_dim: int, node: str | None) -> list[torch.Tensor]:
    """Two seeded training steps of a fresh layer; `node`: the output's autograd node, when given."""
    torch.manual_seed(0)
    layer = build(spec, shape[channel_dim], channel_dim=channel_dim)
    with torch.no_grad():
        layer.weight.uniform_(0.5, 1.5)
        layer.bias.normal_()
    results = []
    for _ in range(2):
        x = (torch.randn(shape).exp() - 0.8).requires_grad_()
        out = layer(x)
        assert node is None or type(out.grad_fn).__name__ == node  # the Function itself: no view of x around it
        out.backward(torch.randn(shape))
        results += [out.detach(), x.grad, layer.weight.grad.clone(), layer.bias.grad.clone(),
                    *(b.clone() for b in layer.buffers())]
    return results


@pytest.mark.parametrize("affine", ["weight and bias", "weight", "bias", "none"])
def test_inference_fuses_each_affine_into_the_transform_pass(affine, monkeypatch):
    """rows.c writes the output in the transform's last pass, with 1s and 0s standing in for a missing weight
    or bias (its scratch's first 2 n floats): each combination, with an outlier and a constant row, is the
    Inductor path's math without noise (float64) to float32 rounding."""
    monkeypatch.setattr(rows, "MIN_ELEMENTS", 1)
    x3 = tokens(2, 9, 40)
    x3[0, :, 0] = 3.0  # a constant token row
    x3[1, 5, 2] = 1e4  # an outlier
    g = torch.Generator().manual_seed(2)
    weight = torch.rand(40, generator=g) + 0.5 if "weight" in affine else None
    bias = torch.randn(40, generator=g) if "bias" in affine else None
    got = rows.inference(x3, weight, bias, partition="layer", tokens=True, training=False, eps=1e-5, alpha=1.0,
                         noise=0.0, lambda_min=None, lambda_max=None, running_mean=None, running_var=None,
                         running_lambda=None)
    cast = [None if t is None else t.double() for t in (x3, weight, bias)]
    want = compiled.forward_math(*cast, torch.tensor([0], dtype=torch.int32), cfg=config(training=False))[0]
    assert got is not None and torch.isfinite(got).all()
    torch.testing.assert_close(got.double(), want, rtol=2e-5, atol=5e-5)


@pytest.mark.parametrize(("spec", "shape", "channel_dim", "most"), [
    ("bnn", (8, 16, 4, 4), 1, 11), ("lnn", (4, 8, 32), -1, 10)])
def test_small_training_steps_run_a_handful_of_torch_ops(spec, shape, channel_dim, most):
    """At tiny shapes a training call costs its host work, so rows.c writes the affine output, weights the
    incoming gradient, makes the weight gradient's product and updates the running buffers itself, and the noise
    and scratch live in per-thread buffers: forward + backward dispatch at most `most` aten ops (35 and 37 before
    issue 40; torch's BatchNorm2d 7, LayerNorm 5)."""
    layer = build(spec, shape[channel_dim], channel_dim=channel_dim)
    x = torch.randn(shape, requires_grad=True)
    layer(x).sum().backward()  # first call: builds rows.c, fills the scratch
    x.grad = None
    grad = torch.ones(shape)
    with _RecordOps() as counted:
        layer(x).backward(grad)
    assert len(counted.ops) <= most, counted.ops


@pytest.mark.parametrize("affine", ["weight", "bias", "none"])
@pytest.mark.parametrize(("spec", "shape", "channel_dim"), [
    ("bnn", (6, 13, 3, 3), 1), ("lnn", (3, 5, 13), -1), ("gnn(groups=2)", (4, 6, 5), 1), ("inn", (3, 4, 7), 1)])
def test_grouped_functions_apply_any_affine_in_c(spec, shape, channel_dim, affine, monkeypatch):
    """rows.c writes y * weight + bias per channel (each value's channel from its memory offset) and scales
    the incoming gradient by the weight; with a weight only, a bias only or neither, outputs, gradients and
    running buffers (updated in C as torch's lerp_ does) agree with the eager path's under the same seed."""
    def step() -> tuple[torch.Tensor, ...]:
        torch.manual_seed(0)
        layer = build(spec, shape[channel_dim], channel_dim=channel_dim)
        with torch.no_grad():
            layer.weight.uniform_(0.5, 1.5)
            layer.bias.normal_()
        if affine != "weight":
            layer.weight = None
        if affine != "bias":
            layer.bias = None
        x = (torch.randn(shape).exp() - 0.8).requires_grad_()
        out = layer(x)
        out.backward(torch.randn(shape))
        grads = [p.grad for p in (layer.weight, layer.bias) if p is not None]
        return out.detach(), x.grad, *grads, *(b.clone() for b in layer.buffers())

    calls = []
    original = rows.normality_groups
    monkeypatch.setattr(rows, "normality_groups", lambda *a: calls.append(a) or original(*a))
    grouped = step()
    assert len(calls) == 1
    monkeypatch.setenv("NORMKIT_NN_ROWS", "0")
    eager = step()
    for got, want in zip(grouped, eager, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=EAGER_ATOL)
