#!/usr/bin/env python3
"""CPU training throughput: graphtrain `train` vs PyTorch eager and torch.compile, same model shape.

graphtrain — one process per run:

    graphtrain train --model.flavor F --training.local_batch_size B --training.seq_len S
        --training.steps N --training.mixed_precision_param float32 --metrics.log_freq 1
        --job.print_config false --job.dump_folder TMP [MODE FLAGS]

"graphtrain" runs the default: the pass pipeline (memory policy "default": activation
recomputation chosen by a min-cut) and the planned program; "graphtrain no-remat" adds
--compile.memory_policy none (passes and planned program, nothing recomputed); "graphtrain eager"
adds --compile.enable false (the unoptimised graph on the eager executor, a fresh buffer per
value). All three give bitwise identical parameters (the script prints their hashes).

Synthetic data, fp32, AdamW (lr 8e-4, betas 0.9/0.95, eps 1e-8, weight decay 0.1 on matrices),
global-norm clipping at 1.0, warmup 2 steps then linear decay. Per-step seconds come from the run's
metrics.jsonl (the trainer times data + forward + backward + clip + AdamW); peak RSS is the
process's getrusage maxrss (os.wait4). graphtrain's kernels run on --graphtrain-threads threads
(--training.cpu_threads; default 1, the fair single-thread comparison), the same bits on any
count: the matmuls, attention, the element programs, norms, rope, the loss and AdamW are cut into
blocks fixed by their shapes; the gradient norm's ordered sums stay on one thread, and
OPENBLAS_NUM_THREADS has no effect on it.

PyTorch — one fresh Python process per run: transformers LlamaForCausalLM from a LlamaConfig of
the same shape (untied output, llama3 RoPE scaling, attn_implementation "sdpa" = transformers'
default), fp32, torch.optim.AdamW with its default implementation choice (on CPU tensors that is
the single-tensor for-loop: foreach and fused stay off), the same hyperparameters, parameter groups
and schedule, torch.nn.utils.clip_grad_norm_(1.0). One step = random tokens, forward,
cross-entropy, zero_grad, backward, clip, optimizer step, loss.item(). torch.set_num_threads(T)
for T in --threads (1 = the fair single-thread comparison). Mode "compile" wraps the model in
torch.compile (inductor, defaults): forward and backward are compiled, clip and AdamW stay eager;
inductor's caches are disabled (TORCHINDUCTOR_FORCE_DISABLE_CACHES=1) so step 1 shows a cold
compile. Peak RSS: getrusage maxrss of that process (it includes the ~0.5 GB that importing torch
and transformers costs; "RSS after import" is reported too).

--accum N (gradient accumulation): each step is N micro-batches of the model's batch.
graphtrain gets --training.global_batch_size N x batch; torch zeroes the gradients, runs forward
and backward on each micro-batch with its loss divided by N (the gradients add up in .grad),
then clips and steps once. Tokens per step are N x batch x seq on both sides.

For every run the first --skip steps are dropped and the median step time of the rest is taken;
the tables give the median over --repeats runs and the range (min–max) of those run medians. Runs
are interleaved (repeat 1 of every configuration, then repeat 2, ...) so that load from other
users of a shared machine spreads over all of them.

--profile: instead of the tables, one profiled run per model and thread count of --threads:
graphtrain (the compiled default, --training.cpu_threads T) with GT_CPU_PROFILE (=cpu, the
thread's CPU clock, at one thread; =1, the wall clock, at more), whose kernel
time per op kind and sgemm time per shape are printed divided by the steps after --skip
(graphtrain's profile covers the whole process, so its first steps are in the sums: the step
count and the run's median step are printed beside them), and torch eager at T threads under
torch.profiler over the steps after --skip (self CPU time per aten op, per step).

usage: bench/bench_cpu_train.py [GRAPHTRAIN] [--models test_tiny,debugmodel] [--steps 25]
        [--skip 5] [--repeats 3] [--threads 1,2] [--graphtrain-threads 1]
        [--modes eager,compile] [--accum N] [--profile]
        [--json out.json]
"""
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time

import bench_common as bc  # shapes, hyper-parameters, schedule, HF config: bench/bench_common.py

