"""Runs: how one run trains. The `Trainer` protocol (`trainer`) and its three implementations (`builtin`:
normkit's own loop in `training`; `command`; `function`), the one job runner every executor calls
(`execute.run_job`), and what a run needs on the way: checkpoints, loggers, DDP (`distributed`),
devices and the machine's description. Imports the store, models, datasets and diagnostics.
"""
