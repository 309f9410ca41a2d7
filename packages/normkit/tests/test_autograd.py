"""normkit.autograd.once_differentiable: torch's guard against a second differentiation, without its
no_grad wrapper on the usual backward (where grad mode is already off)."""

from __future__ import annotations

import inspect

import pytest
import torch

from normkit.autograd import once_differentiable

TORCH_WRAPPER = inspect.getsourcefile(torch.autograd.function.once_differentiable)


class Square(torch.autograd.Function):
    """y = x^2 with a hand-written backward that records how it was called."""

    calls: list[tuple[bool, bool]] = []  # (grad mode on inside backward, torch's wrapper on the stack)

    @staticmethod
    def forward(ctx, x):  # noqa: ANN001, ANN205
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):  # noqa: ANN001, ANN205
        (x,) = ctx.saved_tensors
        wrapped = any(frame.filename == TORCH_WRAPPER and frame.function == "wrapper" for frame in inspect.stack())
        Square.calls.append((torch.is_grad_enabled(), wrapped))
        return 2 * x * grad


def test_the_usual_backward_is_called_directly_and_is_correct():
    Square.calls.clear()
    x = torch.tensor([1.0, -2.0, 3.0], requires_grad=True)
    Square.apply(x).sum().backward()
    assert torch.equal(x.grad, torch.tensor([2.0, -4.0, 6.0]))
    assert Square.calls == [(False, False)]  # grad mode off, and torch's no_grad wrapper skipped


def test_under_create_graph_it_is_torchs_guard_first_order_works_second_raises():
    Square.calls.clear()
    x = torch.tensor([1.0, -2.0, 3.0], requires_grad=True)
    v = torch.ones(3, requires_grad=True)  # a grad output that itself requires grad: torch's wrapper guards then
    (grad,) = torch.autograd.grad(Square.apply(x), x, grad_outputs=v, create_graph=True)
    assert torch.equal(grad.detach(), torch.tensor([2.0, -4.0, 6.0]))
    assert Square.calls == [(False, True)]  # torch's wrapper ran it under no_grad
    with pytest.raises(RuntimeError, match="differentiate twice"):
        grad.sum().backward()


def test_it_keeps_the_backwards_name_and_docstring():
    def backward(ctx, grad):  # noqa: ANN001, ANN202
        """Says why."""
        return grad

    decorated = once_differentiable(backward)
    assert decorated.__name__ == "backward" and decorated.__doc__ == "Says why."
