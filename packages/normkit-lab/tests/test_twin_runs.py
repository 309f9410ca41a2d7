"""A norm that pools no batch trains the same run at every norm_batch: a comparison sweeping norm_batch trains
it once and records it in the other cells as that run, saying so (study/twins.py); norms with batch
statistics train in every cell."""

from __future__ import annotations

import io

from normkit_lab.records import SAME_RUN
from normkit_lab.runs.checks import norm_batch_changes
from normkit_lab.spec import TrainConfig
from normkit_lab.store.results import ResultsDir
from normkit_lab.study.compare import create_store, run_compare
from normkit_lab.study.config import resolve
from normkit_lab.study.progress import PlainProgress
from normkit_lab.study.rounds import cpu_minutes

SMALL = {"dataset": "digits", "batch_size": 4, "budget": "steps=6", "lr": 0.02, "cpu_threads": 1}


def test_only_norms_without_batch_statistics_are_proved_unchanged():
    cfg = TrainConfig(**{**SMALL, "norm_batch": 2})
    assert [norm_batch_changes(cfg, n) for n in ("bn", "bnn", "gn", "ln", "gn+pn", "bn+pn")] == [
        True, True, False, False, False, True]


def test_a_norm_batch_sweep_trains_a_batch_free_norm_once_and_records_the_copy(tmp_path):
    cfg = resolve({"norms": "bn,gn", "seeds": "0,1", "sweep": ["norm_batch=2,4"], **SMALL})
    printed = io.StringIO()
    run_compare(cfg, create_store(cfg, tmp_path / "sweep"), progress=PlainProgress(printed))
    assert "gn seed 1 [norm_batch=4]: ok, final val acc" in printed.getvalue()
    assert printed.getvalue().count("(the run trained in norm_batch=2, recorded here too)") == 2
    rows = ResultsDir.open(tmp_path / "sweep").rows()
    last = {(r["norm"], r["seed"], r["cell"]["norm_batch"]): r for r in rows}  # each run's last row
    for seed in (0, 1):
        assert SAME_RUN not in (last["gn", seed, 2].get("extras") or {})
        note = last["gn", seed, 4]["extras"][SAME_RUN]
        assert note["trained_in"] == {"norm_batch": 2} and "no layer pooling over the batch" in note["why"]
        assert last["gn", seed, 4]["test_acc"] == last["gn", seed, 2]["test_acc"]
        for size in (2, 4):  # bn pools the batch: trained in each cell
            assert SAME_RUN not in (last["bn", seed, size].get("extras") or {})
    assert cpu_minutes(ResultsDir.open(tmp_path / "sweep"))[1] == 6  # 8 runs recorded, 6 trained

    # the recorded copy is what training gn at norm_batch 4 gives
    alone = resolve({"norms": "gn", "seeds": "0,1", "norm_batch": 4, **SMALL})
    run_compare(alone, create_store(alone, tmp_path / "alone"))
    trained = {r["seed"]: r for r in ResultsDir.open(tmp_path / "alone").rows()}
    for seed in (0, 1):
        for key in ("test_acc", "val_acc", "train_loss", "test_loss"):
            assert trained[seed][key] == last["gn", seed, 4][key]
