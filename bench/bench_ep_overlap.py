"""bench_ep_overlap.py — exposed all-to-all time of a chunked expert-parallel step, with the EP
overlap schedule (compile.ep_overlap, src/passes/ep_overlap.c) on against off.

    python3 bench/bench_ep_overlap.py [build/graphtrain] [--flavor debugmodel] [--batch 4]
        [--seq 256] [--module layers.*.moe] [--chunk-dim batch] [--repeats 3] [--json out.json]

Each run is `mpiexec -np 2 graphtrain train` of DeepSeek-V3 on dp_shard 2 x ep 2 (CPU, MPI, fp32,
synthetic data) with the module chunked in two (strategy graph) and `--metrics.comm_report`,
which times every collective of step 2 on every rank: the time from posting its start to its
wait's return, and the part of it the rank spent blocked in the wait (exposed: not hidden behind
compute). "off" runs the same chunked step with `--compile.disable_passes ep_overlap`: the chunks
then run one after the other, each chunk's token all-to-all waited for before the other chunk's
compute. The two variants alternate, each in a fresh process, `--repeats` times; the script
reports the median and the range of

  - the token exchanges' exposed time (the report's "token exchanges" line: the sum over the step's
    expert-parallel all-to-alls, rank 0) and their start-to-completion time,
  - all collectives' exposed time and the step time of the timed step (rank 0),

prints rank 0's per-all-to-all lines of the last run of each variant (module, phase, chunk,
dispatch or combine, exposed ms), and checks that both variants end with the same params hash
(the schedule only reorders). Through MPI on the CPU a transfer progresses mostly inside MPI
calls, so most of it shows as exposed whatever the order; the GPU figures belong to the multi-GPU
issue. Timings only: nothing here is a test.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

TOKENS = re.compile(r"token exchanges \(expert parallelism's all-to-alls\): (\d+), ([\d.]+) ms, "
                    r"exposed ([\d.]+) ms")
COMM = re.compile(r"communication ([\d.]+) ms \(sum of start-to-completion times\), exposed "
                  r"([\d.]+) ms(?: = [\d.]+% of the ([\d.]+) ms step)?")
A2A_LINE = re.compile(r"^\s+\d+ all_to_all .*$", re.M)
HASH = re.compile(r"params xxh64 ([0-9a-f]{16})")


def command(args, overlap, dump):
    cmd = [args.mpiexec, "-np", "2", "--oversubscribe"]
    if os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    cmd += [args.binary, "train", "--model.name=deepseek_v3", f"--model.flavor={args.flavor}",
            "--training.dataset=synthetic", f"--training.local_batch_size={args.batch}",
            f"--training.seq_len={args.seq}", f"--training.steps={args.steps}",
            "--training.mixed_precision_param=float32",
            "--parallelism.data_parallel_shard_degree=2",
            "--parallelism.expert_parallel_degree=2", "--compile.ep_overlap.enabled=true",
            f"--compile.ep_overlap.module_fqn={args.module}",
            f"--compile.ep_overlap.chunk_dim={args.chunk_dim}",
            "--compile.ep_overlap.disable_early_grad_accumulation=true",
            "--metrics.comm_report=true", "--checkpoint.enable=false",
            "--job.print_config=false", f"--job.dump_folder={dump}"]
    if not overlap:
        cmd.append("--compile.disable_passes=ep_overlap")
    return cmd


def run_once(args, overlap):
    with tempfile.TemporaryDirectory(prefix="bench_ep_overlap_") as dump:
        t0 = time.time()
        p = subprocess.run(command(args, overlap, dump), capture_output=True, text=True)
        wall = time.time() - t0
    out = p.stdout + p.stderr
    if p.returncode != 0:
        sys.exit(f"bench_ep_overlap: run failed (exit {p.returncode}):\n{out[-3000:]}")
    tok, comm, h = TOKENS.search(out), COMM.search(out), HASH.search(out)
    if not tok or not comm:
        sys.exit("bench_ep_overlap: no comm report with token exchanges in the output:\n"
                 + out[-3000:])
    return dict(overlap=overlap, wall_s=wall, token_exchanges=int(tok.group(1)),
                token_ms=float(tok.group(2)), token_exposed_ms=float(tok.group(3)),
                comm_ms=float(comm.group(1)), comm_exposed_ms=float(comm.group(2)),
                step_ms=float(comm.group(3)) if comm.group(3) else None,
                params_hash=h.group(1) if h else None, a2a_lines=A2A_LINE.findall(out),
                load1=os.getloadavg()[0])


def summary(values):
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    return f"{statistics.median(values):.3f} ({min(values):.3f}-{max(values):.3f})"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("binary", nargs="?", default="./build/graphtrain")
    ap.add_argument("--flavor", default="debugmodel")
    ap.add_argument("--batch", type=int, default=4, help="per-rank batch (local_batch_size)")
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--steps", type=int, default=3, help="the report times step 2")
    ap.add_argument("--module", default="layers.*.moe", choices=["layers.*", "layers.*.moe"])
    ap.add_argument("--chunk-dim", default="batch", choices=["batch", "seq"])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--mpiexec", default=os.environ.get("GT_MPIEXEC") or "mpiexec")
    ap.add_argument("--json", help="write every raw measurement here")
    args = ap.parse_args()
    if args.steps < 2 or args.repeats < 1:
        sys.exit("bench_ep_overlap: --steps must be >= 2 (the report times step 2), --repeats >= 1")

    runs = []
    for r in range(args.repeats):
        for overlap in (True, False):
            res = run_once(args, overlap)
            runs.append(res)
            print(f"repeat {r + 1} overlap {'on ' if overlap else 'off'}: token exchanges "
                  f"{res['token_exchanges']}, exposed {res['token_exposed_ms']:.3f} of "
                  f"{res['token_ms']:.3f} ms; all collectives exposed {res['comm_exposed_ms']:.3f}"
                  f" ms; step {res['step_ms']} ms; load {res['load1']:.1f}", flush=True)

    print(f"\nDeepSeek-V3 {args.flavor}, dp_shard 2 x ep 2 (2 MPI ranks, CPU, fp32), local batch "
          f"{args.batch} x seq {args.seq}, {args.module} x {args.chunk_dim}, step 2 of each run, "
          f"rank 0, median (min-max) over {args.repeats} run(s), ms:")
    print(f"  {'overlap':8} {'a2a exposed':>24} {'a2a start-to-completion':>24} "
          f"{'all comm exposed':>24} {'step':>24}")
    for overlap in (True, False):
        rs = [x for x in runs if x["overlap"] == overlap]
        print(f"  {'on' if overlap else 'off':8} {summary([x['token_exposed_ms'] for x in rs]):>24} "
              f"{summary([x['token_ms'] for x in rs]):>24} "
              f"{summary([x['comm_exposed_ms'] for x in rs]):>24} "
              f"{summary([x['step_ms'] for x in rs]):>24}")
    for overlap in (True, False):
        last = [x for x in runs if x["overlap"] == overlap][-1]
        print(f"\nrank 0's all-to-alls, overlap {'on' if overlap else 'off'} (last run): "
              "# kind mesh-dim bytes total-ms exposed-ms exposed% ranks' least-most, node")
        for line in last["a2a_lines"]:
            print(line)
    hashes = {x["params_hash"] for x in runs}
    print(f"\nparams hashes: {sorted(h for h in hashes if h)} "
          f"({'the same: the schedule only reorders' if len(hashes) == 1 else 'DIFFER'})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(args=vars(args), runs=runs), f, indent=1)
    return 0 if len(hashes) == 1 else 1


if __name__ == "__main__":
    sys.exit(main())
