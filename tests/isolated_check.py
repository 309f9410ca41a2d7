"""Run inside an environment holding one normkit distribution and only what it declares: every
plugin loads (strict), and every norm and stage the distribution registers builds, runs and passes
`normkit.testing.check_norm`.

    python tests/isolated_check.py normkit-normalnorm [--quick]

A stage is checked on top of a norm: the distribution's own norms first, then normkit-standard's
(bn, gn, ln), the first that builds. `--quick` runs only the build and the cheap checks. Used by
tests/test_isolated_install.py and by the `isolated` nox sessions. Prints one line per name;
exits 1 with the first failure.
"""

from __future__ import annotations

import os
import sys
import time

os.environ["NORMKIT_STRICT_PLUGINS"] = "1"

C = 32  # divisible by gn's default 32 groups
SHAPES = [(3, C, 3, 3), (4, C)]
QUICK_CHECKS = ["shapes", "state_dict", "pickle", "empty_batch"]
BASES = ("bn", "gn", "ln")


def _specs(distribution: str) -> list[tuple[str, str | None]]:
    """(spec, activation) to check for every norm and stage `distribution` registers."""
    from normkit import plugins

    mine = {p.name for p in plugins.plugins() if p.distribution == distribution}
    entries = [e for e in plugins.registry().entries if e.plugin in mine
               and e.kind not in ("model", "dataset", "preset", "workload")]  # data, read by normkit-lab
    for preset in (e for e in plugins.registry().entries if e.plugin in mine and e.kind == "preset"):
        # a preset is a data file: the wheel must ship it (normkit-lab reads it, see docs/reproduce.md)
        if "hypotheses:" not in preset.meta["path"].read_text(encoding="utf-8"):
            raise SystemExit(f"FAIL preset {preset.name!r}: its file {preset.meta['path']} is not a preset")
    own_norms = [e.name for e in entries if e.kind == "norm"]
    specs: list[tuple[str, str | None]] = [(name, None) for name in own_norms]
    for entry in entries:
        if entry.kind == "norm":
            continue
        activation = "relu" if entry.kind == "post_activation" else None
        spec = _stage_spec(entry.name, entry.kind, own_norms, activation)
        if spec is None:
            print(f"skipped {entry.kind} {entry.name!r}: no norm is installed to put it on")
        else:
            specs.append((spec, activation))
    return specs


def _stage_spec(stage: str, kind: str, own_norms: list[str], activation: str | None) -> str | None:
    import normkit
    from normkit import plugins

    errors = []
    for base in [n for n in own_norms if not normkit.parse(n).norm.entry.includes_activation] + list(BASES):
        spec = f"{base}+{stage}"
        try:
            normkit.build(spec, C, activation=activation)
        except normkit.NormkitError as exc:
            errors.append(f"{spec}: {exc}")
            continue
        return spec
    if not any(e.kind == "norm" for e in plugins.registry().entries):
        return None  # core alone: activations, with no norm installed to put them on
    raise SystemExit(f"FAIL {kind} {stage!r} builds on no norm installed here ({'; '.join(errors)})")


def main(argv: list[str]) -> int:
    distribution, quick = argv[0], "--quick" in argv
    import torch

    import normkit
    from normkit import plugins
    from normkit.testing import check_norm

    bad = [f"{p.name}: {p.error}" for p in plugins.plugins() if p.error]
    if bad:
        print(f"FAIL plugins failed to load: {bad}")
        return 1
    normkit.available()  # every composition's parts resolve
    specs = _specs(distribution)
    for spec, activation in specs:
        started = time.perf_counter()
        layer = normkit.build(spec, C, activation=activation)
        layer.train()
        if not torch.isfinite(layer(torch.randn(SHAPES[0]))).all():
            print(f"FAIL {spec}: non-finite output")
            return 1
        try:
            check_norm(spec, C, activation=activation, shapes=SHAPES, only=QUICK_CHECKS if quick else None,
                       skip=() if quick else ("compile", "gradients"))
        except AssertionError as exc:
            print(f"FAIL {exc}")
            return 1
        print(f"ok {spec} ({time.perf_counter() - started:.1f} s)")
    print(f"{distribution}: {len(specs)} norms and stages checked, plugins {[p.name for p in plugins.plugins()]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
