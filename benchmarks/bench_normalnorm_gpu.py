"""GPU benchmark of normality normalization: fused Triton kernel vs torch paths vs BatchNorm/LayerNorm.

    .venv/bin/python benchmarks/bench_normalnorm_gpu.py            # all shapes, fp32 and bf16
    .venv/bin/python benchmarks/bench_normalnorm_gpu.py --dtypes fp32 --reps 100

For each shape and dtype it times, with CUDA events (warm-up, then the median of --reps runs):
  baseline   torch.nn.BatchNorm2d (cuDNN for fp32; torch's native kernels for bf16) or nn.LayerNorm
  triton     the normkit layer with nn(kernel=triton)          (layer: casts bf16 to fp32 around it)
  kernel     normality_triton called directly on the (N, C, S) view, bf16 in and out for bf16
  torch      the normkit layer with nn(kernel=torch)           (the fused PyTorch path)
  reference  the normkit layer's step-by-step autograd path    (forced with a no-op probe)
in train forward, train forward+backward and eval forward, plus the peak memory of one train
forward+backward. GB/s counts the bytes-moved floor: forward reads x and writes y (2 * numel *
element size), backward reads x and dy and writes dx (3 * numel * element size). The last table
checks the targets from docs/performance.md.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass

import torch

PEAK_GBPS = {"H100 SXM": 3350.0, "H100 80GB HBM3": 3350.0, "H100 PCIe": 2000.0, "H200": 4800.0,
             "A100-SXM4-80GB": 2039.0, "A100 80GB PCIe": 1935.0, "A100-SXM4-40GB": 1555.0,
             "A100-PCIE-40GB": 1555.0}

# (norm, shape, num_channels, channel_dim, channels_last): bnn on conv maps (NCHW, and one
# channels-last case, which the kernels address with strides), lnn on (batch, tokens, features).
SHAPES = [("bnn", (128, 64, 32, 32), 64, 1, False), ("bnn", (128, 512, 4, 4), 512, 1, False),
          ("bnn", (128, 64, 32, 32), 64, 1, True),
          ("lnn", (32, 65, 768), 768, -1, False), ("lnn", (8, 1024, 4096), 4096, -1, False)]
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


@dataclass
class Timing:
    forward: float | None = None
    train: float | None = None  # forward + backward
    eval: float | None = None
    peak_mb: float | None = None


def cuda_median_ms(fn: Callable[[], object], warmup: int, reps: int) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def peak_mb(fn: Callable[[], object]) -> float:
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**20


def measure(module: torch.nn.Module | Callable, x: torch.Tensor, dy: torch.Tensor, params: list[torch.Tensor],
            args: argparse.Namespace, with_eval: bool = True) -> Timing:
    """Train forward, train forward+backward (grads of x and params), eval forward, peak memory."""
    xg = x.detach().requires_grad_()
    inputs = [xg, *params]

    def forward() -> torch.Tensor:
        with torch.no_grad():
            return module(x)

    def train() -> None:
        torch.autograd.grad(module(xg), inputs, dy)

    set_mode = getattr(module, "train", None)
    t = Timing()
    if set_mode:
        set_mode(True)
    t.forward = cuda_median_ms(forward, args.warmup, args.reps)
    t.train = cuda_median_ms(train, args.warmup, args.reps)
    t.peak_mb = peak_mb(train)
    if with_eval and set_mode:
        set_mode(False)
        t.eval = cuda_median_ms(forward, args.warmup, args.reps)
        set_mode(True)
    return t


def kernel_call(norm: str, layer: torch.nn.Module, dtype: torch.dtype) -> Callable[[torch.Tensor], torch.Tensor]:
    """normality_triton on the layer's (N, C, S) view, in the input dtype end to end."""
    from normkit_normalnorm.triton_kernels import normality_triton

    batch = norm == "bnn"
    nn_step = layer.steps[1]

    def call(x: torch.Tensor) -> torch.Tensor:
        n, c = x.shape[0], layer.num_channels
        x3 = x.reshape(n, -1, c).transpose(1, 2) if layer.tokens else x.reshape(n, c, -1)
        y3 = normality_triton(
            x3, layer.weight, layer.bias, partition=layer.partition.kind, tokens=layer.tokens,
            training=layer.training, eps=nn_step.eps, alpha=nn_step.alpha, noise=nn_step.noise,
            running_mean=layer.running_mean if batch else None,
            running_var=layer.running_var if batch else None,
            running_lambda=layer.running_lambda if batch else None, momentum=0.1, out_dtype=dtype)
        return y3.transpose(1, 2).reshape(x.shape) if layer.tokens else y3.reshape(x.shape)

    call.train = layer.train  # so measure() can switch modes
    return call


