"""Helpers for plugins that write their own `torch.autograd.Function`.

`once_differentiable` is torch's decorator of the same name minus its cost on the usual backward. torch's
wraps every backward in `torch.no_grad()` and then checks whether to guard the outputs against a second
differentiation; in an ordinary `loss.backward()` grad mode is already off inside backward, so both are
no-ops that cost 10-15 us per call, which at tiny shapes is a tenth of a norm layer's training call
(docs/performance.md, "Host work per training call"). This one calls the backward directly when grad
mode is off, and torch's wrapper otherwise (`backward(create_graph=True)`: the same error on a second
backward as torch's).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["once_differentiable"]


def once_differentiable(backward: Callable[..., Any]) -> Callable[..., Any]:
    """Mark an autograd Function's backward as not differentiable again (as torch's decorator does)."""
    guarded = torch.autograd.function.once_differentiable(backward)

    @functools.wraps(backward)
    def wrapper(ctx: Any, *grads: Any) -> Any:
        if torch.is_grad_enabled():
            return guarded(ctx, *grads)
        return backward(ctx, *grads)

    return wrapper
