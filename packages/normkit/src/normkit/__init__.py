"""normkit: build, compose and compare normalization layers (NAP / NOP / NRR stages).

    import normkit
    layer = normkit.build("gn(groups=8)+pn", 64, activation="relu")
    normkit.convert(model, "bnn")
    normkit.convert_sync(model)          # batch statistics over all processes (DDP)
    normkit.fold(model.eval())           # deployment: fold eval-mode batch norms into the conv before
"""

from normkit.build import available, build
from normkit.errors import NormkitError, NormShapeError, PluginError, SpecError, StepError
from normkit.grammar import split_specs
from normkit.hookspecs import RegisterItem, RegisterNorm, RegisterStage, hookimpl
from normkit.interop.convert import convert, convert_sync
from normkit.interop.feeding_conv import prepare_feeding_convs
from normkit.interop.fold import FoldSummary, fold
from normkit.interop.norm_layer_factory import norm_layer
from normkit.interop.sources import register_not_norm, register_source
from normkit.interop.to_torch import ToTorchSummary, to_torch
from normkit.interop.trace import NormTracer, leaf_modules, symbolic_trace
from normkit.layer import NormLayer
from normkit.optim import param_groups
from normkit.spec import Spec, parse

__version__ = "0.1.0"

__all__ = [
    "FoldSummary",
    "NormLayer",
    "NormShapeError",
    "NormTracer",
    "NormkitError",
    "PluginError",
    "RegisterItem",
    "RegisterNorm",
    "RegisterStage",
    "Spec",
    "SpecError",
    "StepError",
    "ToTorchSummary",
    "available",
    "build",
    "convert",
    "convert_sync",
    "fold",
    "hookimpl",
    "leaf_modules",
    "norm_layer",
    "param_groups",
    "parse",
    "prepare_feeding_convs",
    "register_not_norm",
    "register_source",
    "split_specs",
    "symbolic_trace",
    "to_torch",
]
