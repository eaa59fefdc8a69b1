#!/usr/bin/env python3
"""Whole-step graph build time: graphtrain vs PyTorch graph capture, llama3 debugmodel to 405B.

graphtrain side — one process per measurement:

    graphtrain graph --model.flavor F --graph.print false \
        --training.local_batch_size 8 --training.seq_len 2048 \
        [--training.mixed_precision_param float32]

builds forward + autodiff + AdamW as one graph, runs the pass pipeline on it (canonicalize, cse,
memory policy, remat, dce) and verifies it. We record the process wall time (perf_counter around
the subprocess), the "build" (construction + passes) and "verify" milliseconds it prints, the sum
of the per-pass times it logs, the node count as built (the first pass's input) and after the
passes, per phase. Two configurations: "default" (the command above as is: bf16 compute, so the
graph holds casts) and "fp32" (--training.mixed_precision_param float32, the dtype of the torch
trace below).

PyTorch side — one fresh Python process per measurement (so no trace is warmed by another):

    model = LlamaForCausalLM(LlamaConfig(<flavor>)) built under torch.device("meta")  (no memory)
    step(params, buffers, ids, labels):
        logits = torch.func.functional_call(model, params+buffers, ids).logits
        loss   = cross_entropy(logits.view(-1, V), labels.view(-1))
        grads  = torch.autograd.grad(loss, params)
        [variant "fwd_bwd_adamw" only: global-norm clip (torch.nn.utils.get_total_norm, then
         g *= clamp(max_norm / (norm + 1e-6), max=1) as clip_grad_norm_ does) and
         torch.optim.adamw.adamw(..., foreach=False, capturable=True) on matrices with weight
         decay 0.1 and on vectors without, as graphtrain's step does]
    gm = make_fx(step, tracing_mode="fake")(params, buffers, ids[8, 2048], labels[8, 2048])
    gm.graph.lint()

Tracing with tracing_mode="real" on meta tensors fails inside transformers: its packed-sequence
check (masking_utils.find_packed_sequence_indices) calls `.all()` on a tensor and branches on the
value unless it sees a FakeTensor or an fx Proxy, and a meta tensor has no value. So the trace runs
under FakeTensorMode (make_fx's "fake" mode) over the meta-device parameters; `--probe-real` reruns
the real-mode attempt on debugmodel and prints its error. Timed: the make_fx call only ("trace"),
graph.lint ("lint"), model construction on meta ("construct"), the imports of torch and
transformers ("import") and the whole process ("wall").

torch.optim's capturable path refuses devices other than cuda/xpu/hpu/xla outside torch.compile;
the fwd_bwd_adamw variant lets "meta" through (the check only guards real device execution; the
recorded ops are those torch.optim runs with capturable=True on any device).

Node counts: graphtrain counts operation nodes (graph inputs are values, not nodes); for torch we
count call_function nodes of the fx graph (placeholders and the output node excluded).

usage: bench/bench_graph_build.py [GRAPHTRAIN] [--flavors debugmodel,1B,8B,70B,405B]
                                  [--repeats 3] [--json out.json]
"""
import json
import os
import re
import statistics
import subprocess
import sys
import time

import bench_common as bc  # the transformers config, driver helpers: bench/bench_common.py

# llama3 flavors of src/models/flavors.c. ffn is derived with torchtitan's rule (ffn_hidden);
# the parameter count of the torch model is checked against the one graphtrain prints.
FLAVORS = {
    "debugmodel": dict(dim=256, layers=6, heads=16, kv_heads=16, vocab=2048, multiple_of=256,
                       multiplier=0.0),
    "1B": dict(dim=2048, layers=16, heads=32, kv_heads=8, vocab=128256, multiple_of=1024,
               multiplier=1.5),
    "8B": dict(dim=4096, layers=32, heads=32, kv_heads=8, vocab=128256, multiple_of=1024,
               multiplier=1.3),
    "70B": dict(dim=8192, layers=80, heads=64, kv_heads=8, vocab=128256, multiple_of=4096,
                multiplier=1.3),
    "405B": dict(dim=16384, layers=126, heads=128, kv_heads=8, vocab=128256, multiple_of=4096,
                 multiplier=1.2),
}
BATCH, SEQ = 8, 2048
ROPE_ORIGINAL = 8192  # RoPE original context of all these flavors
TORCH_LIMIT_S = 120.0  # a flavor whose torch trace takes longer stops the larger flavors
WORKER_TIMEOUT_S = 600


