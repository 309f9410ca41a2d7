"""Resume compares the versions the runs were made with (environment.json) with the running ones:
a change is refused (nothing written) unless allowed, and an allowed one is recorded."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from normkit.errors import NormkitError
from normkit_lab import compare_norms
from normkit_lab.errors import ConfigError
from normkit_lab.records import EpochRecord, RunResult
from normkit_lab.runs import builtin
from normkit_lab.runs import environment as lab_environment
from normkit_lab.store.results import ENVIRONMENT_FILE
from normkit_lab.study import compare, config
from normkit_lab.study.progress import Progress
from normkit_lab.study.versions import UncheckedVersions, differences

ENV = {"versions": {"torch": "2.5.0", "numpy": "2.0", "normkit": "0.1.0", "normkit-lab": "0.1.0"},
       "plugins": [{"name": "normalnorm", "distribution": "normkit-normalnorm", "version": "0.3.0", "error": None},
                   {"name": "tmp", "distribution": "(in-process)", "version": "0", "error": None}],
       "git_commit": {"cwd": "aaa", "normkit_lab_source": None}}


def copy(env: dict) -> dict:
    return json.loads(json.dumps(env))


def with_plugin_version(env: dict, version: str) -> dict:
    env = copy(env)
    env["plugins"][0]["version"] = version
    return env


def test_the_same_environment_has_no_differences():
    assert differences(ENV, copy(ENV)) == ([], [])


def test_training_versions_plugins_and_the_source_commit_are_compared_the_rest_is_not():
    now = with_plugin_version(ENV, "0.4.0")
    now["versions"].update(torch="2.6.0", numpy="2.1")  # numpy: not compared
    # the (in-process) plugin is gone: not a distribution, so not compared
    now["plugins"] = [*now["plugins"][:1], {"name": "zoo", "distribution": "normkit-zoo", "version": "1.0"}]
    now["git_commit"] = {"cwd": "bbb", "normkit_lab_source": "c947731" + "0" * 33}
    assert differences(ENV, now) == (["torch 2.5.0 -> 2.6.0", "normkit-normalnorm 0.3.0 -> 0.4.0",
                                      "normkit-zoo not installed -> 1.0"], [])
    saved = {**ENV, "git_commit": {"normkit_lab_source": "1df8d0e" + "0" * 33}}
    assert differences(saved, now)[0][-1] == "normkit-lab source 1df8d0e00000 -> c94773100000"


def test_what_an_older_environment_does_not_record_is_unknown_not_changed():
    assert differences({"python": "3"}, ENV) == ([], ["versions", "plugins"])


def _fake_train(cfg, norm, seed, *, on_epoch=None, **kwargs):
    return RunResult(norm, seed, "ok", [EpochRecord(0, 0.5, 0.5, 0.5, 0.8, None, 0.1, 100.0, 5.0, 0.1)], 10, {})


@pytest.fixture
def store_dir(tmp_path, monkeypatch) -> Path:
    """A results directory of one finished run, as the running environment wrote it."""
    monkeypatch.setattr(builtin, "train_run", _fake_train)
    cfg = config.build_config({"dataset": "digits", "norms": "bn", "seeds": "1", "epochs": 1, "batch_size": 128,
                               "device": "cpu"})
    store = compare.create_store(cfg, tmp_path / "out")
    compare.run_compare(cfg, store, progress=Progress())
    return store.path


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def fake_older_plugin(d: Path) -> dict:
    """Edit environment.json as if the runs were made with normkit-normalnorm 0.0.1."""
    env = json.loads((d / ENVIRONMENT_FILE).read_text())
    for plugin in env["plugins"]:
        if plugin["distribution"] == "normkit-normalnorm":
            plugin["version"] = "0.0.1"
    (d / ENVIRONMENT_FILE).write_text(json.dumps(env))
    return env


def test_resume_in_the_same_environment_passes_and_writes_nothing(store_dir, recwarn):
    before = snapshot(store_dir)
    compare.open_store(store_dir)
    assert snapshot(store_dir) == before and not recwarn.list


def test_a_changed_version_is_refused_in_one_line_and_nothing_is_written(store_dir):
    fake_older_plugin(store_dir)
    before = snapshot(store_dir)
    with pytest.raises(ConfigError, match=r"normkit-normalnorm 0\.0\.1 -> ") as info:
        compare.open_store(store_dir)
    assert "\n" not in str(info.value) and "--allow-version-change" in str(info.value)
    assert snapshot(store_dir) == before


def resume_allowed(store_dir: Path) -> None:
    """A resume allowed to continue under other versions, going ahead (its runs are all finished)."""
    cfg, store = compare.open_store(store_dir, allow_version_change=True)
    compare.run_compare(cfg, store, progress=Progress(), allow_version_change=True)


def test_an_allowed_change_is_recorded_and_the_next_resume_compares_with_it(store_dir):
    original = fake_older_plugin(store_dir)
    before = snapshot(store_dir)
    compare.open_store(store_dir, allow_version_change=True)
    assert snapshot(store_dir) == before  # recorded only once the resume goes ahead
    resume_allowed(store_dir)
    env = json.loads((store_dir / ENVIRONMENT_FILE).read_text())
    (resume,) = env.pop("resumes")
    assert env == original  # the original environment is kept as it was
    assert [c for c in resume["changes"] if c.startswith("normkit-normalnorm")] == [
        f"normkit-normalnorm 0.0.1 -> {lab_environment._version('normkit-normalnorm')}"]
    assert resume["environment"]["versions"] == lab_environment.environment("cpu")["versions"]
    before = snapshot(store_dir)
    compare.open_store(store_dir)  # the versions are now those of the last recorded resume
    assert snapshot(store_dir) == before


def test_two_allowed_resumes_at_once_record_the_change_once(store_dir):
    """environment.json's read-compare-record runs under a lock: the second resume sees the first's
    record (the versions now match it), so one entry, and the file stays valid JSON."""
    import threading

    fake_older_plugin(store_dir)
    errors: list[BaseException] = []

    def resume_once() -> None:
        try:
            resume_allowed(store_dir)
        except BaseException as err:  # noqa: BLE001 (reported by the assertion below)
            errors.append(err)

    threads = [threading.Thread(target=resume_once) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(json.loads((store_dir / ENVIRONMENT_FILE).read_text())["resumes"]) == 1


@pytest.mark.parametrize("older", ["missing", "keys missing"])
def test_an_older_directory_keeps_resuming_with_one_warning(store_dir, older):
    path = store_dir / ENVIRONMENT_FILE
    if older == "missing":
        path.unlink()
    else:
        path.write_text('{"python": "3"}')
    lines: list[str] = []
    compare.open_store(store_dir, warn=lines.append)
    assert len(lines) == 1 and "cannot check" in lines[0] and ENVIRONMENT_FILE in lines[0]
    with pytest.warns(UncheckedVersions):
        compare.open_store(store_dir)


def test_a_damaged_environment_json_keeps_its_one_line_error(store_dir):
    (store_dir / ENVIRONMENT_FILE).write_text("{broken")
    with pytest.raises(ConfigError, match="environment.json' line 1 is not valid JSON"):
        compare.open_store(store_dir)


def test_compare_norms_resume_takes_the_same_option(store_dir):
    fake_older_plugin(store_dir)
    with pytest.raises(NormkitError, match="allow_version_change=True"):
        compare_norms("bn", resume=store_dir, progress=Progress())
    result = compare_norms("bn", resume=store_dir, progress=Progress(), allow_version_change=True)
    assert len(result.runs) == 1
    assert len(json.loads((store_dir / ENVIRONMENT_FILE).read_text())["resumes"]) == 1


def test_an_allowed_change_is_not_recorded_when_the_resume_is_then_refused(tmp_path):
    """--allow-version-change with a script changed since the runs: the resume is refused by the script's
    check after the versions were allowed, and environment.json stays as it was."""
    script = tmp_path / "train.py"
    script.write_text("import json\nprint('normkit: ' + json.dumps({'epoch': 0, 'val_acc': 0.9, 'test_acc': 0.9}))\n")
    first = compare_norms("bn", command=f"{sys.executable} train.py", command_dir=str(tmp_path), seeds=1,
                          out=tmp_path / "out", progress=Progress())
    fake_older_plugin(first.path)
    script.write_text(script.read_text() + "# changed\n")
    before = snapshot(first.path)
    with pytest.raises(NormkitError, match="changed"):
        compare_norms("bn", resume=first.path, progress=Progress(), allow_version_change=True)
    assert snapshot(first.path) == before


def test_a_version_deleted_from_environment_json_is_a_change_not_a_check_turned_off():
    saved = copy(ENV)
    del saved["versions"]["torch"]
    assert differences(saved, copy(ENV)) == (["torch (not recorded) -> 2.5.0"], [])


def test_the_c_compiler_kernels_are_built_with_is_recorded_and_compared():
    """normalnorm's lnn row kernel runs where a C compiler is, its torch-ops fallback elsewhere: the same
    noise, values equal to float32 rounding only. environment.json records the compiler; a resume on a
    machine without one (or with another) is a change."""
    recorded = lab_environment.environment("cpu")["c_compiler"]
    assert recorded is None or isinstance(recorded, str)
    saved = {**copy(ENV), "c_compiler": "gcc (Debian 12.2.0-14) 12.2.0"}
    assert differences(saved, {**copy(ENV), "c_compiler": None}) == (
        ["C compiler 'gcc (Debian 12.2.0-14) 12.2.0' -> none (kernels run on torch ops)"], [])
    assert differences(saved, copy(saved)) == ([], [])
    assert differences(copy(ENV), {**copy(ENV), "c_compiler": None}) == ([], [])  # older directories: not recorded
