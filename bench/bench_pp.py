#!/usr/bin/env python3
"""bench_pp.py — pipeline schedules on CPU ranks: each schedule's measured step time next to its
simulated bubble (issue 39).

    python3 bench/bench_pp.py build/graphtrain [--ranks 2,4] [--flavor debugmodel] \
        [--micro 8] [--seq 32] [--steps 6] [--skip 2] [--mpiexec mpiexec] [--json out.json]

For each pipeline degree P in --ranks and each schedule, runs
`mpiexec -np P --oversubscribe graphtrain train` with a local batch of --micro sequences in
micro-batches of 1 (so --micro micro-batches a step), fp32, synthetic data, and reads the step
times of rank 0's metrics lines (the median of the steps after --skip) and the simulated bubble of
its "pipeline:" line (F = I = W = 1 time unit, B = 2, transfers free). The one-rank run of the same
micro-batches by gradient accumulation is the baseline: the pipeline's step is bitwise that run's
(tests/distributed/test_pp_launch.c), so the ratio is only speed.

No PyTorch peer: torch.distributed.pipelining on CPU ranks (gloo) is not set up here. CPU ranks
share the host's cores: with more ranks than cores the figures measure oversubscription as much as
the schedule; say so next to any table made from them. The pipeline runner is eager (a fresh
tensor per node, no memory plan), so the baseline it compares with is the one-rank eager executor
(`--compile.enable=false`); the compiled one-rank program is shown too.

On the GPU (`--device cuda [--gpus N]`) the ranks are started torchrun-style (RANK, WORLD_SIZE,
LOCAL_RANK = rank mod N, MASTER_ADDR, MASTER_PORT; the values cross over TCP through host memory),
each schedule with CUDA graphs on and off, next to one GPU accumulating the same micro-batches
(one program, one CUDA graph). With one GPU both ranks share it.
"""
import argparse
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile

SCHEDULES = ["GPipe", "1F1B", "Interleaved1F1B", "ZBVZeroBubble", "DualPipeV"]


def run(cmd, timeout):
    # oversubscribed ranks: waiting ranks yield the core instead of spinning on it
    env = dict(os.environ, OMPI_MCA_mpi_yield_when_idle="1")
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=timeout, env=env)
    return p.returncode, p.stdout


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_env_ranks(cmd, np_, gpus, timeout):
    """np_ processes of cmd, torchrun-style; rank 0's output (all of it on a failure)."""
    port = str(free_port())
    procs = []
    for r in range(np_):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(np_), LOCAL_RANK=str(r % gpus),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=port, NCCL_NVLS_ENABLE="0")
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True, env=env))
    outs = [p.communicate(timeout=timeout)[0] for p in procs]
    bad = [k for k, p in enumerate(procs) if p.returncode != 0]
    return (procs[bad[0]].returncode, outs[bad[0]]) if bad else (0, outs[0])


