"""normkit: build, compose and compare normalization layers (NAP / NOP / NRR stages).

    import normkit
    layer = normkit.build("gn(groups=8)+pn", 64, activation="relu")
    normkit.convert(model, "bnn")
"""

from normkit.build import available, build
from normkit.convert import convert
from normkit.errors import NormkitError, PluginError, SpecError
from normkit.feeding_conv import prepare_feeding_convs
from normkit.grammar import split_specs
from normkit.hookspecs import hookimpl
from normkit.layer import NormLayer, NormShapeError
from normkit.optim import param_groups
from normkit.spec import Spec, parse

__version__ = "0.1.0"

__all__ = [
    "NormLayer",
    "NormShapeError",
    "NormkitError",
    "PluginError",
    "Spec",
    "SpecError",
    "available",
    "build",
    "convert",
    "hookimpl",
    "param_groups",
    "parse",
    "prepare_feeding_convs",
    "split_specs",
]