# The shapes of bench_common.SHAPES with the benchmark's batch shape.
MODELS = {
    "test_tiny": dict(bc.SHAPES["test_tiny"], batch=8, seq=128),
    "debugmodel": dict(bc.SHAPES["debugmodel"], batch=2, seq=256),
}
WORKER_TIMEOUT_S = 900


# ---------------------------------------------------------------------------------------------
# PyTorch worker (own process; prints one JSON line)


def current_rss_bytes():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return -1


def torch_worker(spec):
    import torch
    import torch.nn.functional as F
    import transformers
    from transformers import LlamaForCausalLM

    rss_import = current_rss_bytes()
    m = MODELS[spec["model"]]
    torch.set_num_threads(spec["threads"])
    torch.manual_seed(0)
    model = LlamaForCausalLM(bc.llama_config(m)).float().train()
    n_params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(bc.adamw_groups(model), lr=bc.LR, betas=bc.BETAS, eps=bc.EPS)
    fwd = torch.compile(model) if spec["mode"] == "compile" else model

    B, S, V, steps = m["batch"], m["seq"], m["vocab"], spec["steps"]
    accum = spec.get("accum", 1)
    gen = torch.Generator().manual_seed(spec["seed"])
    times, losses = [], []
    prof = None
    for step in range(1, steps + 1):
        if spec.get("profile_from") == step:
            prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
            prof.__enter__()
        t0 = time.perf_counter()
        bc.set_lr(opt, step, steps)
        opt.zero_grad(set_to_none=True)
        step_loss = 0.0
        for _ in range(accum):  # micro-batches: their gradients add up in .grad
            ids = torch.randint(0, V, (B, S), generator=gen)
            labels = torch.randint(0, V, (B, S), generator=gen)
            logits = fwd(input_ids=ids, use_cache=False).logits
            loss = F.cross_entropy(logits.reshape(-1, V), labels.reshape(-1)) / accum
            loss.backward()
            step_loss += loss.item()
        torch.nn.utils.clip_grad_norm_(model.parameters(), bc.MAX_NORM)
        opt.step()
        losses.append(step_loss)
        times.append(time.perf_counter() - t0)
    profile = None
    if prof is not None:
        prof.__exit__(None, None, None)
        n = steps - spec["profile_from"] + 1
        profile = [dict(op=e.key, calls=e.count / n, self_ms=e.self_cpu_time_total / 1e3 / n)
                   for e in prof.key_averages() if e.self_cpu_time_total > 0]
        profile.sort(key=lambda r: -r["self_ms"])
    print(json.dumps(dict(
        profile=profile, step_seconds=times, losses=losses, params=n_params,
        threads=torch.get_num_threads(),
        peak_rss_bytes=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        rss_after_import_bytes=rss_import, torch=torch.__version__,
        transformers=transformers.__version__,
        adamw_foreach=opt.defaults.get("foreach"), adamw_fused=opt.defaults.get("fused"))))


# ---------------------------------------------------------------------------------------------
# runs


GRAPHTRAIN_MODES = {  # row name -> flags
    "graphtrain": ["--compile.enable", "true"],
    "graphtrain no-remat": ["--compile.enable", "true", "--compile.memory_policy", "none"],
    "graphtrain eager": ["--compile.enable", "false"],
}
GRAPHTRAIN_MODE_NAMES = {"compiled": "graphtrain", "no-remat": "graphtrain no-remat",
                         "eager": "graphtrain eager"}


def run_graphtrain(binary, model, steps, name, accum=1, threads=1, env=None):
    m = MODELS[model]
    with tempfile.TemporaryDirectory(prefix="bench_cpu_train_") as dump:
        cmd = [binary, "train", "--model.flavor", model,
               "--training.local_batch_size", str(m["batch"]), "--training.seq_len", str(m["seq"]),
               "--training.global_batch_size", str(m["batch"] * accum),
               "--training.steps", str(steps), "--training.mixed_precision_param", "float32",
               "--metrics.log_freq", "1", "--job.print_config", "false",
               "--job.dump_folder", dump, "--training.cpu_threads", str(threads)]
        cmd += GRAPHTRAIN_MODES[name]
        with tempfile.TemporaryFile(mode="w+") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, text=True,
                                    env=env)
            _, status, usage = os.wait4(proc.pid, 0)
            proc.returncode = os.waitstatus_to_exitcode(status)
            log.seek(0)
            out = log.read()
        if proc.returncode != 0:
            sys.exit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{out[-3000:]}")
        records = bc.read_metrics(os.path.join(dump, "metrics.jsonl"))
    if [r["step"] for r in records] != list(range(1, steps + 1)):
        sys.exit(f"graphtrain {model}: metrics.jsonl lacks some of steps 1..{steps}")
    p = re.search(r"(\d+) parameters", out)
    h = re.search(r"params xxh64 ([0-9a-f]+)", out)
    # the memory plan, printed before step 1 when the program is compiled
    arenas = [int(a) for a in re.findall(r"(?:persistent|step)\s+arena\s+(\d+) bytes", out)]
    return dict(log=out, step_seconds=[r["step_seconds"] for r in records],
                losses=[r["loss"] for r in records], params=int(p.group(1)) if p else -1,
                params_hash=h.group(1) if h else "", threads=threads,
                peak_rss_bytes=usage.ru_maxrss * 1024,
                peak_rss_metrics_bytes=records[-1]["peak_memory_bytes"],
                planned_arena_bytes=sum(arenas) if arenas else None)


