"""The function trainer: a Python function as a run (`compare_norms(..., train=my_train)`).

    def my_train(norm: str, seed: int, *, cell: dict, report) -> None:
        model = normkit.convert(make_model(), norm)     # or normkit.build(...)
        ...
        report(epoch=epoch, val_acc=..., test_acc=...)

`cell` holds the run's swept and tuned values; a function that also takes `run_dir` gets the
run's directory (kept between attempts). `report` checks every record as the command trainer
checks a `normkit:` line, so a bad value raises in the function, at the call that reports it;
any exception is the run's failure, recorded with its one line, and the others go on.

The function travels to the run by reference (pickle: its module and name), so for `--jobs`,
Ray and SLURM it must be importable there: defined at the top level of a module or of the
script that calls `compare_norms` (under `if __name__ == "__main__":`), not a lambda or a
nested function. In this process (the default) any callable works.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import pickle
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import normkit
from normkit_lab.errors import ConfigError, MachineFailure, one_line
from normkit_lab.runs.external import (
    Records,
    check_external,
    plain_config,
    record_or_check_code,
    require_metric,
    tuning_score,
)
from normkit_lab.runs.failures import machine_failures
from normkit_lab.runs.template import file_hash
from normkit_lab.runs.trainer import RunContext
from normkit_lab.store.safe_paths import make_dirs

if TYPE_CHECKING:
    from normkit_lab.records import RunId, RunResult
    from normkit_lab.spec import CompareConfig, TrainConfig


def reference(function: Callable[..., Any]) -> str:
    """`module:qualname` of a function, as config.yaml records it."""
    module = getattr(function, "__module__", None) or "?"
    return f"{module}:{getattr(function, '__qualname__', type(function).__name__)}"


def source_files(function: Callable[..., Any]) -> dict[str, str]:
    """The hash of the file that defines `function` (none for a builtin or an interactive definition)."""
    try:
        path = inspect.getsourcefile(inspect.unwrap(function))
    except TypeError:
        return {}
    if path is None or not Path(path).is_file():
        return {}
    return {str(Path(path).resolve()): file_hash(Path(path))}


@dataclass(frozen=True)
class FunctionTrainer:
    """Calls `function(norm, seed, cell=..., report=...)` once per run."""

    function: Callable[..., Any]
    metric: str
    select: str = "final"
    percent: bool = False  # the function reports accuracies in percent (`CompareConfig.accuracies_in_percent`)
    kind: str = "function"

    @classmethod
    def of(cls, cfg: CompareConfig, function: Callable[..., Any]) -> FunctionTrainer:
        return cls(function, cfg.metric, cfg.select, cfg.accuracies_in_percent)

    def check(self, cfg: CompareConfig, parallel: int = 1) -> None:
        """A callable taking (norm, seed, *, cell, report); picklable by reference when runs train in other
        processes; its source file unchanged on resume."""
        if not callable(self.function):
            raise ConfigError(f"train must be a function (norm, seed, *, cell, report), not {self.function!r}")
        try:
            inspect.signature(self.function).bind("bn", 0, cell={}, report=print)
        except TypeError as exc:
            raise ConfigError(f"train function {reference(self.function)} cannot be called as "
                              f"train(norm, seed, *, cell=..., report=...): {exc}") from None
        except ValueError:
            pass  # no signature to inspect (a builtin): called as is
        if parallel > 1:
            try:
                pickle.dumps(self.function)
            except Exception as exc:  # noqa: BLE001 - any pickling error says the same
                raise ConfigError(f"train function {reference(self.function)} cannot be sent to worker processes "
                                  f"({type(exc).__name__}); define it at the top level of a module or script, "
                                  f"not as a lambda or nested function") from None
        check_external(cfg)
        for norm in cfg.norms:
            normkit.parse(norm)
        cfg.train_function = reference(self.function)
        record_or_check_code(cfg, source_files(self.function), "with the code as it was")

    def run_config(self, run_id: RunId, base: TrainConfig) -> TrainConfig:
        return plain_config(run_id, base)

    def tuning_score(self, cfg: CompareConfig, run: RunResult | None, run_id: RunId) -> float:
        return tuning_score(cfg, run)

    def train(self, job: Any, context: RunContext) -> RunResult:
        from normkit_lab.records import RunResult
        from normkit_lab.runs.training import seed_everything

        run_dir = make_dirs(Path(job.store), context.run_dir).resolve()  # the function may chdir
        records = Records(run_dir, context.on_epoch, context.loggers, self.percent)
        kwargs: dict[str, Any] = {"cell": {**dict(job.run.cell), **dict(job.run.tuned)}, "report": _reporter(records)}
        if _takes(self.function, "run_dir"):
            kwargs["run_dir"] = run_dir
        seed_everything(job.run.seed)  # as the built-in trainer does; the function may seed again
        cwd = os.getcwd()
        started, cpu_started = time.monotonic(), time.process_time()
        try:
            self.function(job.run.norm, job.run.seed, **kwargs)
        except MachineFailure:  # normkit's own write of a report failed: the machine's, not the function's
            raise
        except (Exception, GeneratorExit) as exc:  # whatever it raises is this run's failure, an OSError too
            raise FunctionFailed(_failure_text(exc, run_dir, job.store)) from exc
        finally:
            os.chdir(cwd)  # an os.chdir inside the function must not move the comparison's files
        timing = {"wall_s": round(time.monotonic() - started, 3),
                  "cpu_s": round(time.process_time() - cpu_started, 3)}  # this process's CPU, all threads
        records.require_this_attempt("the function never called report(...)")
        epochs = records.epochs()
        require_metric(epochs, self.metric, self.select, self.percent)
        params = next((r.metrics["params"] for r in reversed(epochs) if "params" in r.metrics), None)
        for record in epochs:
            record.metrics.pop("params", None)
        return RunResult(norm=normkit.parse(job.run.norm).text, seed=job.run.seed, status="ok", epochs=epochs,
                         params=params, extras={"function": {"name": reference(self.function), **timing}},
                         trainer=self.kind)


class FunctionFailed(normkit.NormkitError):
    """The train function raised: the run's failure, recorded with this one line (the traceback is kept
    in the run's directory)."""


