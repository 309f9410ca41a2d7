"""Analysis: from the store's rows to verdicts and pictures. `summary` (per-norm numbers), `verdicts`,
`pairs`, `interactions`, `diagnostic_verdicts`, `plots`, `report` and `report_html`. Reads the store and
the diagnostics' files only; never a trainer, an executor or the study.
"""
