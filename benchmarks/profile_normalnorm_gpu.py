"""Where a Triton training step of the normality norm spends its GPU time: torch.profiler over a
few steps of the layer (nn(kernel=triton)), each CUDA kernel's time per step, their sum (GPU busy)
beside the step's wall time (the rest is host work: Python, launches, torch's small ops).

    .venv/bin/python benchmarks/profile_normalnorm_gpu.py                       # the cases below, fp32
    .venv/bin/python benchmarks/profile_normalnorm_gpu.py lnn:8x1024x4096       # one case (for ncu, say)
"""

from __future__ import annotations

import sys
import time
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

CASES = [("bnn", (128, 64, 32, 32)), ("bnn", (128, 512, 4, 4)), ("lnn", (8, 1024, 4096)), ("lnn", (32, 65, 768))]
STEPS = 10


def main() -> int:
    import normkit

    if not torch.cuda.is_available():
        print("profile_normalnorm_gpu: no CUDA device", file=sys.stderr)
        return 2
    print(f"device: {torch.cuda.get_device_name()}; torch {torch.__version__}; {STEPS} training steps per case")
    cases = [(a.split(":")[0], tuple(int(v) for v in a.split(":")[1].split("x"))) for a in sys.argv[1:]] or CASES
    for norm, shape in cases:
        channels = shape[1] if norm == "bnn" else shape[-1]
        layer = normkit.build(f"{norm}(kernel=triton)", channels, channel_dim=1 if norm == "bnn" else -1).cuda()
        x = torch.randn(shape, device="cuda").requires_grad_()
        dy = torch.randn(shape, device="cuda")
        params = [x, *layer.parameters()]
        for _ in range(5):  # compile and warm up
            torch.autograd.grad(layer(x), params, dy)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            start = time.perf_counter()
            for _ in range(STEPS):
                torch.autograd.grad(layer(x), params, dy)
            torch.cuda.synchronize()
            wall = (time.perf_counter() - start) / STEPS
        per_kernel: dict[str, list[float]] = defaultdict(list)
        for event in prof.events():
            if event.device_type == torch.autograd.DeviceType.CUDA:
                per_kernel[event.name[:60]].append(event.device_time)
        busy = sum(sum(v) for v in per_kernel.values()) / STEPS
        print(f"\n{norm} {'x'.join(map(str, shape))} fp32: step wall {wall * 1e6:.0f} µs (under the profiler), "
              f"GPU busy {busy:.0f} µs, kernels per step {sum(len(v) for v in per_kernel.values()) / STEPS:.0f}")
        for name, times in sorted(per_kernel.items(), key=lambda kv: -sum(kv[1])):
            print(f"  {sum(times) / STEPS:8.1f} µs/step  {len(times) / STEPS:4.1f} calls/step  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