def ffn_hidden(dim, multiple_of, multiplier):
    """torchtitan FeedForward: int(8*dim/3), times the multiplier, rounded up to multiple_of."""
    hidden = (8 * dim) // 3
    if multiplier > 0:
        hidden = int(multiplier * hidden)
    return multiple_of * ((hidden + multiple_of - 1) // multiple_of)


def hf_config(flavor):
    """transformers LlamaConfig of a flavor: bench_common.llama_config of its shape."""
    fl = FLAVORS[flavor]
    return bc.llama_config(dict(
        dim=fl["dim"], layers=fl["layers"], heads=fl["heads"], kv_heads=fl["kv_heads"],
        vocab=fl["vocab"], ffn=ffn_hidden(fl["dim"], fl["multiple_of"], fl["multiplier"]),
        rope_original=ROPE_ORIGINAL))


# ---------------------------------------------------------------------------------------------
# PyTorch worker (runs in its own process; prints one JSON line)


def torch_worker(flavor, variant, tracing_mode):
    t_start = time.perf_counter()
    import torch
    import torch.nn.functional as F
    import torch.optim.adam as torch_adam
    from torch.optim.adamw import adamw as adamw_functional
    from torch.fx.experimental.proxy_tensor import make_fx
    from transformers import LlamaForCausalLM
    t_import = time.perf_counter()

    cfg = hf_config(flavor)
    with torch.device("meta"):
        model = LlamaForCausalLM(cfg)
    t_construct = time.perf_counter()

    V = cfg.vocab_size
    params = dict(model.named_parameters())
    buffers = dict(model.named_buffers())
    n_params = sum(p.numel() for p in params.values())
    names = list(params)
    decay = [n for n in names if params[n].ndim >= 2]
    no_decay = [n for n in names if params[n].ndim < 2]

    def forward_backward(params, buffers, ids, labels):
        out = torch.func.functional_call(model, {**params, **buffers}, (ids,),
                                         {"use_cache": False})
        loss = F.cross_entropy(out.logits.reshape(-1, V), labels.reshape(-1))
        grads = torch.autograd.grad(loss, [params[n] for n in names])
        return loss, dict(zip(names, grads))

    def step_fwd_bwd(params, buffers, ids, labels):
        loss, grads = forward_backward(params, buffers, ids, labels)
        return loss, [grads[n] for n in names]

    def step_adamw(params, buffers, ids, labels, exp_avg, exp_avg_sq, steps):
        loss, grads = forward_backward(params, buffers, ids, labels)
        with torch.no_grad():
            glist = [grads[n] for n in names]
            norm = torch.nn.utils.get_total_norm(glist, 2.0, foreach=False)
            coef = torch.clamp(1.0 / (norm + 1e-6), max=1.0)  # max_norm 1.0
            for g in glist:
                g.mul_(coef)
            for group, wd in ((decay, 0.1), (no_decay, 0.0)):
                adamw_functional(
                    [params[n] for n in group], [grads[n] for n in group],
                    [exp_avg[n] for n in group], [exp_avg_sq[n] for n in group], [],
                    [steps[n] for n in group], foreach=False, capturable=True,
                    amsgrad=False, beta1=0.9, beta2=0.95, lr=8e-4, weight_decay=wd, eps=1e-8,
                    maximize=False)
        return loss, norm

    ids = torch.zeros(BATCH, SEQ, dtype=torch.long, device="meta")
    labels = torch.zeros(BATCH, SEQ, dtype=torch.long, device="meta")
    if variant == "fwd_bwd":
        fn, args = step_fwd_bwd, (params, buffers, ids, labels)
    else:
        # See the module docstring: the device check is for running, not for recording.
        supported = torch_adam._get_capturable_supported_devices
        torch_adam._get_capturable_supported_devices = lambda *a, **k: supported(*a, **k) + [
            "meta"]
        exp_avg = {n: torch.zeros_like(p) for n, p in params.items()}
        exp_avg_sq = {n: torch.zeros_like(p) for n, p in params.items()}
        steps = {n: torch.zeros((), dtype=torch.float32, device="meta") for n in params}
        fn, args = step_adamw, (params, buffers, ids, labels, exp_avg, exp_avg_sq, steps)

    t0 = time.perf_counter()
    gm = make_fx(fn, tracing_mode=tracing_mode)(*args)
    t1 = time.perf_counter()
    gm.graph.lint()
    t2 = time.perf_counter()

    kinds = {}
    for node in gm.graph.nodes:
        kinds[node.op] = kinds.get(node.op, 0) + 1
    print(json.dumps(dict(
        flavor=flavor, variant=variant, tracing_mode=tracing_mode, params=n_params,
        import_s=t_import - t_start, construct_s=t_construct - t_import, trace_s=t1 - t0,
        lint_s=t2 - t1, nodes=kinds.get("call_function", 0),
        placeholders=kinds.get("placeholder", 0), torch=torch.__version__)))


# ---------------------------------------------------------------------------------------------
# driver


GRAPHTRAIN_CONFIGS = {"default": [], "fp32": ["--training.mixed_precision_param", "float32"]}


def run_graphtrain(binary, flavor, config):
    cmd = [binary, "graph", "--model.flavor", flavor, "--graph.print", "false",
           "--training.local_batch_size", str(BATCH), "--training.seq_len", str(SEQ)]
    cmd += GRAPHTRAIN_CONFIGS[config]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr}")
    out = proc.stdout + proc.stderr
    m = re.search(r"nodes\s+(\d+) \(forward (\d+), backward (\d+), optimizer (\d+)\)", out)
    b = re.search(r"build\s+([\d.]+) ms .*verify ([\d.]+) ms", out)
    p = re.search(r"parameters\s+(\d+)", out)
    if not (m and b and p):
        sys.exit(f"could not read the summary of {' '.join(cmd)}:\n{out}")
    passes = re.findall(r"pass (\w+)\s+([\d.]+) ms\s+nodes (\d+) -> (\d+)", out)
    return dict(wall_s=wall, build_ms=float(b.group(1)), verify_ms=float(b.group(2)),
                passes_ms=sum(float(x[1]) for x in passes),
                nodes_built=int(passes[0][2]) if passes else int(m.group(1)),
                nodes=int(m.group(1)), forward=int(m.group(2)), backward=int(m.group(3)),
                optimizer=int(m.group(4)), params=int(p.group(1)), config=config)