def run_torch(model, mode, threads, steps, seed, accum=1, profile_from=None):
    spec = dict(model=model, mode=mode, threads=threads, steps=steps, seed=seed, accum=accum,
                profile_from=profile_from)
    env = dict(os.environ, TORCHINDUCTOR_FORCE_DISABLE_CACHES="1")
    cmd = [sys.executable, os.path.abspath(__file__), "--torch-worker", json.dumps(spec)]
    return bc.run_json_worker(cmd, WORKER_TIMEOUT_S, env)[0]


# ---------------------------------------------------------------------------------------------
# report


def run_median_ms(run, skip):
    return statistics.median(run["step_seconds"][skip:]) * 1e3


def print_tables(results, models, configs, skip):
    for model in models:
        m = MODELS[model]
        accum = results.get("accum", 1)
        tokens = m["batch"] * m["seq"] * accum
        micro = f"{accum} micro-batches of " if accum > 1 else ""
        print(f"\n{model}: {micro}batch {m['batch']} x seq {m['seq']} = {tokens} tokens/step, "
              f"median of steps {skip + 1}..{results['steps']} per run, "
              f"median (min–max) over runs")
        print("| system | threads | step ms | tokens/s | peak RSS MiB |"
              " graphtrain speed ÷ this | first step ms |")
        print("|---|---|---|---|---|---|---|")
        gt_ms = None
        for name in configs:
            runs = [r for r in results["runs"].get(f"{model}/{name}", []) if "error" not in r]
            errors = [r["error"] for r in results["runs"].get(f"{model}/{name}", [])
                      if "error" in r]
            if not runs:
                print(f"| {name} | | {errors[0] if errors else 'not run'} | | | | |")
                continue
            med = [run_median_ms(r, skip) for r in runs]
            ms = statistics.median(med)
            if name == "graphtrain":
                gt_ms = ms
            planned = [r["planned_arena_bytes"] / 2**20 for r in runs
                       if r.get("planned_arena_bytes")]
            rss = [r["peak_rss_bytes"] / 2**20 for r in runs]
            base = [r["rss_after_import_bytes"] / 2**20 for r in runs
                    if "rss_after_import_bytes" in r]
            rss_text = f"{statistics.median(rss):,.0f}"
            if base:
                rss_text += f" ({statistics.median(base):,.0f} after imports)"
            if planned:
                rss_text += f" ({statistics.median(planned):,.0f} planned arenas)"
            tok = [tokens / (x / 1e3) for x in med]
            first = [r["step_seconds"][0] * 1e3 for r in runs]
            ratio = f"{ms / gt_ms:.2f}" if gt_ms else "–"
            print(f"| {name} | {runs[0]['threads']} | {ms:.1f} ({min(med):.1f}–{max(med):.1f}) | "
                  f"{statistics.median(tok):,.0f} | {rss_text} | {ratio} | "
                  f"{statistics.median(first):,.0f} |")
            if errors:
                print(f"|  (failed runs: {'; '.join(errors)}) | | | | | | |")
        hashes = {r.get("params_hash") for name in configs if name.startswith("graphtrain")
                  for r in results["runs"].get(f"{model}/{name}", []) if "error" not in r}
        if hashes:
            print(f"graphtrain final parameters (xxh64) over all its runs: "
                  f"{', '.join(sorted(h or '?' for h in hashes))}"
                  f"{' (bitwise identical)' if len(hashes) == 1 else ''}")


