"""Modules that torch.fx records as one node, as it records torch's own norms.

`torch.fx.symbolic_trace` and the tracers built on it (torchvision's `create_feature_extractor`,
quantization and detection tools) trace into every module outside `torch.nn`. A norm layer checks
shapes and dispatches on mode and dtype in Python, which fx cannot trace and need not: the layer
is one operation on its input.
"""

from __future__ import annotations

from typing import Any

import torch.fx
from torch import nn


class FxLeaf(nn.Module):
    """Under fx tracing (a Proxy input) this module is one `call_module` node.

    The node is made through the tracer's `call_module`, so tracers that name nodes by module path
    (torchvision's feature extractor) see it as any leaf; hooks run when the graph runs, as they do
    for torch's leaves.
    """

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if args and isinstance(args[0], torch.fx.Proxy):
            tracer = args[0].tracer
            path = tracer.path_of_module(self)

            def one_node(*node_args: Any, **node_kwargs: Any) -> Any:
                return tracer.create_proxy("call_module", path, node_args, node_kwargs)

            return tracer.call_module(self, one_node, args, kwargs)
        return super().__call__(*args, **kwargs)