def run_case(norm: str, shape: tuple[int, ...], channels: int, channel_dim: int, channels_last: bool,
             dtype: torch.dtype, args: argparse.Namespace) -> dict[str, Timing]:
    import normkit

    gen = torch.Generator(device="cuda").manual_seed(0)
    memory = torch.channels_last if channels_last else torch.contiguous_format
    x = torch.randn(shape, device="cuda", generator=gen).to(dtype, memory_format=memory)
    dy = torch.randn(shape, device="cuda", generator=gen).to(dtype, memory_format=memory)
    if norm == "bnn":
        baseline = torch.nn.BatchNorm2d(channels).cuda()  # fp32 affine: cuDNN (fp32) / native (bf16)
    else:
        baseline = torch.nn.LayerNorm(channels).cuda().to(dtype)
    layers = {kind: normkit.build(f"{norm}(kernel={kind})", channels, channel_dim=channel_dim).cuda()
              for kind in ("triton", "torch")}
    reference = normkit.build(f"{norm}(kernel=torch)", channels, channel_dim=channel_dim).cuda()
    reference.add_probe(lambda layer, values: None)  # probes force the step-by-step path
    out = {"baseline": measure(baseline, x, dy, list(baseline.parameters()), args)}
    for kind, layer in layers.items():
        out[kind] = measure(layer, x, dy, list(layer.parameters()), args)
    call = kernel_call(norm, layers["triton"], dtype)
    out["kernel"] = measure(call, x, dy, [layers["triton"].weight, layers["triton"].bias], args)
    if not args.skip_reference:
        out["reference"] = measure(reference, x, dy, list(reference.parameters()), args)
    return out


def gbps(nbytes: float, ms: float | None) -> float | None:
    return None if ms is None else nbytes / (ms * 1e-3) / 1e9


def fmt(v: float | None, spec: str = ".3f") -> str:
    return "-" if v is None else format(v, spec)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtypes", default="fp32,bf16", help="comma list of fp32, bf16")
    parser.add_argument("--reps", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--peak-gbps", type=float, default=None, help="HBM peak; default from the device name")
    parser.add_argument("--skip-reference", action="store_true", help="skip the slow step-by-step path")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("bench_normalnorm_gpu: no CUDA device; this benchmark times GPU kernels "
              "(run it on a machine with an NVIDIA GPU)", file=sys.stderr)
        return 2
    try:
        import triton

        from normkit_normalnorm.triton_kernels import available
    except ImportError as err:
        print(f"bench_normalnorm_gpu: {err}; install triton and plugins/normkit-normalnorm", file=sys.stderr)
        return 2
    if not available():
        print("bench_normalnorm_gpu: the Triton kernel is not available on this device", file=sys.stderr)
        return 2
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    if unknown := [d for d in dtypes if d not in DTYPES]:
        print(f"bench_normalnorm_gpu: unknown dtype {unknown}; use fp32 and/or bf16", file=sys.stderr)
        return 2
    name = torch.cuda.get_device_name()
    peak = args.peak_gbps or next((v for k, v in PEAK_GBPS.items() if k in name), None)
    print(f"device: {name}; HBM peak {fmt(peak, '.0f')} GB/s; torch {torch.__version__}; triton {triton.__version__}")
    print(f"CUDA events, {args.warmup} warm-up runs, median of {args.reps}; times in ms\n")
    header = (f"{'norm':4} {'shape':16} {'dtype':5} {'path':9} {'fwd':>8} {'fwd+bwd':>8} {'eval':>8} "
              f"{'fwd GB/s':>9} {'f+b GB/s':>9} {'%peak fwd':>9} {'peak MB':>8}")
    print(header)
    print("-" * len(header))
    checks = []
    for dname in dtypes:
        dtype = DTYPES[dname]
        for norm, shape, channels, channel_dim, channels_last in SHAPES:
            result = run_case(norm, shape, channels, channel_dim, channels_last, dtype, args)
            label = "x".join(map(str, shape)) + (" cl" if channels_last else "")
            numel, size = torch.Size(shape).numel(), torch.empty((), dtype=dtype).element_size()
            for path, t in result.items():
                fwd_bw = gbps(2 * numel * size, t.forward)
                train_bw = gbps(5 * numel * size, t.train)
                pct = None if peak is None or fwd_bw is None else 100 * fwd_bw / peak
                print(f"{norm:4} {label:16} {dname:5} {path:9} {fmt(t.forward):>8} "
                      f"{fmt(t.train):>8} {fmt(t.eval):>8} {fmt(fwd_bw, '.0f'):>9} {fmt(train_bw, '.0f'):>9} "
                      f"{fmt(pct, '.0f'):>9} {fmt(t.peak_mb, '.1f'):>8}")
            checks.extend(target_checks(f"{norm} {label} {dname}", norm, result, peak, numel * size))
            print()
    print("targets (docs/performance.md)")
    for line in checks:
        print("  " + line)
    return 0


def target_checks(label: str, norm: str, r: dict[str, Timing], peak: float | None, nbytes: int) -> list[str]:
    tri, base, kern = r["triton"], r["baseline"], r["kernel"]
    lines = []
    if norm == "bnn":
        lines.append(f"{label}: train fwd+bwd triton/BN = {tri.train / base.train:.2f} (target <= 2.0)")
        if "reference" in r:
            lines.append(f"{label}: train fwd+bwd reference/triton = {r['reference'].train / tri.train:.2f} "
                         "(target >= 3.0)")
        lines.append(f"{label}: eval fwd triton/BN = {tri.eval / base.eval:.2f} (target <= 1.2)")
    else:
        lines.append(f"{label}: train fwd+bwd triton/LN = {tri.train / base.train:.2f} (target <= 1.5)")
        if peak is not None:
            pct = 100 * gbps(2 * nbytes, kern.forward) / peak
            lines.append(f"{label}: row kernel fwd = {pct:.0f}% of HBM peak (target >= 70%)")
    return lines


if __name__ == "__main__":
    sys.exit(main())
