"""normkit-lab: models, datasets and a training loop for paired-by-seed comparisons of norms.

Kept light on purpose: import `normkit_lab.training`, `normkit_lab.models`, `normkit_lab.datasets`
for the heavy parts.
"""

__version__ = "0.1.0"
