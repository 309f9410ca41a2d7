"""Where a transformer's norms sit around each sublayer f (attention or MLP), shared by GPT and ViT.

- pre (GPT-2, ViT): x + f(norm(x)), a final norm before the head;
- post (original Transformer): norm(x + f(x)), no final norm (every block ends in one);
- peri (Peri-LN, Kim et al., ICML 2025; the "sandwich" norm of CogView, Gemma 2/3, OLMo 2):
  x + norm_out(f(norm(x))), a final norm before the head.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor, nn

from normkit.errors import SpecError

PLACEMENTS = ("pre", "post", "peri")
ALIASES = {"sandwich": "peri"}


def check_placement(model: str, placement: str) -> str:
    """The canonical placement name (`sandwich` is `peri`), or one line naming the choices."""
    placement = ALIASES.get(placement, placement)
    if placement not in PLACEMENTS:
        raise SpecError(f"{model}: placement must be one of {', '.join(PLACEMENTS)} (sandwich = peri), "
                        f"got {placement!r}")
    return placement


def placed(placement: str, x: Tensor, f: Callable[[Tensor], Tensor], norm: nn.Module,
           norm_out: nn.Module | None) -> Tensor:
    """One residual sublayer with its norms at `placement`; `norm_out` is peri's output norm."""
    if placement == "pre":
        return x + f(norm(x))
    if placement == "post":
        return norm(x + f(x))
    return x + norm_out(f(norm(x)))


def has_final_norm(placement: str) -> bool:
    """Post-norm blocks end in a norm already; pre and peri add one before the head."""
    return placement != "post"
