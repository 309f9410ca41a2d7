"""Proxy normalization for normkit: the post-activation stage `pn` (`gn(groups=8)+pn`, `ln+pn`).

    layer = normkit.build("gn(groups=8)+pn", 64, activation="relu")
    optimizer = torch.optim.SGD(normkit.param_groups(model, 5e-4), lr=0.1, momentum=0.9)
"""

from __future__ import annotations

from importlib import resources

import normkit
from normkit.hookspecs import RegisterPreset, RegisterStage
from normkit.stages import BuildContext
from normkit_proxynorm.proxy import ProxyNorm, proxy_quantiles

CITATION = ("Labatie, Masters, Eaton-Rosen & Luschi, Proxy-Normalizing Activations to Match Batch "
            "Normalization while Removing Batch Dependence, NeurIPS 2021, arXiv:2106.03743")

# The paper pairs PN with LN or GN with few groups (8 in its ResNet experiments, against GN's usual 32,
# which on a small CNN makes the first layer an instance norm): `gn+pn` means gn(groups=8)+pn unless
# the groups are given.
PARTITION_DEFAULTS = {"groups": 8}

__all__ = ["CITATION", "PARTITION_DEFAULTS", "ProxyNorm", "proxy_normalization", "proxy_quantiles"]


def proxy_normalization(ctx: BuildContext, *, act: str = "relu", eps: float = 0.03, samples: int = 200,
                        proxy_params: bool = True, scale: bool = True) -> ProxyNorm:
    """Build the `pn` step; `act` arrives resolved by the core (the activation the layer owns)."""
    return ProxyNorm(act, eps, samples, proxy_params, scale)


@normkit.hookimpl
def normkit_register_stages(register: RegisterStage) -> None:
    register("pn", proxy_normalization, kind="post_activation", activation_param="act",
             aliases=("proxynorm", "proxy-norm"), citation=CITATION, partition_defaults=PARTITION_DEFAULTS,
             ablations={"proxy step": None},  # --ablate: the norm without pn, its groups kept (gn(groups=8))
             summary="proxy norm: affine -> activation -> normalize by a Gaussian proxy's statistics "
                     "(batch-independent; follow ln/gn)")


@normkit.hookimpl
def normkit_register_presets(register: RegisterPreset) -> None:
    """The reproduction presets shipped in presets/ (`normkit reproduce --list`; docs/reproduce.md)."""
    for path in sorted(resources.files(__name__).joinpath("presets").iterdir(), key=lambda p: p.name):
        if path.name.endswith(".yaml"):
            register(path.name.removesuffix(".yaml"), path, citation=CITATION)
