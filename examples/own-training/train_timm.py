"""A timm model compared across norms: the model is timm's, the norms are normkit's.

    normkit compare --norms bn,gn(groups=4) --seeds 3 \
        --command "python train_timm.py --norm {norm} --seed {seed}" --metric test_acc
"""

import argparse

import timm
import torch
from sklearn.datasets import load_digits
from torch import nn

import normkit
from normkit_lab import report_metrics

parser = argparse.ArgumentParser()
parser.add_argument("--norm", default="bn")
parser.add_argument("--seed", type=int, default=0)
parser.add_argument("--model", default="test_efficientnet")
parser.add_argument("--epochs", type=int, default=3)
args = parser.parse_args()

torch.set_num_threads(1)
torch.manual_seed(args.seed)
digits = load_digits()  # 8x8 digits, upsampled to 32x32 for an ImageNet-style stem
x = nn.functional.interpolate(torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1), size=32) / 16
y = torch.tensor(digits.target)
order = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))
train, val, test = order[:600], order[1000:1300], order[1300:]

model = timm.create_model(args.model, num_classes=10, in_chans=1)
normkit.convert(model, args.norm)  # every timm BatchNormAct2d becomes the norm under test
opt = torch.optim.AdamW(model.parameters(), lr=2e-3)


@torch.no_grad()
def accuracy(idx: torch.Tensor) -> float:
    model.eval()
    return (model(x[idx]).argmax(1) == y[idx]).float().mean().item()


for epoch in range(args.epochs):
    model.train()
    for batch in train[torch.randperm(len(train))].split(32):
        loss = nn.functional.cross_entropy(model(x[batch]), y[batch])
        opt.zero_grad()
        loss.backward()
        opt.step()
    report_metrics(epoch=epoch, val_acc=accuracy(val), test_acc=accuracy(test))
