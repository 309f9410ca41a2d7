"""The store: one results directory per comparison (`results.ResultsDir`: config.yaml, runs.jsonl, summary
files), its row format and the one grouping of rows by run identity, plus the file primitives it
rests on (atomic writes, safe paths, locks). Imports only the top-level modules (records, spec, errors).
"""
