"""normkit layers in models built elsewhere: converting timm, torchvision and Hugging Face models
(`convert`, the table of source classes, fitting layers to their sources), handing them back to
torch's modules (`to_torch`), folding and tracing for deployment, `norm_layer=` factories and
Lightning's layer sync.

The stage model (spec, registry, stages, layer, build, ...) at the top of `normkit` imports
nothing from here; the public names are re-exported by `normkit` itself (`normkit.convert`, ...).
"""