def profile_graphtrain_lines(log, steps):
    """GT_CPU_PROFILE's tables from a graphtrain log, times (ms) and calls divided by steps."""
    lines, on = [], False
    for line in log.splitlines():
        if line.startswith("cpu profile:"):
            on = True
            total = re.search(r"([0-9.]+) ms in all", line)
            if total:
                line = line.replace(total.group(0), f"{float(total.group(1)) / steps:.1f} ms in all")
            lines.append(line + f"  [per step: divided by {steps} steps]")
            continue
        if not on or not line.startswith("  "):
            continue
        f = line.split()
        if f[0] == "op":  # the header: per call figures are left out
            lines.append(f"  {'op':<28} {'calls':>9} {'ms':>9} {'%':>7}")
        elif f[0] == "all":  # all kernels MS
            lines.append(f"  {'all kernels':<28} {'':9} {float(f[2]) / steps:9.2f}")
        elif f[0] == "other":  # other shapes CALLS MS %
            lines.append(f"  {'other shapes':<32} {int(f[2]) / steps:9.1f} "
                         f"{float(f[3]) / steps:9.2f} {f[4]:>7}")
        elif len(f) == 5 and f[1].isdigit():  # op calls ms % us/call
            lines.append(f"  {f[0]:<28} {int(f[1]) / steps:9.1f} {float(f[2]) / steps:9.2f} {f[3]:>7}")
        elif len(f) == 8 and f[1].isdigit():  # trans m n k calls ms % GFLOP/s
            lines.append(f"  {f[0]:<5} {f[1]:>8} {f[2]:>8} {f[3]:>8} {int(f[4]) / steps:9.1f} "
                         f"{float(f[5]) / steps:9.2f} {f[6]:>7} {f[7]:>9}")
        else:
            lines.append(line)
    return lines


def profile(args, models, threads):
    """One profiled run of graphtrain and of torch eager per model and thread count."""
    for model in models:
        for t in threads:
            # one thread: its CPU clock, which leaves out the waits of a shared machine
            env = dict(os.environ, GT_CPU_PROFILE="cpu" if t == 1 else "1")
            r = run_graphtrain(args.graphtrain, model, args.steps, "graphtrain", args.accum, t,
                               env=env)
            ms = run_median_ms(r, args.skip)
            print(f"\n## {model}, graphtrain, {t} thread(s): median step {ms:.1f} ms "
                  f"(steps {args.skip + 1}..{args.steps}); whole-run sums / {args.steps} steps")
            print("\n".join(profile_graphtrain_lines(r["log"], args.steps)))
            tr = run_torch(model, "eager", t, args.steps, seed=0, accum=args.accum,
                           profile_from=args.skip + 1)
            if "error" in tr:
                print(f"\n## {model}, torch eager, {t} thread(s): {tr['error']}")
                continue
            tms = run_median_ms(tr, args.skip)
            total = sum(p["self_ms"] for p in tr["profile"])
            print(f"\n## {model}, torch eager, {t} thread(s): median step {tms:.1f} ms (under "
                  f"the profiler); self CPU ms per step by aten op, {total:.1f} ms in all")
            print(f"  {'op':<44} {'calls':>7} {'ms':>9} {'%':>7}")
            for p in tr["profile"][:30]:
                print(f"  {p['op'][:44]:<44} {p['calls']:7.1f} {p['self_ms']:9.2f} "
                      f"{100 * p['self_ms'] / total:6.1f}%")
        sys.stdout.flush()


def report(paths):
    """Pools the runs of several --json files (same --steps and --skip) into one set of tables."""
    pooled = None
    for path in paths:
        with open(path) as f:
            res = json.load(f)
        if pooled is None:
            pooled = dict(res, runs={})
        if (res["steps"], res["skip"], res.get("accum", 1)) != (
                pooled["steps"], pooled["skip"], pooled.get("accum", 1)):
            sys.exit(f"{path}: steps/skip {res['steps']}/{res['skip']} differ from "
                     f"{pooled['steps']}/{pooled['skip']}")
        for key, runs in res["runs"].items():
            pooled["runs"].setdefault(key, []).extend(runs)
    models = [m for m in MODELS if any(k.startswith(m + "/") for k in pooled["runs"])]
    configs = []
    for key in pooled["runs"]:
        name = key.split("/", 1)[1]
        if name not in configs:
            configs.append(name)
    # graphtrain rows first, in GRAPHTRAIN_MODES order; the ratios refer to the first
    order = list(GRAPHTRAIN_MODES)
    configs.sort(key=lambda n: order.index(n) if n in order else len(order))
    print(f"{len(paths)} file(s) pooled")
    print_tables(pooled, models, configs, pooled["skip"])


