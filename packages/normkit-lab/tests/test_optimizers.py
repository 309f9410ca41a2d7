"""`optimizer: muon`: Muon on the hidden matrices, AdamW on the rest, as one optimizer that the schedule,
checkpoints and resume treat like any other; each part computes what torch's own optimizer does (on CPU
the Muon part's Newton-Schulz iteration in float32 instead of bfloat16)."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import normkit
from normkit_lab.records import RunId
from normkit_lab.runs.execute import Job, RunOptions, run_job
from normkit_lab.runs.optimizers import Float32Muon, MuonAdamW, build_optimizer, hidden_matrices
from normkit_lab.spec import TrainConfig
from normkit_lab.study import compare, config

GPT = {"model": "gpt-tiny", "model_params": {"width": 16, "depth": 1, "heads": 2, "context": 16},
       "dataset_params": {"seq_len": 16, "train_windows": 64, "eval_windows": 16, "max_files": 40}}


def _gpt() -> nn.Module:
    from normkit_lab.models import build_model

    torch.manual_seed(0)
    return build_model("gpt-tiny", "rms", num_classes=256, in_channels=0, image_size=16,
                       **GPT["model_params"])


def test_muon_takes_the_hidden_linear_weights_only():
    model = _gpt()
    names = {n for n, p in model.named_parameters() if id(p) in hidden_matrices(model)}
    assert names == {"blocks.0.attn.qkv.weight", "blocks.0.attn.proj.weight", "blocks.0.mlp.fc.weight",
                     "blocks.0.mlp.proj.weight"}  # not the embeddings, the tied head, norms or biases
    vit = nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 3))
    assert hidden_matrices(vit) == {id(vit[0].weight)}  # the last Linear is the output layer
    assert hidden_matrices(nn.Conv2d(1, 2, 3)) == set()


def test_each_part_steps_exactly_as_torchs_own_optimizer_with_a_float32_newton_schulz_on_cpu():
    model, twin = _gpt(), _gpt()
    groups = normkit.param_groups(model, 0.05)
    opt = build_optimizer("muon", groups, model, 3e-3, 0.9)
    assert isinstance(opt, MuonAdamW) and type(opt._parts[0]) is Float32Muon
    hidden = hidden_matrices(twin)
    twin_groups = normkit.param_groups(twin, 0.05)
    muon = Float32Muon([{**g, "params": [p for p in g["params"] if id(p) in hidden]} for g in twin_groups
                             if any(id(p) in hidden for p in g["params"])], lr=3e-3, adjust_lr_fn="match_rms_adamw")
    adamw = torch.optim.AdamW([{**g, "params": [p for p in g["params"] if id(p) not in hidden]}
                               for g in twin_groups], lr=3e-3)
    x = torch.randint(0, 256, (4, 16))
    for _ in range(3):
        for m, optimizers in ((model, [opt]), (twin, [muon, adamw])):
            loss = m(x).logsumexp(-1).mean()
            for o in optimizers:
                o.zero_grad()
            loss.backward()
            for o in optimizers:
                o.step()
    for (name, a), b in zip(model.named_parameters(), twin.parameters(), strict=True):
        assert torch.equal(a, b), name


def _newton_schulz_float64(g: torch.Tensor, steps: int = 5) -> torch.Tensor:
    """The quintic iteration of torch.optim.Muon, in float64: the value both precisions approximate."""
    a, b, c = 3.4445, -4.7750, 2.0315
    x = g.double().T if g.shape[0] > g.shape[1] else g.double()
    x = x / x.norm().clamp(min=1e-7)
    for _ in range(steps):
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x.T if g.shape[0] > g.shape[1] else x


def test_float32_muon_is_torchs_update_with_an_exact_newton_schulz():
    """One step from the same weight and gradient: Float32Muon's update is the float64 iteration's to float32
    rounding; torch's own (bfloat16) is the same update to bfloat16 rounding, hundreds of times coarser."""
    torch.manual_seed(0)
    updates = {}
    for cls in (Float32Muon, torch.optim.Muon):
        for shape in ((48, 16), (16, 48)):  # tall and wide matrices
            w = nn.Parameter(torch.zeros(shape))
            w.grad = torch.randn(shape, generator=torch.Generator().manual_seed(shape[0]))
            cls([w], lr=0.1, momentum=0.0, nesterov=False, weight_decay=0.0, adjust_lr_fn="match_rms_adamw").step()
            updates[cls, shape] = -w.detach() / (0.1 * 0.2 * max(shape) ** 0.5)
    for shape in ((48, 16), (16, 48)):
        exact = _newton_schulz_float64(torch.randn(shape, generator=torch.Generator().manual_seed(shape[0])))
        err32 = (updates[Float32Muon, shape].double() - exact).abs().max().item()
        err16 = (updates[torch.optim.Muon, shape].double() - exact).abs().max().item()
        assert err32 < 1e-5 and err16 > 100 * err32, (shape, err32, err16)


