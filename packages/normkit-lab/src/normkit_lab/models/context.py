"""What a model factory gets: the norm spec and the data's shape, and a way to build each norm."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import nn

import normkit
from normkit.spec import Spec


class NormHostError(normkit.SpecError):
    """A norm that cannot sit at one position of a model (turned into one line by `build_model`)."""


class MissingActivation(NormHostError):
    """A spec with an activation or post-activation stage at a norm no activation follows."""


@dataclass
class ModelContext:
    """Norm spec and data shape for a model factory.

    `norm_layer` builds every norm of the model from the same spec, so a composed spec such as
    `gn+pn` or `bnn` applies at every position a norm sits (stem, blocks, shortcuts, final norm).
    """

    norm: str
    num_classes: int
    in_channels: int
    image_size: int

    def spec(self) -> Spec:
        return normkit.parse(self.norm)

    def has_stage(self, *kinds: str) -> bool:
        """True when the spec has a stage of one of `kinds` (e.g. "post_activation")."""
        return any(part.entry.kind in kinds for part in self.spec().stages)

    def post_activation_declares(self, param: str) -> bool:
        """True when the spec's post-activation step (e.g. `pn`) declares parameter `param`."""
        return any(part.entry.kind == "post_activation" and param in {p.name for p in part.entry.params}
                   for part in self.spec().stages)

    def require_downsampling(self, model: str, halvings: int) -> None:
        """Refuse images too small for a model that halves the resolution `halvings` times."""
        need = 2**halvings
        if self.image_size < need:
            raise normkit.SpecError(f"{model} downsamples its input by {need}, so it needs images of at "
                                    f"least {need}x{need} px, got {self.image_size}; use larger images "
                                    f"(e.g. --dataset-param image_size=32) or a smaller model")

    def norm_layer(self, channels: int, *, activation: str | None = None, channel_dim: int = 1,
                   **overrides: Any) -> nn.Module:
        """The norm for `channels` channels; `activation` is the one that directly follows it.

        The layer owns that activation (so post-activation steps can take it over); the model
        must not apply it again. A spec with an activation or post-activation stage cannot sit
        where no activation follows (e.g. before a residual add): that raises NormHostError.
        """
        if activation is None and self.has_stage("activation", "post_activation"):
            stages = "+".join(p.name for p in self.spec().stages if p.entry.kind != "step")
            raise MissingActivation(f"a norm of this model is not followed by an activation, so "
                                    f"'+{stages}' has no activation to act on")
        try:
            return normkit.build(self.norm, channels, channel_dim=channel_dim, activation=activation,
                                 **overrides)
        except normkit.SpecError as exc:
            raise NormHostError(str(exc)) from exc

