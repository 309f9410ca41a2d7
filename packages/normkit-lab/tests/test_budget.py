"""Training budgets: `--budget steps=N | examples=N | epochs=N`. Every cell of a batch-size sweep trains
exactly the budget's steps, the schedule spread over them, and every row records the steps taken."""

from __future__ import annotations

import dataclasses
import math

import pytest

from normkit_lab.errors import ConfigError
from normkit_lab.records import RunResult, config_hash
from normkit_lab.runs.checks import check_config, planned_epochs
from normkit_lab.runs.schedule import lr_factor
from normkit_lab.runs.training import train_run
from normkit_lab.spec import TrainConfig
from normkit_lab.study.compare import create_store, run_compare, run_epochs
from normkit_lab.study.config import resolve
from normkit_lab.study.progress import Progress

# 40 fake training images: batch 4 makes 10 steps per pass, batch 16 makes 2
FAKE = {"dataset": "fake", "dataset_params": {"size": 40, "image_size": 8, "num_classes": 2},
        "model_params": {"width": 4}}


def test_a_steps_budget_trains_every_batch_size_exactly_that_many_steps(tmp_path):
    cfg = resolve({"norms": "bn,ln", "seeds": 2, "budget": "steps=13", "sweep": ["batch_size=4,16"], **FAKE})
    results = run_compare(cfg, create_store(cfg, tmp_path / "out"))
    by_cell: dict[int, set[tuple[int, ...]]] = {}
    for run in results.runs:
        assert run.status == "ok"
        by_cell.setdefault(run.cell["batch_size"], set()).add(tuple(e.steps for e in run.epochs))
    # batch 4: a full pass of 10 steps, then 3; batch 16: 2 steps per pass, the 7th pass cut to 1
    assert by_cell == {4: {(10, 13)}, 16: {(2, 4, 6, 8, 10, 12, 13)}}
    assert all(e.cpu_time_s > 0 for run in results.runs for e in run.epochs)
    assert "epochs" not in cfg.to_dict() and cfg.to_dict()["budget"] == "steps=13"


def test_the_schedule_spans_the_budget_not_the_passes():
    cfg = TrainConfig(**FAKE, batch_size=4, budget="steps=13", lr=0.1)
    result = train_run(cfg, "bn", seed=0)
    assert [e.steps for e in result.epochs] == [10, 13]
    # the second pass starts at step 10 of 13 on the cosine: 0.5 * (1 + cos(pi * 10 / 13))
    assert result.epochs[1].lr == pytest.approx(0.1 * 0.5 * (1 + math.cos(math.pi * 10 / 13)))
    factor = lr_factor("cosine", total_steps=13, steps_per_epoch=10)
    assert factor(0) == 1.0 and factor(12) < 0.02


def test_an_examples_budget_is_steps_times_the_batch():
    cfg = TrainConfig(**FAKE, batch_size=4, budget="examples=52")
    assert cfg.total_steps(10) == 13 and planned_epochs(cfg) == 2
    with pytest.raises(ConfigError, match="examples=30 is not a multiple of batch_size 4.*examples=32"):
        check_config(dataclasses.replace(cfg, budget="examples=30"), ["bn"])


def test_an_epoch_budget_is_the_epochs_and_leaves_the_config_hash_as_before():
    plain = resolve({"dataset": "digits", "norms": "bn", "epochs": 3})
    budget = resolve({"dataset": "digits", "norms": "bn", "budget": "epochs=3"})
    assert budget.train.epochs == 3 and budget.train.budget is None
    assert "budget" not in plain.to_dict()
    assert config_hash(plain.to_dict()) == config_hash(budget.to_dict())
    assert resolve({"dataset": "digits", "norms": "bn",
                    "budget": {"steps": 40}}).train.budget == "steps=40"  # YAML's mapping form


@pytest.mark.parametrize(("values", "message"), [
    ({"budget": "step=5"}, "budget unit 'step' is not one of epochs, steps, examples.*did you mean 'steps'"),
    ({"budget": "steps=0"}, "must be a whole number >= 1"),
    ({"budget": "steps"}, "budget must be UNIT=N"),
    ({"budget": "steps=5", "epochs": 2}, "would be unused; give the length once"),
    ({"budget": "epochs=2", "epochs": 3}, "disagree"),
    ({"budget": "steps=5", "sweep": ["epochs=1,2"]}, "epochs would change nothing"),
    ({"sweep": ["budget=steps=5"]}, "not a training key"),
])
def test_bad_budgets_are_refused_in_one_line(values, message):
    with pytest.raises(ConfigError, match=message):
        resolve({"norms": "bn", **values})


def test_a_warmup_longer_than_the_budget_is_refused():
    cfg = TrainConfig(**FAKE, batch_size=4, budget="steps=5", warmup_epochs=1)
    with pytest.raises(ConfigError, match="warmup_epochs 1 .10 steps at batch_size 4. is longer than the budget's 5"):
        check_config(cfg, ["bn"])


def test_progress_counts_each_cells_own_epochs():
    cfg = resolve({"norms": "bn", "seeds": 1, "budget": "steps=13", "sweep": ["batch_size=4,16"], **FAKE})
    from normkit_lab.study.plan import compare_plan

    small, large = compare_plan(cfg)
    of = run_epochs(cfg)
    assert (of(small), of(large)) == (2, 7)
    progress = Progress()
    progress.start(total=2, done=0, epochs=of, left=9)
    assert progress.epochs(large) == 7


def test_the_eta_counts_steps_so_cheap_and_costly_epochs_weigh_what_they_cost(monkeypatch):
    from normkit_lab.records import EpochRecord, RunId

    now = [0.0]
    monkeypatch.setattr("normkit_lab.study.progress.time.monotonic", lambda: now[0])
    small, large = RunId.of("bn", 0, cell={"batch_size": 2}), RunId.of("bn", 0, cell={"batch_size": 16})
    progress = Progress()
    progress.start(total=2, done=0, epochs={small: 1, large: 8}.get, left=1000, steps=lambda run_id: 500)
    progress.run_start(small)
    now[0] = 10.0
    progress.epoch_end(small, EpochRecord(0, 1, 0, 1, 0, None, 10, 1, 1, 0.1, steps=500))
    assert progress.eta_seconds() == pytest.approx(10.0)  # 500 steps in 10 s, 500 left (not 8 epochs of 10 s)
    progress.run_end(RunResult("bn", 0, "ok", [], 1, cell={"batch_size": 2}))
    assert progress.eta_seconds() == pytest.approx(10.0)


def test_plain_progress_lines_count_each_runs_own_epochs(tmp_path):
    import io

    from normkit_lab.study.progress import PlainProgress

    stream = io.StringIO()
    cfg = resolve({"norms": "bn", "seeds": 1, "budget": "steps=13", "sweep": ["batch_size=4,16"], **FAKE})
    run_compare(cfg, create_store(cfg, tmp_path / "out"), progress=PlainProgress(stream))
    lines = stream.getvalue().splitlines()
    assert any("[batch_size=4] epoch 2/2:" in line for line in lines)
    assert any("[batch_size=16] epoch 7/7:" in line for line in lines)
