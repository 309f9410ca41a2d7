#!/usr/bin/env bash
# Every GPU check of the normality norm's kernels in one pass, for a lent GPU machine with little time:
#   bash benchmarks/gpu_checks.sh OUTDIR
# 1. device and versions; 2. benchmarks/bench_normalnorm_gpu.py (timings vs torch's norms and the
# roofline, plus the check against the CPU reference); 3. the GPU tests (`-m gpu`) and every
# non-slow Triton kernel test on CUDA; 4. `normkit compare`'s default and one preset with
# --device cuda; 5. benchmarks/kernel_cost.py (compiled instruction counts of the same kernels, CPU only,
# so a timing can be set beside its prediction). Each step has its own time limit so a slow one cannot
# take the others' time.
# With a folder .whl/ of this checkout's wheels (pip wheel --no-deps), they are installed into
# /tmp/site first (the machine needs no package index); otherwise the packages must be installed.
set -u
out=${1:-gpu-checks}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
if [ -d .whl ]; then
  $py -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 2
  export PYTHONPATH=/tmp/site
fi
normkit=("$py" -c 'from normkit_cli.app import main; main()')  # the CLI without its console script
runs=${RUNS_DIR:-/tmp/normkit-gpu-runs}  # results directories (many files) stay out of OUTDIR
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.mem --format=csv
  $py -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__, torch.cuda.get_device_name())'
  nproc; uptime; date -u; } > "$out/env.txt" 2>&1
timeout "${BENCH_S:-300}" $py benchmarks/bench_normalnorm_gpu.py --reps 30 --warmup 5 --json "$out/bench.json" \
  > "$out/bench.txt" 2>&1; echo "bench exit $?" >> "$out/bench.txt"
timeout "${TESTS_S:-150}" $py -m pytest -q -p no:cacheprovider -m "not slow" \
  plugins/normkit-normalnorm/tests/test_triton_kernels.py > "$out/tests.txt" 2>&1
echo "kernel tests exit $?" >> "$out/tests.txt"
timeout "${TESTS_S:-150}" $py -m pytest -q -p no:cacheprovider -m gpu packages/normkit-lab/tests/test_training.py \
  packages/normkit-lab/tests/test_loggers.py >> "$out/tests.txt" 2>&1
echo "gpu-marked tests exit $?" >> "$out/tests.txt"
( time timeout "${COMPARE_S:-100}" "${normkit[@]}" compare --norms bn,bnn,gn+pn --device cuda --out "$runs/default" ) > "$out/compare.txt" 2>&1
echo "compare exit $?" >> "$out/compare.txt"
( time timeout "${PRESET_S:-100}" "${normkit[@]}" reproduce normalnorm-gaussianity-robustness --device cuda --out "$runs/preset" ) > "$out/preset.txt" 2>&1
echo "preset exit $?" >> "$out/preset.txt"
timeout "${COST_S:-300}" $py benchmarks/kernel_cost.py --jobs "$(nproc)" --json "$out/kernel_cost.json" \
  > "$out/kernel_cost.txt" 2>&1; echo "kernel cost exit $?" >> "$out/kernel_cost.txt"