TRACEBACK_FILE = "traceback.txt"


def _failure_text(exc: BaseException, run_dir: Path, store: str) -> str:
    """`Type: message` of what the function raised, and where its traceback was saved. Safe for any
    exception, one whose __str__ raises too."""
    import traceback

    try:
        message = str(exc)
    except Exception:  # noqa: BLE001 - a broken __str__ must not turn the run's failure into a crash
        message = "(its message could not be printed)"
    where = ""
    with contextlib.suppress(OSError):
        (run_dir / TRACEBACK_FILE).write_text("".join(traceback.format_exception(exc)), encoding="utf-8")
        where = f" (traceback: {os.path.relpath(run_dir / TRACEBACK_FILE, Path(store).resolve())})"
    return one_line(f"{type(exc).__name__}: {message or '(no message)'}", 400) + where


def _reporter(records: Records) -> Callable[..., None]:
    def report(epoch: int | None = None, **metrics: Any) -> None:
        """Report one epoch's metrics (checked at once; a bad value raises ReportError here)."""
        values = {k: (v.item() if hasattr(v, "item") else v) for k, v in metrics.items()}
        if epoch is not None:
            values["epoch"] = int(epoch.item()) if hasattr(epoch, "item") else epoch
        with machine_failures("a train function's report"):
            records.add(values)

    return report


def _takes(function: Callable[..., Any], name: str) -> bool:
    try:
        parameters = inspect.signature(function).parameters
    except (TypeError, ValueError):
        return False
    return name in parameters or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
