"""normkit-lab: models, datasets and a training loop for paired-by-seed comparisons of norms.

Kept light on purpose: import `normkit_lab.training`, `normkit_lab.models`, `normkit_lab.datasets`
for the heavy parts. `compare_norms` (the Python API of `normkit compare`) loads them on first use.
"""

from typing import Any

__version__ = "0.1.0"
__all__ = ["ComparisonResult", "ExecutorOptions", "RunOptions", "compare_norms"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from normkit_lab import api

        return getattr(api, name)
    raise AttributeError(f"module 'normkit_lab' has no attribute {name!r}")
