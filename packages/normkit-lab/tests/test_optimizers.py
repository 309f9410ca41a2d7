"""`optimizer: muon`: Muon on the hidden matrices, AdamW on the rest, as one optimizer that the schedule,
checkpoints and resume treat like any other; each part computes exactly what torch's own optimizer does."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import normkit
from normkit_lab.records import RunId
from normkit_lab.runs.execute import Job, RunOptions, run_job
from normkit_lab.runs.optimizers import MuonAdamW, build_optimizer, hidden_matrices
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


def test_each_part_steps_exactly_as_torchs_own_optimizer():
    model, twin = _gpt(), _gpt()
    groups = normkit.param_groups(model, 0.05)
    opt = build_optimizer("muon", groups, model, 3e-3, 0.9)
    assert isinstance(opt, MuonAdamW)
    hidden = hidden_matrices(twin)
    twin_groups = normkit.param_groups(twin, 0.05)
    muon = torch.optim.Muon([{**g, "params": [p for p in g["params"] if id(p) in hidden]} for g in twin_groups
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
