"""NormkitSyncBatchNorm: Lightning's layer-sync plugin reaches normkit's batch-statistics layers."""

from __future__ import annotations

import torch
from lightning.pytorch import LightningModule, Trainer
from torch import nn

import normkit
from normkit.interop.lightning_sync import NormkitSyncBatchNorm


class Tiny(LightningModule):  # no torch BatchNorm: torch SyncBatchNorm runs on GPUs only
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(3, 4, 1), normkit.build("bn", 4), nn.Conv2d(4, 2, 1))
        self.synced_during_fit: list[bool] = []

    def training_step(self, batch, batch_idx):
        self.synced_during_fit.append(self.net[1].sync is not None)
        return self.net(batch).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def train_dataloader(self):
        return torch.utils.data.DataLoader(torch.randn(8, 3, 4, 4), batch_size=4)


def test_plugin_syncs_normkit_and_torch_layers_during_fit_and_reverts(tmp_path) -> None:
    model = Tiny()
    trainer = Trainer(accelerator="cpu", devices=1, strategy="ddp", sync_batchnorm=True,
                      plugins=[NormkitSyncBatchNorm()], max_steps=2, logger=False,
                      enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                      default_root_dir=tmp_path)
    try:
        trainer.fit(model)
    finally:  # Lightning leaves its one-process group up; later tests' torch SyncBatchNorm would see it
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
    assert model.synced_during_fit == [True, True]
    assert model.net[1].sync is None  # reverted at teardown


def test_plugin_apply_and_revert() -> None:
    model = nn.Sequential(normkit.build("bn", 4), normkit.build("ln", 4), nn.BatchNorm2d(4))
    plugin = NormkitSyncBatchNorm()
    synced = plugin.apply(model)
    assert synced[0].sync is not None and synced[1].sync is None  # ln needs no communication
    assert isinstance(synced[2], nn.SyncBatchNorm)
    reverted = plugin.revert(synced)
    assert reverted[0].sync is None


