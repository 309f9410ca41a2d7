"""The random-net experiment, the training callback and the diagnostics report."""

from __future__ import annotations

import json

import pytest

from normkit_lab.diagnostics import DiagnosticsCallback, DiagnosticsSettings, random_net_power, render, write_report
from normkit_lab.diagnostics.report import DIAGNOSTICS_JSON, DIAGNOSTICS_MD
from normkit_lab.records import RunResult
from normkit_lab.runs.training import train_run
from normkit_lab.spec import TrainConfig

SEEDS = (0, 1, 2)


def deep_half_dataset_share(norm: str, seed: int, depth: int = 12) -> tuple[float, float]:
    """(first layer's, mean of the deeper half's) dataset-scale share in a small random net."""
    shares = [s["dataset"] for s in random_net_power(norm, depth=depth, width=16, batch=16, image_size=12,
                                                      seed=seed)]
    deep = shares[depth // 2:]
    return shares[0], sum(deep) / len(deep)


@pytest.mark.parametrize("seed", SEEDS)
def test_random_net_ln_collapses_with_depth_while_bn_and_ln_pn_do_not(seed):
    ln_first, ln_deep = deep_half_dataset_share("ln", seed)
    _, bn_deep = deep_half_dataset_share("bn", seed)
    _, pn_deep = deep_half_dataset_share("ln+pn", seed)
    assert ln_deep > ln_first + 0.3  # grows with depth
    assert bn_deep < 0.1 and pn_deep < 0.1
    assert ln_deep > 3 * max(bn_deep, pn_deep)


TINY = TrainConfig(dataset="digits", epochs=2, batch_size=64, model_params={"width": 8, "depth": 2})
SETTINGS = DiagnosticsSettings(channels=4, batches=2, batch_size=32, draws=1)


@pytest.fixture(scope="module")
def runs():
    return [train_run(TINY, norm, seed=0, callbacks=[DiagnosticsCallback(SETTINGS)]) for norm in ("bn", "bnn")]


def test_callback_records_init_final_lambdas_and_robustness(runs):
    bn, bnn = runs
    diag = bnn.extras["diagnostics"]
    json.dumps(diag)  # JSON-able as returned
    assert [r["depth"] for r in diag["init"]] == [1, 2] == [r["depth"] for r in diag["final"]]
    assert [e["epoch"] for e in diag["lambda"]] == [0, 1, 2]
    assert all(row["mean"] == 1.0 for row in diag["lambda"][0]["layers"])  # running lambda starts at 1
    table = diag["noise_robustness"]["table"]
    assert [(c["k"], c["l"]) for c in table] == [(1, 2)] and table[0]["zeta"] > 0
    assert bn.extras["diagnostics"]["lambda"] == []


def test_callback_records_robustness_at_initialization_too(runs):
    """zeta at initialization (batch statistics), so a hypothesis can read its change from init by seed."""
    from normkit_lab.reproduce.outcomes import run_measures

    diag = runs[1].extras["diagnostics"]
    init = diag["init_noise_robustness"]["table"]
    assert [(c["k"], c["l"]) for c in init] == [(1, 2)] and init[0]["zeta"] > 0
    assert init[0]["zeta"] != diag["noise_robustness"]["table"][0]["zeta"]
    change = run_measures(diag, "init")
    assert change["zeta"] == pytest.approx(diag["noise_robustness"]["table"][0]["zeta"] - init[0]["zeta"])
    assert change["qq_r2 depth 2"] == pytest.approx(diag["final"][1]["qq_r2"] - diag["init"][1]["qq_r2"])


def test_callback_does_not_change_training(runs):
    plain = train_run(TINY, "bnn", seed=0)
    assert [e.val_loss for e in plain.epochs] == [e.val_loss for e in runs[1].epochs]


def test_write_report_and_render(runs, tmp_path):
    written = write_report(tmp_path, runs, ["bn", "bnn"])
    names = {p.name for p in written}
    assert {DIAGNOSTICS_JSON, DIAGNOSTICS_MD} <= names
    saved = json.loads((tmp_path / DIAGNOSTICS_JSON).read_text())
    assert list(saved["norms"]) == ["bn", "bnn"]
    text = (tmp_path / DIAGNOSTICS_MD).read_text()
    for heading in ("Q-Q normality", "Power shares, bnn", "Running lambda", "Noise robustness"):
        assert heading in text
    (tmp_path / DIAGNOSTICS_MD).unlink()
    assert (tmp_path / DIAGNOSTICS_MD) in render(tmp_path)
    pytest.importorskip("matplotlib")
    assert {"diagnostics_normality.png", "diagnostics_power.png", "diagnostics_lambda.png",
            "diagnostics_noise.png"} <= names


def test_write_report_without_diagnostics_writes_nothing(tmp_path):
    plain = RunResult("bn", 0, "ok", [], params=10)
    assert write_report(tmp_path, [plain]) == []
    assert not (tmp_path / DIAGNOSTICS_JSON).exists()
