"""The optimizers a built-in run can use: SGD (momentum), AdamW, and Muon on the hidden matrices with
AdamW on the rest (`optimizer: muon`), each over normkit's weight-decay groups (`normkit.param_groups`).

Muon (Jordan et al. 2024, `torch.optim.Muon`) orthogonalizes each 2-D weight's momentum by Newton-Schulz
iterations; its authors use it for the hidden weight matrices only and AdamW for embeddings, the output
layer, gains and biases. normkit gives Muon every `nn.Linear` weight except the output layer (the model's
last Linear) and weights tied to an embedding; everything else (embeddings, convolutions, norms, biases,
the output layer) goes to AdamW. Muon's step is scaled to AdamW's update size (`adjust_lr_fn=
"match_rms_adamw"`, Liu et al. 2025), so both parts share one learning rate and weight decay, and one
schedule moves both.

On CPU the Muon part is `Float32Muon`: torch's update with its Newton-Schulz iteration in float32 instead
of bfloat16, because a CPU without bfloat16 matrix units (AVX2) multiplies bfloat16 matrices 10-25x slower
than float32 ones, which made Muon about ten times AdamW's time per step on gpt-tiny.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn
from torch.optim._muon import _adjust_lr

OPTIMIZERS = ("sgd", "adamw", "muon")


def hidden_matrices(model: nn.Module) -> set[int]:
    """ids of the weights Muon takes: every nn.Linear's but the last one's and those tied to an embedding."""
    tied = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    weights = [m.weight for m in model.modules() if isinstance(m, nn.Linear)]
    return {id(w) for w in weights[:-1]} - tied - {id(w) for w in weights[-1:]}


def newton_schulz_float32(update: Tensor, coefficients: tuple[float, float, float], steps: int, eps: float) -> Tensor:
    """torch's quintic Newton-Schulz orthogonalization of a 2-D update (`torch.optim.Muon`), in float32."""
    a, b, c = coefficients
    x = update.float()
    tall = x.size(0) > x.size(1)
    if tall:
        x = x.T
    x = x / x.norm().clamp(min=eps)
    for _ in range(steps):
        gram = x @ x.T
        x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x.T if tall else x


def _loss_of(closure: Callable[[], float] | None) -> float | None:
    """An optimizer step's closure evaluated with gradients on (the step itself runs under no_grad)."""
    if closure is None:
        return None
    with torch.enable_grad():
        return closure()


class Float32Muon(torch.optim.Muon):
    """`torch.optim.Muon` with the Newton-Schulz iteration in float32 (its own runs it in bfloat16, which a
    CPU without bfloat16 matrix units computes slowly). Same hyperparameters, update rule and state
    (`momentum_buffer`), so checkpoints move between the two."""

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        loss = _loss_of(closure)
        for group in self.param_groups:
            params: list[Tensor] = []
            grads: list[Tensor] = []
            buffers: list[Tensor] = []
            self._init_group(group, params, grads, buffers)
            momentum, lr = group["momentum"], group["lr"]
            for param, grad, buffer in zip(params, grads, buffers, strict=True):
                buffer.lerp_(grad, 1 - momentum)
                update = grad.lerp(buffer, momentum) if group["nesterov"] else buffer
                update = newton_schulz_float32(update, group["ns_coefficients"], group["ns_steps"], group["eps"])
                param.mul_(1 - lr * group["weight_decay"])
                param.add_(update.to(param.dtype), alpha=-_adjust_lr(lr, group["adjust_lr_fn"], param.shape))
        return loss


class MuonAdamW(torch.optim.Optimizer):
    """Muon on the parameters in `hidden`, AdamW on the rest: one optimizer for the training loop, the
    learning-rate schedule and checkpoints (its state_dict has torch's usual layout, over the groups in order:
    Muon's, then AdamW's)."""

    def __init__(self, groups: list[dict[str, Any]], hidden: set[int], lr: float) -> None:
        muon = [{**g, "params": [p for p in g["params"] if id(p) in hidden]} for g in groups]
        adamw = [{**g, "params": [p for p in g["params"] if id(p) not in hidden]} for g in groups]
        muon, adamw = [g for g in muon if g["params"]], [g for g in adamw if g["params"]]
        on_cpu = all(p.device.type == "cpu" for g in muon for p in g["params"])
        muon_class = Float32Muon if on_cpu else torch.optim.Muon
        self._parts = [*([muon_class(muon, lr=lr, adjust_lr_fn="match_rms_adamw")] if muon else []),
                       *([torch.optim.AdamW(adamw, lr=lr)] if adamw else [])]
        super().__init__([g for part in self._parts for g in part.param_groups], {"lr": lr})
        self._share()

    def _share(self) -> None:
        """The parts step on this optimizer's own groups and state (so the schedule, zero_grad and
        state_dict see one optimizer)."""
        start = 0
        for part in self._parts:
            part.param_groups = self.param_groups[start:start + len(part.param_groups)]
            part.state = self.state
            start += len(part.param_groups)

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        loss = _loss_of(closure)
        for part in self._parts:
            part.step()
        return loss

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        self._share()


def build_optimizer(name: str, groups: list[dict[str, Any]], model: nn.Module, lr: float,
                    momentum: float) -> torch.optim.Optimizer:
    """The run's optimizer over normkit's weight-decay `groups` of `model`."""
    if name == "sgd":
        return torch.optim.SGD(groups, lr=lr, momentum=momentum, nesterov=False)
    if name == "muon":
        return MuonAdamW(groups, hidden_matrices(model), lr)
    return torch.optim.AdamW(groups, lr=lr)
