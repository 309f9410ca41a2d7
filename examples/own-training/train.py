"""A plain PyTorch training loop, made comparable across norms with a few lines of normkit.

    python train.py --norm bn --seed 0                      # one run
    normkit compare --norms bn,bnn,gn+pn --seeds 5 \
        --command "python train.py --norm {norm} --seed {seed}" --metric test_acc

The normkit lines are marked `# normkit`: the model is built with torch's own BatchNorm2d and
converted to the norm under test, and each epoch's metrics are reported on stdout. Everything
else is an ordinary script (data, model, optimizer, loop), as your own would be.
"""

from __future__ import annotations

import argparse
import random

import numpy as np
import torch
from sklearn.datasets import load_digits
from torch import nn

import normkit  # normkit
from normkit_lab import report_metrics  # normkit


def data(seed: int = 0) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """scikit-learn's 8x8 digits (bundled, no download): fixed train/val/test splits, standardized."""
    digits = load_digits()
    x = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1)
    y = torch.tensor(digits.target)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))  # the same split every run
    x = (x - x[order[:1000]].mean()) / x[order[:1000]].std()
    parts = {"train": order[:1000], "val": order[1000:1400], "test": order[1400:]}
    return {name: (x[idx], y[idx]) for name, idx in parts.items()}


def model(width: int) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU(),
        nn.Conv2d(width, 2 * width, 3, padding=1, stride=2, bias=False), nn.BatchNorm2d(2 * width), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2 * width, 10))


@torch.no_grad()
def accuracy(net: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    net.eval()
    return (net(x).argmax(dim=1) == y).float().mean().item()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--norm", default="bn")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--width", type=int, default=16)
    args = parser.parse_args()

    torch.set_num_threads(1)  # small model: one thread is fastest, and runs in parallel do not compete
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)  # initialization, data order and the norms' noise follow the seed
    splits = data()
    net = model(args.width)
    normkit.convert(net, args.norm)  # normkit: every BatchNorm2d becomes the norm under test
    opt = torch.optim.SGD(net.parameters(), lr=args.lr, momentum=0.9)
    x, y = splits["train"]
    for epoch in range(args.epochs):
        net.train()
        for batch in torch.randperm(len(y)).split(args.batch_size):
            if len(batch) < 2:
                continue  # a batch of one has no batch statistics
            loss = nn.functional.cross_entropy(net(x[batch]), y[batch])
            opt.zero_grad()
            loss.backward()
            opt.step()
        report_metrics(epoch=epoch, train_loss=loss.item(),  # normkit
                       val_acc=accuracy(net, *splits["val"]), test_acc=accuracy(net, *splits["test"]))


if __name__ == "__main__":
    main()
