"""The rank of the input each chosen module sees in one forward of an example (no gradients), for
tools that pick a torch module (to_torch) or check an axis (fold) by it."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn


def input_ranks(model: nn.Module, example: Tensor | tuple,
                chosen: Callable[[nn.Module], bool]) -> dict[str, int]:
    """Module path -> rank of its first input, for the modules where `chosen(module)` is True."""
    ranks: dict[str, int] = {}

    def remember(path: str) -> Callable[[nn.Module, tuple], None]:
        def hook(_module: nn.Module, args: tuple) -> None:
            ranks.setdefault(path, args[0].dim())
        return hook

    hooks = [m.register_forward_pre_hook(remember(p)) for p, m in model.named_modules() if chosen(m)]
    try:
        with torch.no_grad():
            model(*(example if isinstance(example, tuple) else (example,)))
    finally:
        for hook in hooks:
            hook.remove()
    return ranks