def run_torch(flavor, variant, tracing_mode="fake"):
    cmd = [sys.executable, os.path.abspath(__file__), "--torch-worker", flavor, variant,
           tracing_mode]
    res, wall = bc.run_json_worker(cmd, WORKER_TIMEOUT_S)
    if "error" not in res:
        res["wall_s"] = wall
        res["loadavg_1min_after"] = os.getloadavg()[0]  # the machine may be shared
    return res


def summary(values):
    """median and (min, max) of a list of numbers"""
    return statistics.median(values), min(values), max(values)


def fmt(values, scale=1.0, digits=1):
    med, lo, hi = summary([v * scale for v in values])
    return f"{med:.{digits}f} ({lo:.{digits}f}–{hi:.{digits}f})"


def report(paths):
    """Pools the measurements of several --json files into one set of tables."""
    pooled = dict(graphtrain={}, torch={})
    for path in paths:
        with open(path) as f:
            res = json.load(f)
        for side in ("graphtrain", "torch"):
            for key, runs in res[side].items():
                pooled[side].setdefault(key, []).extend(runs)
    flavors = [f for f in FLAVORS if f"{f}/fp32" in pooled["graphtrain"]]
    variants = [v for v in ("fwd_bwd", "fwd_bwd_adamw")
                if any(k.endswith("/" + v) for k in pooled["torch"])]
    print(f"{len(paths)} file(s) pooled")
    print_tables(pooled, flavors, variants)


