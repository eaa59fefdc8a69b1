#!/usr/bin/env python3
"""Writes tests/fixtures/optim/adamw.safetensors: what PyTorch does for gradient clipping, AdamW
and torchtitan's learning-rate schedule, for tests/unit/test_optim.c.

Optimizer cases (6 steps each, the same random gradients):
  torch.nn.utils.clip_grad_norm_(max_norm) (skipped when max_norm <= 0; the norm is still recorded)
  torch.optim.AdamW(foreach=False, fused=False), weight decay only in the param group of the
  rank >= 2 params (torchtitan decays matrices only), LambdaLR with torchtitan's
  linear_warmup_stable_decay lambda (re-implemented below from torchtitan's lr_scheduler.py).
Params: a matrix, a vector and a 3-D tensor. Per case and step the fixture records the lr the
step used, the pre-clip grad norm, and params / exp_avg / exp_avg_sq after the step.

Schedule cases: the lr of every step under LambdaLR for several (steps, warmup, decay_ratio,
decay_type, min_lr_factor) settings, covering warmup capping, decay capping and round-half-even.

Doubles (lrs) are stored bit-exactly as I64 tensors holding the IEEE-754 bits; settings go in the
metadata as text (Python repr round-trips through strtod).

Usage: python3 tools/gen_optim_fixture.py [out_path]
"""
import functools
import math
import os
import struct
import sys

import torch
from safetensors.torch import save_file

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "fixtures", "optim", "adamw.safetensors")

PARAMS = [  # (fqn, shape)
    ("layers.0.attention.wq.weight", (5, 7)),
    ("layers.0.attention_norm.weight", (7,)),
    ("layers.0.moe.experts.w1", (2, 3, 4)),
]
STEPS = 6
# Per-step gradient scales: some steps clip, some do not.
GRAD_SCALES = [0.05, 3.0, 0.2, 10.0, 0.01, 1.0]

OPT_CASES = [
    # name, lr, betas, eps, weight_decay, max_norm, schedule (warmup, decay_ratio, type, min)
    ("clip", 1e-2, (0.9, 0.95), 1e-8, 0.1, 0.5, (2, 0.5, "linear", 0.1)),
    ("noclip", 3e-3, (0.9, 0.95), 1e-8, 0.1, 0.0, (1, None, "cosine", 0.0)),
    ("lowbeta", 5e-2, (0.3, 0.9), 1e-6, 0.05, 2.0, (0, 0.8, "sqrt", 0.2)),
]

SCHED_CASES = [
    # steps, warmup, decay_ratio, decay_type, min_lr_factor, lr
    (10, 2, None, "linear", 0.0, 8e-4),
    (10, 2, 0.8, "linear", 0.0, 8e-4),
    (10, 2, 0.8, "linear", 0.1, 8e-4),
    (12, 3, 0.5, "cosine", 0.1, 3e-4),
    (12, 0, None, "cosine", 0.0, 1e-3),
    (12, 4, None, "cosine", 0.05, 1e-3),
    (7, 2, 0.5, "sqrt", 0.2, 1e-3),  # round(3.5) = 4
    (10, 2, 0.25, "cosine", 0.0, 1e-3),  # round(2.5) = 2 (half to even)
    (5, 2, 0.9, "linear", 0.0, 1e-3),  # warmup + decay > steps: decay capped at 3
    (3, 5, None, "linear", 0.0, 1e-3),  # warmup > steps: capped at 3
    (10, 3, 0.0, "linear", 0.0, 1e-3),  # no decay
    (1, 0, None, "cosine", 0.1, 1e-3),
]


def schedule_lambda(training_steps, warmup_steps, decay_ratio, decay_type, min_lr_factor):
    """torchtitan's build_lr_schedulers + linear_warmup_stable_decay, re-implemented."""
    if warmup_steps > training_steps:
        warmup_steps = training_steps
    if decay_ratio is not None:
        decay_steps = round(training_steps * decay_ratio)
        if warmup_steps + decay_steps > training_steps:
            decay_steps = training_steps - warmup_steps
    else:
        decay_steps = training_steps - warmup_steps
    stable_steps = training_steps + 1 - warmup_steps - decay_steps

    def f(current_step, warmup_steps, stable_steps, decay_steps, decay_type, min_lr_factor):
        warmup_stable_steps = warmup_steps + stable_steps
        if current_step < warmup_steps:
            current_step += 1
            return float(current_step / warmup_steps)
        if current_step < warmup_stable_steps:
            return 1.0
        current_step += 1
        progress = float(current_step - warmup_stable_steps) / decay_steps
        if decay_type == "linear":
            adj = 1 - progress
        elif decay_type == "sqrt":
            adj = 1 - math.sqrt(progress)
        elif decay_type == "cosine":
            adj = 0.5 * (1.0 + math.cos(math.pi * progress))
        else:
            raise ValueError(decay_type)
        return min_lr_factor + (1 - min_lr_factor) * adj

    return functools.partial(
        f,
        warmup_steps=warmup_steps,
        stable_steps=stable_steps,
        decay_steps=decay_steps,
        decay_type=decay_type,
        min_lr_factor=min_lr_factor,
    )