def test_the_schedule_moves_both_parts_and_the_state_dict_has_torchs_layout():
    model = _gpt()
    opt = build_optimizer("muon", normkit.param_groups(model, 0.05), model, 1e-2, 0.9)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: 0.5 ** i)
    x = torch.randint(0, 256, (4, 16))
    for _ in range(2):
        opt.zero_grad()
        model(x).logsumexp(-1).mean().backward()
        opt.step()
        sched.step()
    assert all(part.param_groups[0]["lr"] == pytest.approx(2.5e-3) for part in opt._parts)
    state = opt.state_dict()
    assert sorted(state["state"]) == list(range(sum(1 for _ in model.parameters())))
    fresh = build_optimizer("muon", normkit.param_groups(model, 0.05), model, 1e-2, 0.9)
    fresh.load_state_dict(copy.deepcopy(state))
    assert all(torch.equal(fresh.state[p]["momentum_buffer" if "momentum_buffer" in fresh.state[p] else "exp_avg"],
                           opt.state[p]["momentum_buffer" if "momentum_buffer" in opt.state[p] else "exp_avg"])
               for p in model.parameters())
    assert fresh._parts[0].state is fresh.state and fresh._parts[0].param_groups[0] is fresh.param_groups[0]


def _interrupt_at(epoch: int):
    def events(kind, value):
        if kind == "epoch" and value[1].epoch == epoch:
            raise KeyboardInterrupt

    return events


def test_a_muon_run_resumes_bit_identically(tmp_path):
    cfg = config.build_config({"norms": "rms", "seeds": 1, "epochs": 2, "batch_size": 16, "device": "cpu",
                               "optimizer": "muon", "budget": None, **GPT})
    compare.check(cfg)
    whole = compare.create_store(cfg, tmp_path / "whole")
    run_job(Job.make(cfg, RunId.of("rms", 0), whole, RunOptions(keep_checkpoints=True)))
    cut = compare.create_store(cfg, tmp_path / "cut")
    with pytest.raises(KeyboardInterrupt):
        run_job(Job.make(cfg, RunId.of("rms", 0), cut, RunOptions(keep_checkpoints=True)), _interrupt_at(1))
    run_job(Job.make(cfg, RunId.of("rms", 0), cut, RunOptions(keep_checkpoints=True)))
    timing = {"epoch_time_s", "cpu_time_s", "load_avg", "throughput", "peak_mem_mb"}
    rows = [[{k: v for k, v in r.items() if k not in timing} for r in s.rows()] for s in (whole, cut)]
    assert rows[0] == rows[1] and rows[0][0]["status"] == "ok"
    muon = TrainConfig(dataset="digits", optimizer="muon")
    assert (muon.resolved_lr, muon.resolved_weight_decay) == (1e-3, 0.05)  # AdamW-sized steps: AdamW's defaults


def test_an_unknown_optimizer_names_the_choices():
    cfg = config.build_config({"dataset": "digits", "norms": "bn", "optimizer": "lion", "seeds": 1})
    with pytest.raises(Exception, match="sgd, adamw, muon"):
        compare.check(cfg)