def main():
    ap = bc.arg_parser(__doc__)
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--steps", type=int, default=25)
    ap.add_argument("--skip", type=int, default=5, help="first steps left out of the medians")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", default="1,2", help="torch thread counts")
    ap.add_argument("--graphtrain-threads", type=int, default=1,
                    help="graphtrain's kernel threads (--training.cpu_threads)")
    ap.add_argument("--modes", default="eager,compile", help="torch modes: eager, compile")
    ap.add_argument("--graphtrain-modes", default="compiled,no-remat,eager",
                    help="graphtrain modes: compiled (the default config), no-remat "
                         "(compile.memory_policy none), eager (compile.enable false)")
    ap.add_argument("--accum", type=int, default=1,
                    help="micro-batches per step (gradient accumulation), both systems")
    ap.add_argument("--profile", action="store_true",
                    help="print graphtrain's GT_CPU_PROFILE and torch eager's torch.profiler "
                         "tables instead (one run per model and --threads count)")
    ap.add_argument("--json", help="write every run here")
    ap.add_argument("--report", nargs="+", metavar="JSON",
                    help="run nothing: pool the runs of these --json files and print the tables")
    args = ap.parse_args()
    if args.report:
        report(args.report)
        return

    models = args.models.split(",")
    bc.require_known("model", models, MODELS)
    modes = [m for m in args.modes.split(",") if m]
    bc.require_known("mode", modes, ("eager", "compile"))
    threads = [int(t) for t in args.threads.split(",")]
    bc.require_steps(args.steps, args.skip)
    bc.require_executable(args.graphtrain)
    if args.profile:
        profile(args, models, threads)
        return

    gt_modes = args.graphtrain_modes.split(",")
    bc.require_known("graphtrain mode", gt_modes, GRAPHTRAIN_MODE_NAMES)
    if "compiled" not in gt_modes:
        sys.exit("--graphtrain-modes must include compiled (the ratios refer to it)")
    configs = [GRAPHTRAIN_MODE_NAMES[m] for m in GRAPHTRAIN_MODE_NAMES if m in gt_modes]
    configs += [f"torch {mode} {t}t" for mode in modes for t in threads]
    if args.accum < 1:
        sys.exit("--accum must be at least 1")
    results = dict(steps=args.steps, skip=args.skip, repeats=args.repeats, accum=args.accum,
                   runs={},
                   nproc=os.cpu_count(), loadavg_1min_before=os.getloadavg()[0])
    for rep in range(args.repeats):
        for model in models:
            for name in configs:
                key = f"{model}/{name}"
                t0 = time.perf_counter()
                if name.startswith("graphtrain"):
                    r = run_graphtrain(args.graphtrain, model, args.steps, name, args.accum,
                                       args.graphtrain_threads)
                    r.pop("log")  # the JSON keeps figures only
                else:
                    _, mode, t = name.split()
                    r = run_torch(model, mode, int(t[:-1]), args.steps, seed=rep,
                                  accum=args.accum)
                    gt = results["runs"].get(f"{model}/graphtrain", [{}])[0]
                    if "error" not in r and gt and r["params"] != gt["params"]:
                        sys.exit(f"{model}: torch model has {r['params']} parameters, "
                                 f"graphtrain {gt['params']}: the shapes differ")
                r["loadavg_1min_after"] = os.getloadavg()[0]  # the machine is shared
                results["runs"].setdefault(key, []).append(r)
                msg = r["error"] if "error" in r else f"{run_median_ms(r, args.skip):.1f} ms/step"
                print(f"[{rep + 1}/{args.repeats}] {key}: {msg} "
                      f"({time.perf_counter() - t0:.0f} s)", flush=True)
    bc.write_json(args.json, results)
    print_tables(results, models, configs, args.skip)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--torch-worker":
        torch_worker(json.loads(sys.argv[2]))
    else:
        main()
