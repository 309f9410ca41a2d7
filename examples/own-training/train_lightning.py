"""A Lightning module compared across norms: normkit converts the model and a callback reports metrics.

    normkit compare --norms bn,gn+pn --seeds 5 \
        --command "python train_lightning.py --norm {norm} --seed {seed}" --metric test_acc

The module, the data and `lightning.Trainer` are ordinary Lightning; the normkit lines are marked
`# normkit`. `normkit.convert` swaps the norms before training (for DDP runs, add normkit's
Lightning plugin so batch statistics are synced: see docs/convert.md).
"""

from __future__ import annotations

import argparse

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from train import data, model

import normkit  # normkit
from normkit_lab import report_metrics  # normkit


class Classifier(L.LightningModule):
    def __init__(self, norm: str, width: int, lr: float) -> None:
        super().__init__()
        self.net = model(width)
        normkit.convert(self.net, norm)  # normkit
        self.lr = lr

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], _: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.cross_entropy(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], _: int, dataloader_idx: int = 0) -> None:
        x, y = batch
        name = ("val_acc", "test_acc")[dataloader_idx]
        self.log(name, (self.net(x).argmax(dim=1) == y).float().mean(), add_dataloader_idx=False)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)


class ReportToNormkit(L.Callback):  # normkit: every validation's metrics as one `normkit:` line
    def on_validation_epoch_end(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        if not trainer.sanity_checking:
            report_metrics(epoch=trainer.current_epoch,
                           **{k: v.item() for k, v in trainer.callback_metrics.items()})


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--norm", default="bn")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--width", type=int, default=16)
    args = parser.parse_args()

    torch.set_num_threads(1)
    L.seed_everything(args.seed, verbose=False)
    splits = data()
    train = DataLoader(TensorDataset(*splits["train"]), batch_size=32, shuffle=True, drop_last=True)
    evaluate = [DataLoader(TensorDataset(*splits[name]), batch_size=512) for name in ("val", "test")]
    trainer = L.Trainer(max_epochs=args.epochs, accelerator="cpu", logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, callbacks=[ReportToNormkit()])
    trainer.fit(Classifier(args.norm, args.width, args.lr), train, evaluate)


if __name__ == "__main__":
    main()
