"""`normkit compare --norms bn,brn,evonorm-s0,frn,gn+ws,sn` runs on the default dataset (tiny settings)."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from normkit_cli.app import app

NORMS = "bn,brn,evonorm-s0,frn,gn+ws,sn"


def test_compare_runs_the_zoo_on_the_default_dataset(tmp_path) -> None:
    out = tmp_path / "cmp"
    result = CliRunner().invoke(app, ["compare", "--norms", NORMS, "--epochs", "1", "--batch-size", "128", "--seeds",
                                      "1",
                                      "--model-param", "depth=1", "--out", str(out)])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()]
    assert sorted(r["norm"] for r in rows) == sorted(NORMS.split(","))
    assert all(r["status"] == "ok" and 0.0 <= r["val_acc"] <= 1.0 for r in rows)


def test_list_shows_the_zoo_with_its_plugin() -> None:
    result = CliRunner().invoke(app, ["list", "--json"])
    assert result.exit_code == 0, result.output
    rows = {r["name"]: r for group in json.loads(result.output).values() for r in group if isinstance(r, dict)}
    for name in ("brn", "bgn", "sn", "evonorm-s0", "evonorm-b0", "frn", "dyt", "derf", "ln2d", "ws", "tlu"):
        assert rows[name]["plugin"] == "zoo", name
    assert rows["frn"]["includes_activation"] is True
