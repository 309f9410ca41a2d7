"""Small statistics helpers shared by the zoo's steps."""

from __future__ import annotations

from torch import Tensor


def biased_var_mean(x: Tensor, dims: int | tuple[int, ...]) -> tuple[Tensor, Tensor]:
    """(biased variance, mean) over `dims`, keepdim; unlike torch.var_mean, no warning on N=0."""
    mean = x.mean(dim=dims, keepdim=True)
    centred = x - mean
    return (centred * centred).mean(dim=dims, keepdim=True), mean
