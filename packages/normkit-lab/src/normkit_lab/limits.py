"""Upper limits on sizes that cannot be meaningful and would otherwise allocate, overflow or hang.

Kept free of heavy imports (no torch) so the CLI can show them in `--help` without loading the lab.
docs/experiments.md ("Limits") lists them; a value beyond one is refused before anything runs.
"""

from __future__ import annotations

MAX_EPOCHS = 10_000
MAX_STEPS = 100_000_000  # optimizer steps of a `--budget steps=N` run
MAX_BATCH_SIZE = 65_536
MAX_SEEDS = 1_000  # seeds per comparison
MAX_SEED = 2**32 - 1  # numpy's seed range; torch accepts more, results would not repeat elsewhere
MAX_NUM_WORKERS = 256
MAX_CPU_THREADS = 1_024
MAX_NPROC_PER_NODE = 64  # processes (GPUs) of one DDP run on a node
MAX_JOBS = 1_024  # runs at once (--jobs)
MAX_MODEL_PARAMS = 1_000_000_000  # learnable parameters, counted on the meta device before building
MAX_MODEL_DEPTH = 1_000  # layers or blocks of a built-in model
MAX_IMAGE_SIZE = 1_024  # pixels per side of a generated or image-folder dataset
MAX_DATASET_SIZE = 1_000_000  # images of a generated dataset
MAX_DATASET_BYTES = 4 * 2**30  # in-memory bytes of a generated dataset (uint8 pixels)
MAX_YAML_BYTES = 1_000_000  # a config file or a --model-param value
MAX_YAML_NODES = 100_000  # YAML nodes after expanding aliases (refuses "billion laughs" documents)
MAX_CHANNELS = 2**20  # channels of one norm layer (`normkit show --channels`, random-net width)
MAX_ACTIVATION_ELEMENTS = 2**28  # one activation tensor (batch x channels x pixels), 1 GiB in float32
MAX_REPEATS = 10_000  # timed repetitions of `normkit bench`
