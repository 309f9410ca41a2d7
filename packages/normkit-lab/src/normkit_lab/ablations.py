"""Stage ablations: for a norm, the arms that switch off one of its stages at a time.

A norm spec is a pipeline of stages, and plugins declare which of them an experiment can neutralize
(`ablations=` at registration: parameter values that switch a part off, or None to drop a whole
stage). `normkit compare --ablate` trains these arms beside the compared norms, and the analysis
(`normkit_lab.analysis.ablations`) asks, paired by seed, which stage carries a norm's difference:

    ablations_of("bnn")    # noise: bn+nn(noise=0.0); power transform: bn+nn(lambda_min=1.0,lambda_max=1.0)
    ablations_of("gn+pn")  # proxy step: gn(groups=8)  (pn's few groups kept)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import normkit


@dataclass(frozen=True)
class Ablation:
    """One arm: `norm` with the part `stage` (a plugin's label, of the spec part `part`) switched off."""

    norm: str
    stage: str
    part: str
    arm: str

    def as_dict(self) -> dict[str, str]:
        return dataclasses.asdict(self)


def ablations_of(norm: str) -> list[Ablation]:
    """The arms of one norm spec, in pipeline order; none for a norm without declared stages. An
    ablation whose values the spec already has (`bnn(noise=0)`'s noise) is no arm."""
    parsed = normkit.parse(norm)
    out = []
    for index, part in enumerate(parsed.parts):
        for stage, values in (part.entry.meta.get("ablations") or {}).items():
            if values is None:
                parts = [p for i, p in enumerate(parsed.parts) if i != index]
            elif all(part.params.get(k) == v for k, v in values.items()):
                continue
            else:
                parts = [dataclasses.replace(p, params={**p.params, **values}) if i == index else p
                         for i, p in enumerate(parsed.parts)]
            out.append(Ablation(parsed.text, stage, part.name, normkit.parse("+".join(map(str, parts))).text))
    return out


def ablation_arms(norms: Sequence[str]) -> list[str]:
    """The arms `--ablate` adds to `norms`: every norm's ablations, each spec once, none already compared."""
    arms: list[str] = []
    for norm in norms:
        arms += [a.arm for a in ablations_of(norm) if a.arm not in norms and a.arm not in arms]
    return arms
