"""GPU benchmark of normality normalization: Triton kernels vs torch's norms, eager and compiled, vs the roofline.

    .venv/bin/python benchmarks/bench_normalnorm_gpu.py                       # every case, fp32 and bf16
    .venv/bin/python benchmarks/bench_normalnorm_gpu.py --dtypes fp32 --reps 100 --json out.json
    .venv/bin/python benchmarks/bench_normalnorm_gpu.py --cases lm --no-compiled

For each case (bnn on conv maps, lnn on ViT and language-model token tensors) and dtype it times,
with CUDA events (warm-up, then the median of --reps runs), the train forward, the backward alone
(gradients of the input, weight and bias from a retained graph), the whole step (forward +
backward) and the eval forward of:
  BN / LN / RMS        torch.nn.BatchNorm2d, LayerNorm, RMSNorm, eager
  BN@c / LN@c / RMS@c  the same under torch.compile (one compile per case; --no-compiled skips them)
  triton               the normkit layer with nn(kernel=triton)
  kernel               normality_triton called directly on the (N, C, S) view, bf16 in and out for bf16
  torch                the normkit layer with nn(kernel=torch) (the fused PyTorch path)
  reference            the layer's step-by-step autograd path (--reference; slow)
Bandwidth: each path with a byte model (docs/performance.md, "Roofline") gets its model's DRAM bytes
divided by the measured time (GB/s), that as a share of the HBM peak (%peak), and the roofline's
minimum step time (model bytes / peak) beside the measured one. Then it checks the Triton layer's
training output and gradients (noise off) against the float64 CPU reference within the test
tolerances (1e-3 fp32, 5e-2 bf16) and prints the target checks of docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch

PEAK_GBPS = {"H100 SXM": 3350.0, "H100 80GB HBM3": 3350.0, "H100 PCIe": 2000.0, "H200": 4800.0,
             "A100-SXM4-80GB": 2039.0, "A100 80GB PCIe": 1935.0, "A100-SXM4-40GB": 1555.0,
             "A100-PCIE-40GB": 1555.0}
TOLERANCE = {"fp32": 1e-3, "bf16": 5e-2}  # as plugins/normkit-normalnorm/tests/test_triton_kernels.py
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


@dataclass(frozen=True)
class Case:
    """One benchmark tensor. group: how "conv" (bnn, one group per channel over N·H·W), "vit" or
    "lm" (lnn, one group per token over the features)."""

    norm: str
    shape: tuple[int, ...]
    channels_last: bool = False
    group: str = "conv"

    @property
    def channels(self) -> int:
        return self.shape[1] if self.norm == "bnn" else self.shape[-1]

    @property
    def group_size(self) -> int:
        n = torch.Size(self.shape).numel()
        return n // self.channels if self.norm == "bnn" else self.channels

    @property
    def label(self) -> str:
        return "x".join(map(str, self.shape)) + (" cl" if self.channels_last else "")


CASES = [Case("bnn", (128, 64, 32, 32)), Case("bnn", (128, 512, 4, 4)), Case("bnn", (128, 64, 32, 32), True),
         Case("lnn", (32, 65, 768), group="vit"), Case("lnn", (8, 1024, 4096), group="lm"),
         Case("lnn", (16, 1024, 1024), group="lm"), Case("lnn", (4, 2048, 8192), group="lm")]


def model_passes(case: Case, path: str, noise: bool = True) -> tuple[int, int] | None:
    """DRAM passes over the activation (forward, backward) in the roofline model, or None (no model)."""
    base = path.split("@")[0]
    if base == "BN":
        return 3, 5
    if base in ("LN", "RMS"):
        return 2, 3
    if base not in ("triton", "kernel"):
        return None
    from normkit_normalnorm.triton_kernels.config import config

    forward = 2 if case.group_size <= config.row_max else (6 if noise else 4)
    backward = 3 if case.group_size <= min(config.row_max, config.backward_row_max) else 5
    return forward, backward


@dataclass
class Timing:
    forward: float | None = None
    backward: float | None = None
    step: float | None = None
    eval: float | None = None
    peak_mb: float | None = None
    extra: dict = field(default_factory=dict)


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


def measure(call: Callable[[torch.Tensor], torch.Tensor], set_mode: Callable[[bool], object] | None,
            x: torch.Tensor, dy: torch.Tensor, params: list[torch.Tensor], args: argparse.Namespace) -> Timing:
    """Train forward, backward alone, forward+backward, eval forward, peak memory of a step."""
    xg = x.detach().requires_grad_()
    inputs = [xg, *[p for p in params if p.requires_grad]]

    def forward() -> torch.Tensor:
        with torch.no_grad():
            return call(x)

    def step() -> None:
        torch.autograd.grad(call(xg), inputs, dy)

    t = Timing()
    if set_mode:
        set_mode(True)
    t.forward = cuda_median_ms(forward, args.warmup, args.reps)
    t.step = cuda_median_ms(step, args.warmup, args.reps)
    graph_output = call(xg)

    def backward() -> None:
        torch.autograd.grad(graph_output, inputs, dy, retain_graph=True)

    t.backward = cuda_median_ms(backward, args.warmup, args.reps)
    t.peak_mb = peak_mb(step)
    if set_mode:
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

    return call


def baselines(case: Case, dtype: torch.dtype) -> dict[str, torch.nn.Module]:
    if case.norm == "bnn":  # fp32 affine: cuDNN (fp32) / native kernels (bf16), as models use it
        return {"BN": torch.nn.BatchNorm2d(case.channels).cuda()}
    return {"LN": torch.nn.LayerNorm(case.channels).cuda().to(dtype),
            "RMS": torch.nn.RMSNorm(case.channels).cuda().to(dtype)}


def run_case(case: Case, dtype: torch.dtype, args: argparse.Namespace) -> dict[str, Timing]:
    import normkit

    gen = torch.Generator(device="cuda").manual_seed(0)
    memory = torch.channels_last if case.channels_last else torch.contiguous_format
    x = torch.randn(case.shape, device="cuda", generator=gen).to(dtype, memory_format=memory)
    dy = torch.randn(case.shape, device="cuda", generator=gen).to(dtype, memory_format=memory)
    channel_dim = 1 if case.norm == "bnn" else -1
    out: dict[str, Timing] = {}
    for name, module in baselines(case, dtype).items():
        out[name] = measure(module, module.train, x, dy, list(module.parameters()), args)
        if args.compiled:  # train mode only: an eval forward would be one more compile per case
            compiled = torch.compile(module, dynamic=False)
            out[f"{name}@c"] = measure(compiled, None, x, dy, list(module.parameters()), args)
    layers = {kind: normkit.build(f"{case.norm}(kernel={kind})", case.channels, channel_dim=channel_dim).cuda()
              for kind in ("triton", "torch")}
    for kind, layer in layers.items():
        out[kind] = measure(layer, layer.train, x, dy, list(layer.parameters()), args)
    tri = layers["triton"]
    out["kernel"] = measure(kernel_call(case.norm, tri, dtype), tri.train, x, dy, [tri.weight, tri.bias], args)
    if args.reference:
        reference = normkit.build(f"{case.norm}(kernel=torch)", case.channels, channel_dim=channel_dim).cuda()
        reference.add_probe(lambda layer, values: None)  # probes force the step-by-step path
        out["reference"] = measure(reference, reference.train, x, dy, list(reference.parameters()), args)
    return out


def check_against_cpu(case: Case, dname: str) -> tuple[float, bool]:
    """Largest |difference| of the Triton layer's output and gradients (noise off, training) from the
    float64 CPU reference, scaled like assert_close (|d| <= tol + tol·|want|); and whether it passes."""
    import normkit

    dtype, tol = DTYPES[dname], TOLERANCE[dname]
    channel_dim = 1 if case.norm == "bnn" else -1
    shape = case.shape if case.norm == "bnn" else (2, *case.shape[1:])  # a few tokens say the same
    g = torch.Generator().manual_seed(22)
    # skewed, as the kernel tests; rounded to the benchmark dtype first, so the reference sees the
    # same inputs (the check is of the kernel's arithmetic, not of bf16's input rounding)
    x = (torch.randn(shape, generator=g).exp() - 1).to(dtype).double()
    dy = torch.randn(shape, generator=g).to(dtype).double()
    gpu = normkit.build(f"{case.norm}(kernel=triton, noise=0)", case.channels, channel_dim=channel_dim).cuda()
    cpu = normkit.build(f"{case.norm}(kernel=torch, noise=0)", case.channels, channel_dim=channel_dim).double()
    with torch.no_grad():
        for p in (*gpu.parameters(), *cpu.parameters()):
            p.copy_(torch.linspace(0.5, 1.5, p.numel()).reshape(p.shape))
    memory = torch.channels_last if case.channels_last else torch.contiguous_format
    xg = x.to("cuda", dtype).contiguous(memory_format=memory).requires_grad_()
    xc = x.double().requires_grad_()
    got = [gpu(xg)]
    got += list(torch.autograd.grad(got[0], [xg, gpu.weight, gpu.bias], dy.to("cuda", dtype)))
    want = [cpu(xc)]
    want += list(torch.autograd.grad(want[0], [xc, cpu.weight, cpu.bias], dy.double()))
    worst = 0.0
    for a, b in zip(got, want, strict=True):
        a, b = a.detach().double().cpu(), b.detach()
        worst = max(worst, ((a - b).abs() / (tol + tol * b.abs())).max().item())
    return worst, worst <= 1.0


def gbps(nbytes: float, ms: float | None) -> float | None:
    return None if not ms else nbytes / (ms * 1e-3) / 1e9


def fmt(v: float | None, spec: str = ".3f") -> str:
    return "-" if v is None else format(v, spec)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtypes", default="fp32,bf16", help="comma list of fp32, bf16")
    parser.add_argument("--cases", default="conv,vit,lm", help="comma list of conv (bnn), vit, lm (lnn)")
    parser.add_argument("--reps", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--peak-gbps", type=float, default=None, help="HBM peak; default from the device name")
    parser.add_argument("--no-compiled", dest="compiled", action="store_false", help="skip torch.compile baselines")
    parser.add_argument("--reference", action="store_true", help="also time the slow step-by-step path")
    parser.add_argument("--json", default=None, help="write every timing to this JSON file")
    parser.add_argument("--check-only", action="store_true", help="only the check against the CPU reference")
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
    # The backward is also timed alone, from a retained graph; compiled graphs donate their saved
    # buffers to the backward by default, which forbids retain_graph.
    torch._functorch.config.donated_buffer = False
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    groups = {c.strip() for c in args.cases.split(",") if c.strip()}
    if unknown := [d for d in dtypes if d not in DTYPES] + sorted(groups - {"conv", "vit", "lm"}):
        print(f"bench_normalnorm_gpu: unknown {unknown}; dtypes fp32/bf16, cases conv/vit/lm", file=sys.stderr)
        return 2
    name = torch.cuda.get_device_name()
    peak = args.peak_gbps or next((v for k, v in PEAK_GBPS.items() if k in name), None)
    print(f"device: {name}; HBM peak {fmt(peak, '.0f')} GB/s; torch {torch.__version__}; triton {triton.__version__}")
    print(f"CUDA events, {args.warmup} warm-up runs, median of {args.reps}; times in ms; GB/s and %peak from the "
          "roofline model's bytes; roofline = model bytes / peak\n")
    header = (f"{'norm':4} {'shape':16} {'dtype':5} {'path':9} {'fwd':>7} {'bwd':>7} {'step':>7} {'eval':>7} "
              f"{'fwd GB/s':>8} {'fwd %pk':>7} {'bwd GB/s':>8} {'bwd %pk':>7} {'roof µs':>7} {'step/roof':>9} "
              f"{'peak MB':>8}")
    print(header)
    print("-" * len(header))
    records, checks = [], []
    for dname in dtypes:
        dtype = DTYPES[dname]
        for case in (c for c in CASES if c.group in groups):
            if args.check_only:
                worst, ok = check_against_cpu(case, dname)
                checks.append(f"{case.norm} {case.label} {dname}: worst {worst:.3f}: {'ok' if ok else 'FAILED'}")
                continue
            result = run_case(case, dtype, args)
            numel, size = torch.Size(case.shape).numel(), torch.empty((), dtype=dtype).element_size()
            for path, t in result.items():
                passes = model_passes(case, path)
                fwd_b, bwd_b = (None, None) if passes is None else (passes[0] * numel * size, passes[1] * numel * size)
                fwd_bw, bwd_bw = gbps(fwd_b or 0, t.forward), gbps(bwd_b or 0, t.backward)
                roof_us = None if passes is None or peak is None else (fwd_b + bwd_b) / (peak * 1e9) * 1e6
                t.extra = {"fwd_gbps": fwd_bw if passes else None, "bwd_gbps": bwd_bw if passes else None,
                           "fwd_pct": None if not passes or peak is None else 100 * fwd_bw / peak,
                           "bwd_pct": None if not passes or peak is None else 100 * bwd_bw / peak,
                           "roofline_us": roof_us, "step_over_roofline": None if roof_us is None
                           else t.step * 1e3 / roof_us, "passes": passes}
                e = t.extra
                print(f"{case.norm:4} {case.label:16} {dname:5} {path:9} {fmt(t.forward):>7} {fmt(t.backward):>7} "
                      f"{fmt(t.step):>7} {fmt(t.eval):>7} {fmt(e['fwd_gbps'], '.0f'):>8} "
                      f"{fmt(e['fwd_pct'], '.0f'):>7} {fmt(e['bwd_gbps'], '.0f'):>8} {fmt(e['bwd_pct'], '.0f'):>7} "
                      f"{fmt(roof_us, '.1f'):>7} {fmt(e['step_over_roofline'], '.2f'):>9} {fmt(t.peak_mb, '.1f'):>8}",
                      flush=True)
                records.append({"norm": case.norm, "shape": case.label, "dtype": dname, "path": path, **asdict(t)})
            worst, ok = check_against_cpu(case, dname)
            checks.append(f"{case.norm} {case.label} {dname}: triton layer vs float64 CPU reference (noise off), "
                          f"worst |diff| / (tol + tol·|want|) = {worst:.3f} with tol {TOLERANCE[dname]:g}: "
                          f"{'ok' if ok else 'FAILED'}")
            checks.extend(target_checks(f"{case.norm} {case.label} {dname}", case.norm, result))
            print(flush=True)
            if args.json:  # after every case, so a run cut short keeps what it measured
                with open(args.json, "w") as f:
                    json.dump({"device": name, "peak_gbps": peak, "torch": torch.__version__,
                               "triton": triton.__version__, "warmup": args.warmup, "reps": args.reps,
                               "records": records, "checks": checks}, f, indent=1)
    print("checks and targets (docs/performance.md)")
    for line in checks:
        print("  " + line)
    return 1 if any("FAILED" in line for line in checks) else 0


def target_checks(label: str, norm: str, r: dict[str, Timing]) -> list[str]:
    tri, kern = r["triton"], r["kernel"]
    lines = []
    if norm == "bnn":
        base = r["BN"]
        lines.append(f"{label}: train fwd+bwd triton/BN = {tri.step / base.step:.2f} (target <= 2.0)")
        if "reference" in r:
            lines.append(f"{label}: train fwd+bwd reference/triton = {r['reference'].step / tri.step:.2f} "
                         "(target >= 3.0)")
        lines.append(f"{label}: eval fwd triton/BN = {tri.eval / base.eval:.2f} (target <= 1.2)")
    else:
        lines.append(f"{label}: train fwd+bwd triton/LN = {tri.step / r['LN'].step:.2f} (target <= 1.5)")
        if kern.extra.get("fwd_pct") is not None and model_passes_row(kern):
            lines.append(f"{label}: row kernel fwd = {kern.extra['fwd_pct']:.0f}% of HBM peak (target >= 70%)")
    return lines


def model_passes_row(t: Timing) -> bool:
    return t.extra.get("passes", (0,))[0] == 2


if __name__ == "__main__":
    sys.exit(main())
