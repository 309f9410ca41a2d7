"""Lightning's layer-sync plugin for normkit layers (optional: `pip install lightning`).

`Trainer(sync_batchnorm=True)` alone converts only torch's BatchNorm layers; normkit's batch-
statistics layers stay per-process. Pass this plugin to sync both:

    Trainer(strategy="ddp", sync_batchnorm=True, plugins=[NormkitSyncBatchNorm()])
"""

from __future__ import annotations

from lightning.pytorch.plugins import TorchSyncBatchNorm
from torch import nn

from normkit.interop.convert import convert_sync
from normkit.layer import NormLayer


class NormkitSyncBatchNorm(TorchSyncBatchNorm):
    """torch's SyncBatchNorm conversion plus `normkit.convert_sync` for normkit layers."""

    def apply(self, model: nn.Module) -> nn.Module:
        return convert_sync(super().apply(model))

    def revert(self, model: nn.Module) -> nn.Module:
        model = super().revert(model)
        for module in model.modules():
            if isinstance(module, NormLayer):
                module.sync = None
        return model