def double_bits(values):
    return torch.tensor([struct.unpack("<q", struct.pack("<d", v))[0] for v in values],
                        dtype=torch.int64)


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else OUT
    torch.manual_seed(1234)
    tensors = {}
    meta = {"format": "graphtrain-optim-fixture", "steps": str(STEPS),
            "params": ",".join(f for f, _ in PARAMS)}

    init = [torch.randn(shape, dtype=torch.float32) for _, shape in PARAMS]
    for (fqn, _), t in zip(PARAMS, init):
        tensors[f"init.{fqn}"] = t.clone()
    grads = []
    for s in range(STEPS):
        step_grads = [torch.randn(shape, dtype=torch.float32) * GRAD_SCALES[s]
                      for _, shape in PARAMS]
        grads.append(step_grads)
        for (fqn, _), g in zip(PARAMS, step_grads):
            tensors[f"step{s + 1}.grad.{fqn}"] = g.clone()

    for name, lr, betas, eps, wd, max_norm, (warmup, ratio, dtype, min_f) in OPT_CASES:
        meta[f"case.{name}"] = " ".join(repr(x) for x in (
            lr, betas[0], betas[1], eps, wd, max_norm, STEPS, warmup,
            -1.0 if ratio is None else ratio, min_f)) + f" {dtype}"
        params = [torch.nn.Parameter(t.clone()) for t in init]
        decay = [p for p in params if p.dim() >= 2]
        no_decay = [p for p in params if p.dim() < 2]
        opt = torch.optim.AdamW(
            [{"params": decay, "weight_decay": wd}, {"params": no_decay, "weight_decay": 0.0}],
            lr=lr, betas=betas, eps=eps, weight_decay=wd, foreach=False, fused=False)
        sched = torch.optim.lr_scheduler.LambdaLR(
            opt, schedule_lambda(STEPS, warmup, ratio, dtype, min_f))
        lrs = []
        norms = []
        for s in range(STEPS):
            for p, g in zip(params, grads[s]):
                p.grad = g.clone()
            if max_norm > 0:
                norm = torch.nn.utils.clip_grad_norm_(params, max_norm, foreach=False)
            else:
                norm = torch.nn.utils.get_total_norm([p.grad for p in params], foreach=False)
            norms.append(float(norm))
            lrs.append(opt.param_groups[0]["lr"])
            assert opt.param_groups[1]["lr"] == lrs[-1]
            opt.step()
            sched.step()
            for (fqn, _), p in zip(PARAMS, params):
                st = opt.state[p]
                tensors[f"{name}.step{s + 1}.param.{fqn}"] = p.detach().clone()
                tensors[f"{name}.step{s + 1}.exp_avg.{fqn}"] = st["exp_avg"].clone()
                tensors[f"{name}.step{s + 1}.exp_avg_sq.{fqn}"] = st["exp_avg_sq"].clone()
        tensors[f"{name}.lrs"] = double_bits(lrs)
        tensors[f"{name}.grad_norms"] = torch.tensor(norms, dtype=torch.float32)

    for k, (steps, warmup, ratio, dtype, min_f, lr) in enumerate(SCHED_CASES):
        meta[f"sched.{k}"] = " ".join(repr(x) for x in (
            steps, warmup, -1.0 if ratio is None else ratio, min_f, lr)) + f" {dtype}"
        dummy = torch.nn.Parameter(torch.zeros(1))
        opt = torch.optim.SGD([dummy], lr=lr)
        sched = torch.optim.lr_scheduler.LambdaLR(
            opt, schedule_lambda(steps, warmup, ratio, dtype, min_f))
        lrs = []
        for _ in range(steps):
            lrs.append(opt.param_groups[0]["lr"])
            opt.step()
            sched.step()
        tensors[f"sched.{k}.lrs"] = double_bits(lrs)
    meta["sched.count"] = str(len(SCHED_CASES))

    os.makedirs(os.path.dirname(out), exist_ok=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, out, metadata=meta)
    print(f"wrote {out}: {len(tensors)} tensors, {os.path.getsize(out)} bytes")


if __name__ == "__main__":
    main()
