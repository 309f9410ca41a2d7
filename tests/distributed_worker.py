"""One process of the synced-statistics check (`test_convert_sync.py` starts 1 or 2 of these).

Every process builds the same model (same seed) and takes its slice of the same global batch;
world size 1 is the single-process reference on the whole batch. Each process saves its outputs,
input gradients, summed parameter gradients, running buffers and eval outputs to `out/rank{r}.pt`.
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
from torch import nn

import normkit


def model(spec_a: str, spec_b: str) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), normkit.build(spec_a, 8), nn.ReLU(),
                         nn.Conv2d(8, 8, 3), normkit.build(spec_b, 8), nn.Flatten(), nn.Linear(8 * 4 * 4, 5))


def run_case(rank: int, world: int, rows: list[int], specs: str) -> dict:
    """Two training steps and one eval step of the model on this process's slice of the batch."""
    spec_a, spec_b = normkit.split_specs(specs)
    net = normkit.convert_sync(model(spec_a, spec_b))
    g = torch.Generator().manual_seed(1)
    batches = [torch.randn(sum(rows), 3, 6, 6, generator=g) * 2 + 0.5 for _ in range(2)]
    weights = torch.randn(sum(rows), 5, generator=g)
    lo = sum(rows[:rank]) if world > 1 else 0
    hi = lo + (rows[rank] if world > 1 else sum(rows))
    saved = {}
    for step, full in enumerate(batches):
        torch.manual_seed(100 + step)
        x = full[lo:hi].clone().requires_grad_(True)
        out = net(x)
        (out * weights[lo:hi]).sum().backward()
        saved[f"out{step}"], saved[f"xgrad{step}"] = out.detach(), x.grad.detach()
    grads = {name: p.grad.detach().clone() for name, p in net.named_parameters()}
    if world > 1:
        for grad in grads.values():
            dist.all_reduce(grad)  # what DDP does (it averages; the test sums, as one process does)
    saved["grads"] = grads
    saved["buffers"] = {name: b.detach().clone() for name, b in net.named_buffers()}
    net.eval()
    with torch.no_grad():
        saved["eval"] = net(batches[0][lo:hi])
    return saved


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world", type=int, required=True)
    ap.add_argument("--init", required=True)
    ap.add_argument("--cases", required=True,
                    help="';'-separated ROWS|SPECS, e.g. '5,3|bnn(noise=0),bn' (rows per process)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.world > 1:
        dist.init_process_group("gloo", init_method=args.init, rank=args.rank, world_size=args.world)
    results = []
    for case in args.cases.split(";"):
        rows, specs = case.split("|")
        results.append(run_case(args.rank, args.world, [int(v) for v in rows.split(",")], specs))
    torch.save(results, f"{args.out}/rank{args.rank}.pt")
    if args.world > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