def main():
    ap = bc.arg_parser(__doc__)
    ap.add_argument("--flavors", default=",".join(FLAVORS))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--variants", default="fwd_bwd,fwd_bwd_adamw")
    ap.add_argument("--probe-real", action="store_true",
                    help="also try make_fx tracing_mode='real' on meta tensors (debugmodel)")
    ap.add_argument("--json", help="write every measurement here")
    ap.add_argument("--report", nargs="+", metavar="JSON",
                    help="run nothing: pool the measurements of these --json files and print "
                         "the tables")
    args = ap.parse_args()
    if args.report:
        report(args.report)
        return

    flavors = args.flavors.split(",")
    variants = [v for v in args.variants.split(",") if v]
    bc.require_known("flavor", flavors, FLAVORS)
    bc.require_known("variant", variants, ("fwd_bwd", "fwd_bwd_adamw"))
    bc.require_executable(args.graphtrain)

    results = dict(batch=BATCH, seq=SEQ, repeats=args.repeats, graphtrain={}, torch={})
    if args.probe_real:
        r = run_torch("debugmodel", "fwd_bwd", "real")
        results["probe_real"] = r
        print(f"probe: make_fx tracing_mode='real' on meta, debugmodel: "
              f"{r.get('error', 'worked, %d nodes' % r.get('nodes', 0))}", flush=True)

    skipped = {}
    for flavor in flavors:
        for config in GRAPHTRAIN_CONFIGS:
            gt = [run_graphtrain(args.graphtrain, flavor, config) for _ in range(args.repeats)]
            results["graphtrain"][f"{flavor}/{config}"] = gt
            print(f"graphtrain {flavor} {config}: {gt[0]['nodes']} nodes, build ms "
                  f"{fmt([r['build_ms'] for r in gt], digits=2)}, wall ms "
                  f"{fmt([r['wall_s'] for r in gt], 1e3)}", flush=True)
        gt = results["graphtrain"][f"{flavor}/fp32"]
        for variant in variants:
            key = f"{flavor}/{variant}"
            if variant in skipped:
                results["torch"][key] = [dict(error=skipped[variant])]
                continue
            runs = []
            for _ in range(args.repeats):
                r = run_torch(flavor, variant)
                runs.append(r)
                if "error" in r:
                    break
                if r["params"] != gt[0]["params"]:
                    sys.exit(f"{flavor}: torch model has {r['params']} parameters, graphtrain "
                             f"{gt[0]['params']}: the shapes differ")
                if r["trace_s"] > TORCH_LIMIT_S:
                    skipped[variant] = f"skipped: {flavor} took {r['trace_s']:.0f} s"
                    break
            results["torch"][key] = runs
            ok = [r for r in runs if "error" not in r]
            if ok:
                print(f"torch {key}: {ok[0]['nodes']} nodes, trace s "
                      f"{fmt([r['trace_s'] for r in ok], digits=2)}, wall s "
                      f"{fmt([r['wall_s'] for r in ok], digits=2)}", flush=True)
            else:
                print(f"torch {key}: {runs[0]['error']}", flush=True)
    bc.write_json(args.json, results)
    print()
    print_tables(results, flavors, variants)


def print_tables(results, flavors, variants):
    print("| flavor | params | config | nodes built | nodes after passes (fwd / bwd / opt) | "
          "build + passes + verify ms | of which passes ms | process wall ms |")
    print("|---|---|---|---|---|---|---|---|")
    for flavor in flavors:
        for config in GRAPHTRAIN_CONFIGS:
            gt = results["graphtrain"].get(f"{flavor}/{config}")
            if not gt:
                continue
            g = gt[0]
            print(f"| {flavor} | {g['params'] / 1e9:.3f} B | {config} | {g['nodes_built']} | "
                  f"{g['nodes']} ({g['forward']} / {g['backward']} / {g['optimizer']}) | "
                  f"{fmt([r['build_ms'] + r['verify_ms'] for r in gt], digits=2)} | "
                  f"{fmt([r['passes_ms'] for r in gt], digits=2)} | "
                  f"{fmt([r['wall_s'] for r in gt], 1e3)} |")
    if not variants:
        return
    print()
    print("ratios: torch median ÷ graphtrain fp32 median")
    print("| flavor | torch graph | nodes | make_fx trace s | lint s | construct s | "
          "process wall s | trace / graphtrain build+verify | wall / graphtrain wall |")
    print("|---|---|---|---|---|---|---|---|---|")
    for flavor in flavors:
        gt = results["graphtrain"][f"{flavor}/fp32"]
        gt_build = statistics.median([r["build_ms"] + r["verify_ms"] for r in gt]) / 1e3
        gt_wall = statistics.median([r["wall_s"] for r in gt])
        for variant in variants:
            runs = results["torch"].get(f"{flavor}/{variant}", [])
            ok = [r for r in runs if "error" not in r]
            label = "fwd+bwd" if variant == "fwd_bwd" else "fwd+bwd+clip+AdamW"
            if not ok:
                err = runs[0]["error"] if runs else "not run"
                print(f"| {flavor} | {label} | – | {err} | | | | | |")
                continue
            trace = statistics.median([r["trace_s"] for r in ok])
            wall = statistics.median([r["wall_s"] for r in ok])
            print(f"| {flavor} | {label} | {ok[0]['nodes']} | "
                  f"{fmt([r['trace_s'] for r in ok], digits=2)} | "
                  f"{fmt([r['lint_s'] for r in ok], digits=3)} | "
                  f"{fmt([r['construct_s'] for r in ok], digits=2)} | "
                  f"{fmt([r['wall_s'] for r in ok], digits=2)} | "
                  f"{trace / gt_build:,.0f}× | {wall / gt_wall:,.0f}× |")


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--torch-worker":
        torch_worker(sys.argv[2], sys.argv[3], sys.argv[4])
    else:
        main()
