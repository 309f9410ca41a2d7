"""Representation diagnostics: how a norm shapes what flows through the network.

    normality      Q-Q R^2 of post-norm values per layer (normality-normalization paper, Figure 5)
    power          the four-term power decomposition (proxy-normalization paper, section 3)
    robustness     noise robustness zeta_(k,l) (normality-normalization paper, Definition 5.1)
    lambdas        running lambda of normality-norm layers
    random_net     the proxy-normalization paper's random-net experiment (Figure 2), CPU-sized
    callback       DiagnosticsCallback for `train_run` (what `normkit compare --diagnostics` uses)
    report         write_report / render: diagnostics.json, diagnostics.md and PNGs

See docs/diagnostics.md.
"""

from normkit_lab.diagnostics.callback import DiagnosticsCallback, DiagnosticsSettings, callbacks_for
from normkit_lab.diagnostics.lambdas import estimated_lambdas, running_lambdas
from normkit_lab.diagnostics.measures import measure_layers
from normkit_lab.diagnostics.normality import qq_r2
from normkit_lab.diagnostics.power import PowerAccumulator, power_shares
from normkit_lab.diagnostics.random_net import random_net_power
from normkit_lab.diagnostics.report import has_diagnostics, render, write_report
from normkit_lab.diagnostics.robustness import noise_robustness

__all__ = [
    "DiagnosticsCallback",
    "DiagnosticsSettings",
    "PowerAccumulator",
    "callbacks_for",
    "estimated_lambdas",
    "has_diagnostics",
    "measure_layers",
    "noise_robustness",
    "power_shares",
    "qq_r2",
    "random_net_power",
    "render",
    "running_lambdas",
    "write_report",
]
