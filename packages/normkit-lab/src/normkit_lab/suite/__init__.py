"""`normkit suite`: the benchmark of record for normalization layers (docs/suite.md).

Every norm runs every registered workload under one protocol: the same tuning budget (the workload's
learning-rate candidates on separate tuning seeds, chosen on validation), then the comparison seeds;
each workload is an ordinary comparison in its own results directory. Across workloads the suite
scores time to a per-workload target (performance profiles) and ranks with a bootstrap interval, and
writes scorecard.json and a scorecard report.html.

    from normkit_lab.suite import available
    for w in available(): print(w.name, w.recipe(), w.question)
"""

from normkit_lab.suite.workloads import Workload, available, load_workload

__all__ = ["Workload", "available", "load_workload"]
