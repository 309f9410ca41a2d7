"""The study: what to run and the comparison that runs it. `config` (flags and YAML to a `CompareConfig`),
`plan` (the tuning and comparison runs), `compare` (store, executor, progress, summary) and `progress`.
The top of the lab below the public API (`normkit_lab.api`): it may import every other room.
"""