def measure(args, np_, schedule, dump, eager=False, cudagraphs=True):
    cmd = []
    cuda = args.device == "cuda"
    if np_ > 0 and not cuda:
        cmd = [args.mpiexec, "-np", str(np_), "--oversubscribe"]
        if os.geteuid() == 0:
            cmd.append("--allow-run-as-root")
    cmd += [args.binary, "train", f"--model.flavor={args.flavor}", "--training.dataset=synthetic",
            f"--training.seq_len={args.seq}", f"--training.steps={args.steps}",
            "--training.mixed_precision_param=float32", "--metrics.log_freq=1",
            "--job.print_config=false", f"--job.dump_folder={dump}", "--training.cpu_threads=1"]
    if cuda:
        cmd += ["--training.device=cuda", f"--compile.cudagraphs={str(cudagraphs).lower()}"]
    if np_ > 0:
        cmd += [f"--training.local_batch_size={args.micro}",
                f"--parallelism.pipeline_parallel_degree={np_}",
                f"--parallelism.pipeline_parallel_schedule={schedule}",
                "--parallelism.pipeline_parallel_microbatch_size=1"]
    else:
        cmd += ["--training.local_batch_size=1", f"--training.global_batch_size={args.micro}",
                f"--compile.enable={'false' if eager else 'true'}"]
    rc, out = (run_env_ranks(cmd, np_, args.gpus, args.timeout) if cuda and np_ > 0
               else run(cmd, args.timeout))
    if rc != 0:
        return {"error": out.strip().splitlines()[-1] if out.strip() else f"exit {rc}"}
    steps = [float(m.group(1)) for m in re.finditer(r"step\s+\d+\s+loss.*?step\s+([\d.]+) ms", out)]
    bubble = re.search(r"simulated bubble ([\d.]+)", out)
    hash_ = re.search(r"params xxh64 ([0-9a-f]+)", out)
    kept = steps[args.skip:] or steps
    return {"step_ms": statistics.median(kept) if kept else None, "steps_ms": steps,
            "bubble": float(bubble.group(1)) if bubble else 0.0,
            "hash": hash_.group(1) if hash_ else None,
            "load": os.getloadavg()[0]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("binary", nargs="?", default="./build/graphtrain")
    ap.add_argument("--ranks", default="2,4")
    ap.add_argument("--schedules", default=",".join(SCHEDULES))
    ap.add_argument("--flavor", default="debugmodel")
    ap.add_argument("--micro", type=int, default=8)
    ap.add_argument("--seq", type=int, default=32)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--skip", type=int, default=2)
    ap.add_argument("--mpiexec", default="mpiexec")
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--gpus", type=int, default=1, help="cuda: GPUs the ranks spread over")
    ap.add_argument("--json")
    args = ap.parse_args()
    rows = []
    if args.device == "cuda":
        return main_cuda(args)
    with tempfile.TemporaryDirectory() as tmp:
        compiled = measure(args, 0, None, os.path.join(tmp, "one"))
        rows.append({"ranks": 1, "schedule": "accumulation, compiled program", **compiled})
        base = measure(args, 0, None, os.path.join(tmp, "one_eager"), eager=True)
        rows.append({"ranks": 1, "schedule": "accumulation, eager (as the pipeline runs)", **base})
        for p in [int(x) for x in args.ranks.split(",")]:
            for s in args.schedules.split(","):
                r = measure(args, p, s, os.path.join(tmp, f"pp{p}_{s}"))
                rows.append({"ranks": p, "schedule": s, **r})
    print(f"{args.flavor}, seq {args.seq}, {args.micro} micro-batches of 1 sequence, fp32, "
          f"1 BLAS thread a rank, {os.cpu_count()} CPUs, median of steps {args.skip + 1}.."
          f"{args.steps}")
    return report(args, rows, base, "1 rank eager",
                  [("simulated bubble", lambda r: f"{r.get('bubble', 0.0):.3f}")])


def report(args, rows, base, vs, extra):
    """The table (ranks, schedule, the `extra` columns as (header, row -> text), step ms, the
    speed against `base`, the params hash against base's) and the --json file."""
    heads = ["ranks", "schedule"] + [h for h, _ in extra] + ["step ms", f"vs {vs}", "params hash"]
    print("| " + " | ".join(heads) + " |")
    print("|" + "---|" * len(heads))
    ref = base.get("step_ms")
    for r in rows:
        cells = [str(r["ranks"]), r["schedule"]] + [f(r) for _, f in extra]
        if "error" in r:
            cells += [f"failed: {r['error']}", "", ""]
        else:
            cells += [f"{r['step_ms']:.1f}",
                      f"{ref / r['step_ms']:.2f}×" if ref and r["step_ms"] else "",
                      "same" if r["hash"] == base.get("hash") else str(r["hash"])]
        print("| " + " | ".join(cells) + " |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "rows": rows}, f, indent=1)
    return 0


def main_cuda(args):
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        base = measure(args, 0, None, os.path.join(tmp, "one"))
        rows.append({"ranks": 1, "schedule": "accumulation", "graphs": "on", **base})
        for p in [int(x) for x in args.ranks.split(",")]:
            for s in args.schedules.split(","):
                for g in (True, False):
                    r = measure(args, p, s, os.path.join(tmp, f"pp{p}_{s}_{g}"), cudagraphs=g)
                    rows.append({"ranks": p, "schedule": s, "graphs": "on" if g else "off", **r})
    print(f"{args.flavor}, seq {args.seq}, {args.micro} micro-batches of 1 sequence, fp32, "
          f"{args.gpus} GPU(s), median of steps {args.skip + 1}..{args.steps}")
    return report(args, rows, base, "1 GPU", [("CUDA graphs", lambda r: r["graphs"])])


if __name__ == "__main__":
    sys.exit(main())
