"""normkit layers in models built elsewhere: converting timm, torchvision and Hugging Face models
(`convert`, the table of source classes, fitting layers to their sources), handing them back to
torch's modules (`to_torch`), folding and tracing for deployment, `norm_layer=` factories and
Lightning's layer sync.

The stage model (spec, registry, stages, layer, build, ...) at the top of `normkit` imports
nothing from here; the public names are re-exported by `normkit` itself (`normkit.convert`, ...).
"""

from normkit.interop.sources import (
    Source,
    clone_of,
    read_batch_norm,
    read_frozen_batch_norm,
    read_gemma_rms_norm,
    read_group_norm,
    read_hf_convnext_layer_norm,
    read_instance_norm,
    read_layer_norm,
    read_layer_norm_2d,
    read_llama_rms_norm,
    read_olmo2_rms_norm,
    read_olmo_layer_norm,
    read_rms_norm,
    read_rms_norm_2d,
    register_not_norm,
    register_source,
)

__all__ = [
    "Source",
    "clone_of",
    "read_batch_norm",
    "read_frozen_batch_norm",
    "read_gemma_rms_norm",
    "read_group_norm",
    "read_hf_convnext_layer_norm",
    "read_instance_norm",
    "read_layer_norm",
    "read_layer_norm_2d",
    "read_llama_rms_norm",
    "read_olmo2_rms_norm",
    "read_olmo_layer_norm",
    "read_rms_norm",
    "read_rms_norm_2d",
    "register_not_norm",
    "register_source",
]
