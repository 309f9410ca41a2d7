"""normkit: build, compose and compare normalization layers (NAP / NOP / NRR stages).

    import normkit
    layer = normkit.build("gn(groups=8)+pn", 64, activation="relu")
    normkit.convert(model, "bnn")
    normkit.convert_sync(model)          # batch statistics over all processes (DDP)
    normkit.fold(model.eval())           # deployment: fold eval-mode batch norms into the conv before
"""

from normkit.build import available, build
from normkit.convert import convert, convert_sync
from normkit.errors import NormkitError, NormShapeError, PluginError, SpecError, StepError
from normkit.feeding_conv import prepare_feeding_convs
from normkit.fold import FoldSummary, fold
from normkit.grammar import split_specs
from normkit.hookspecs import RegisterItem, RegisterNorm, RegisterStage, hookimpl
from normkit.layer import NormLayer
from normkit.norm_layer_factory import norm_layer
from normkit.optim import param_groups
from normkit.sources import register_source
from normkit.spec import Spec, parse
from normkit.to_torch import ToTorchSummary, to_torch
from normkit.trace import NormTracer, leaf_modules, symbolic_trace

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
    "register_source",
    "split_specs",
    "symbolic_trace",
    "to_torch",
]
