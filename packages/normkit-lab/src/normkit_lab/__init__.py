"""normkit-lab: models, datasets and a training loop for paired-by-seed comparisons of norms.

Laid out along a run's path, each folder importing only those below it (docs/lab-layout.md):
study/ -> executors/ -> runs/ -> diagnostics/, models/, datasets/ -> store/ -> leaf modules; analysis/ reads store/.

Kept light on purpose: import `normkit_lab.runs.training`, `normkit_lab.models`, `normkit_lab.datasets`
for the heavy parts. `compare_norms` (the Python API of `normkit compare`) loads them on first use.
"""

from typing import Any

__version__ = "0.1.0"
__all__ = ["ComparisonResult", "ExecutorOptions", "RunOptions", "compare_norms", "read_result", "report_metrics"]


def __getattr__(name: str) -> Any:
    if name == "report_metrics":  # for training scripts: imports nothing heavy
        from normkit_lab.reporting import report_metrics

        return report_metrics
    if name in __all__:
        from normkit_lab import api

        return getattr(api, name)
    raise AttributeError(f"module 'normkit_lab' has no attribute {name!r}")
