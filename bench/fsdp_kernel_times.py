#!/usr/bin/env python3
"""Where FSDP's step time goes: GPU time per kernel of graphtrain on 1 GPU against N GPUs.

    python3 bench/fsdp_kernel_times.py build-gpu/graphtrain --model 1B --gpus 4 \
        [--steps 6 --last 3] [--json out.json] [--markdown out.md] [--keep DIR] \
        [-- extra graphtrain flags]
    python3 bench/fsdp_kernel_times.py --from DIR --gpus 4 [--steps 6 --last 3] ...

Runs graphtrain train twice under bench_gpu.py's CUPTI activity library (CUDA_INJECTION64_PATH):
once on one GPU, once as `mpirun -np N` with --parallelism.data_parallel_shard_degree N (FSDP;
with --tp T: N/T, and --parallelism.tensor_parallel_degree T),
both with the same local batch and sequence, bf16, CUDA graphs on (graphtrain's defaults). Every
kernel's start and end on the GPU is recorded; of the last --last steps (a step ends with its
multi-tensor AdamW launch; host transfers between steps are left out) it reports, per kernel name,
GPU ms per step on 1 GPU and on rank 0 of N (device copies too, as "[memcpy KIND]": the
library records them when GT_BENCH_COPY_SPANS=1, as here; FSDP's concats and slices are 2D
copies), and totals split into communication (NCCL kernels and the rank-order sum of the
reduce-scatter, and the device-to-device and peer memcpys, which in a step are NCCL's copy-engine
collectives) and compute (everything else, graphtrain's SM copy kernels included): how much slower the
same compute kernels run while collectives run beside them, how much time the compute kernels
of FSDP itself add (casts, concatenations, splits), and the step's GPU time. Then the gaps in
which no compute kernel runs (over 2 us), by the pair of kernels around them and whether a
communication kernel ran meanwhile: where the step waits for a collective (or for the host).
And every communication kernel of the N-GPU step by its index in the step (start order, the
same in every captured step), with the part of it during which no compute kernel ran: the
exposed time of each collective in the captured steps themselves (the trainer's comm report
times one uncaptured step). Last, every rank's GPU time per step, split into the time it ran a
compute kernel and the time it ran none: the rank that waits least sets the pace.
--keep DIR keeps the span files (k1.tsv, kN.tsv.rankR) and logs; --from DIR reports on kept ones
without running anything (--gpus, --steps and --last as when they were recorded).
"""
import argparse
import bisect
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_gpu  # noqa: E402  (CUPTI library, demangling)


def is_comm(name):
    """NCCL's kernels, the rank-order sum, and device copies made with cudaMemcpy: graphtrain's own
    device copies are SM kernels (gt_k_copy_*), so a memcpy between device buffers in the step is
    NCCL's (the copy-engine collectives of --comm.nccl_buffers symmetric, an all_to_all's own
    block)."""
    if name in ("[memcpy DtoD]", "[memcpy PtoP]", "[memcpy]"):
        return True
    return "nccl" in name.lower() or "comm_sum" in name


def exposed_by_collective(tail, names, ends, steps, last):
    """The communication kernels of each of the last `last` steps in start order, averaged by
    their index in the step (a captured step runs the same ones every time): [(name, ns,
    exposed ns)], exposed being the part of the kernel's span in which no compute kernel runs.
    None when the steps differ in their count."""
    merged = []  # the compute kernels' union, as sorted disjoint intervals
    for s, e, i, _ in sorted(x for x in tail if not is_comm(names[x[2]])):
        if merged and s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    starts = [a for a, _ in merged]

    def covered(s, e):  # ns of [s, e) inside the union
        k, ns = max(bisect.bisect_right(starts, s) - 1, 0), 0
        while k < len(merged) and merged[k][0] < e:
            ns += max(0, min(e, merged[k][1]) - max(s, merged[k][0]))
            k += 1
        return ns

    per_step = []
    for k in range(steps - last, steps):
        lo, hi = ends[k - 1], ends[k]
        per_step.append([(names[i], e - s, e - s - covered(s, e)) for s, e, i, _ in tail
                         if lo < s <= hi and is_comm(names[i])])
    if any(len(x) != len(per_step[0]) for x in per_step):
        return None
    return [(c[0][0], sum(x[1] for x in c) / last, sum(x[2] for x in c) / last)
            for c in zip(*per_step)]


def read_times(path, steps, last):
    """{name: ns per step over the last `last` steps}, step GPU ms of those steps, ns per step the
    GPU ran a compute kernel, the gaps with no compute kernel running: {(kernel before, kernel
    after, a communication kernel ran during it): [count, ns]} per step, and the communication
    kernels by their index in the step (exposed_by_collective). Host transfers (the step's inputs
    in, the loss out, between steps) are left out."""
    names, _, spans, _ = bench_gpu.read_span_file(path)
    try:
        ends = bench_gpu.step_ends(spans, names, steps)
    except RuntimeError as e:
        raise RuntimeError(f"{path}: {e}") from None
    lo, hi = ends[steps - last - 1], ends[-1]  # the caller checked steps > last
    tail = [x for x in spans if lo < x[0] and x[1] <= hi]
    per = {}
    for s, e, i, _ in tail:
        per[names[i]] = per.get(names[i], 0) + (e - s) / last
    step_ms = [(b - a) / 1e6 for a, b in zip(ends[steps - last - 1:], ends[steps - last:])]
    busy = 0  # compute kernels' union: time the GPU ran at least one compute kernel
    # gaps: no compute kernel running for over 2 us (any stream: a captured graph's kernels all
    # report the stream it was launched on), by the kernels that end before and start after it,
    # and whether a communication kernel ran during it
    comm = sorted((s, e) for s, e, i, _ in tail if is_comm(names[i]))
    gaps, last_end, last_name = {}, None, None
    for s, e, i, _ in tail:
        if is_comm(names[i]):
            continue
        if last_end is not None and s - last_end > 2000:
            during = any(cs < s and ce > last_end for cs, ce in comm)
            key = (names[last_name], names[i], during)
            g = gaps.setdefault(key, [0, 0])
            g[0] += 1 / last
            g[1] += (s - last_end) / last
        if last_end is None or e > last_end:
            busy += e - max(s, last_end or s)
            last_end, last_name = e, i
    return per, step_ms, busy / last, gaps, exposed_by_collective(tail, names, ends, steps, last)


def read_ranks(tsv, args, rank0):
    """read_times of every rank of the N-GPU run (tsv.rankR; rank 0's already read: rank0), or
    None when a rank's file is missing."""
    paths = [f"{tsv}.rank{r}" for r in range(1, args.gpus)]
    if args.gpus < 2 or not all(os.path.exists(p) for p in paths):
        return None
    return [rank0] + [read_times(p, args.steps, args.last) for p in paths]


def rank_lines(ranks):
    """Every rank's step: GPU time, the time it ran a compute kernel, and the time it ran none
    (waiting for a collective, mostly for the data of a slower rank), with its largest gap. A
    rank that waits least is the one the others wait for: its GPU sets the step's pace."""
    lines = ["", "Every rank of the run, ms per step (means): the one that waits least sets the "
             "pace (the others wait for its data at the collectives)", "",
             "| rank | step GPU time | compute kernels (union) | no compute kernel | largest gap, "
             "kernels around it |", "|---|---|---|---|---|"]
    for r, (_, steps, busy, gaps, _) in enumerate(ranks):
        idle = sum(v[1] for v in gaps.values()) / 1e6
        big = max(gaps.items(), key=lambda x: x[1][1] / max(x[1][0], 1e-9), default=None)
        where = "–"
        if big:
            (a, b, _), (cnt, ns) = big
            where = f"{ns / cnt / 1e6:.2f} (`{a[:30]}` → `{b[:30]}`)".replace("|", "/")
        lines.append(f"| {r} | {sum(steps) / len(steps):.1f} | {busy / 1e6:.1f} | "
                     f"{idle:.2f} | {where} |")
    return lines


def run(cmd, env, log):
    with open(log, "w") as f:
        p = subprocess.run(cmd, env=env, stdout=f, stderr=subprocess.STDOUT)
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({p.returncode}); log {log}:\n"
                 + open(log).read()[-3000:])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("graphtrain", nargs="?")
    ap.add_argument("--model", default="1B")
    ap.add_argument("--gpus", type=int, default=2)
    ap.add_argument("--tp", type=int, default=1,
                    help="tensor-parallel degree of the N-GPU run (FSDP N/tp x TP tp)")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--last", type=int, default=3)
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("--json")
    ap.add_argument("--markdown")
    ap.add_argument("--keep", help="copy the raw per-rank span files (TSV) into this folder")
    ap.add_argument("--from", dest="source", help="report on span files kept by --keep instead")
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)
    args = ap.parse_args(argv[:cut])
    args.extra = argv[cut + 1:]  # more graphtrain flags, after --
    if args.tp < 1 or args.gpus % args.tp:
        sys.exit(f"--tp ({args.tp}) must divide --gpus ({args.gpus})")
    if not args.steps > args.last > 0:
        sys.exit(f"--steps ({args.steps}) must exceed --last ({args.last}) > 0")
    if args.source:
        res = {n: read_times(os.path.join(args.source, f"k{n}.tsv" + (".rank0" if n > 1 else "")),
                             args.steps, args.last) for n in (1, args.gpus)}
        report(args, res, read_ranks(os.path.join(args.source, f"k{args.gpus}.tsv"), args,
                                     res[args.gpus]))
        return
    if not args.graphtrain:
        sys.exit("the graphtrain binary (or --from DIR) is required")
    work = tempfile.mkdtemp(prefix="fsdp_kt_")
    lib = bench_gpu.build_kernel_times_lib(work)
    base = [os.path.abspath(args.graphtrain), "train", "--model.flavor", args.model,
            "--training.device", "cuda", "--training.local_batch_size", str(args.batch),
            "--training.seq_len", str(args.seq), "--training.steps", str(args.steps),
            "--metrics.log_freq", "1", "--job.print_config", "false"] + args.extra
    res = {}
    for n in (1, args.gpus):
        tsv = os.path.join(work, f"k{n}.tsv")
        env = dict(os.environ, CUDA_INJECTION64_PATH=lib, GT_BENCH_KERNEL_TIMES=tsv,
                   GT_BENCH_COPY_SPANS="1", NCCL_NVLS_ENABLE="0")
        cmd = base + ["--job.dump_folder", os.path.join(work, f"d{n}")]
        if n > 1:
            cmd = ["mpirun", "-np", str(n), "--allow-run-as-root", "--oversubscribe",
                   "-x", "NCCL_NVLS_ENABLE=0", "-x", "CUDA_INJECTION64_PATH",
                   "-x", "GT_BENCH_KERNEL_TIMES", "-x", "GT_BENCH_COPY_SPANS"] + cmd + [
                       "--parallelism.data_parallel_shard_degree", str(n // args.tp),
                       "--parallelism.tensor_parallel_degree", str(args.tp)]
        run(cmd, env, os.path.join(work, f"log{n}.txt"))
        res[n] = read_times(tsv + (".rank0" if n > 1 else ""), args.steps, args.last)
    report(args, res, read_ranks(os.path.join(work, f"k{args.gpus}.tsv"), args, res[args.gpus]))
    if args.keep:
        os.makedirs(args.keep, exist_ok=True)
        for f in os.listdir(work):
            if f.startswith("k") or f.startswith("log"):
                shutil.copy(os.path.join(work, f), args.keep)
    shutil.rmtree(work, ignore_errors=True)


def report(args, res, ranks=None):
    """Prints (and writes, per --markdown / --json) the comparison of res[1] and res[--gpus], and,
    given every rank's read_times, rank_lines."""
    (p1, s1, b1, g1, _), (pn, sn, bn, gn, cn) = res[1], res[args.gpus]
    names = sorted(set(p1) | set(pn), key=lambda k: -(abs(pn.get(k, 0) - p1.get(k, 0))))
    tot = lambda p, comm: sum(v for k, v in p.items() if is_comm(k) == comm) / 1e6
    n = args.gpus
    tp = getattr(args, "tp", 1)
    layout = f"FSDP {n}" if tp == 1 else f"FSDP {n // tp} x TP {tp}"
    lines = [f"{args.model}, batch {args.batch} x seq {args.seq}, steps {args.steps - args.last + 1}"
             f"..{args.steps}; GPU ms per step, 1 GPU vs rank 0 of {n} ({layout})", "",
             f"- step GPU time: {sorted(s1)[len(s1) // 2]:.1f} vs {sorted(sn)[len(sn) // 2]:.1f}",
             f"- compute kernels, sum: {tot(p1, False):.1f} vs {tot(pn, False):.1f}; "
             f"union (GPU running any compute kernel): {b1 / 1e6:.1f} vs {bn / 1e6:.1f}",
             f"- communication kernels, sum: {tot(p1, True):.1f} vs {tot(pn, True):.1f}", "",
             f"| kernel | 1 GPU ms | {n} GPUs ms | difference |", "|---|---|---|---|"]
    short = lambda k: (k if len(k) <= 70 else k[:67] + "...").replace("|", "/")
    for k in names[:args.top]:
        a, b = p1.get(k, 0) / 1e6, pn.get(k, 0) / 1e6
        lines.append(f"| `{short(k)}` | {a:.2f} | {b:.2f} | {b - a:+.2f} |")
    for label, gaps in (("1 GPU", g1), (f"{n} GPUs", gn)):
        total = sum(v[1] for v in gaps.values()) / 1e6
        lines += ["", f"No compute kernel running for over 2 us, {label}: {total:.2f} ms per step; "
                  "the largest, by the kernels around the gap:", "",
                  "| before | after | comm kernel during | gaps/step | ms/step |",
                  "|---|---|---|---|---|"]
        for (a, b, d), (cnt, ns) in sorted(gaps.items(), key=lambda x: -x[1][1])[:15]:
            lines.append(f"| `{short(a)}` | `{short(b)}` | {'yes' if d else 'no'} | {cnt:.1f} | "
                         f"{ns / 1e6:.3f} |")
    if cn:
        lines += ["", f"Communication kernels of a step on {n} GPUs, in start order, the most exposed "
                  f"(no compute kernel running during them): {sum(c[2] for c in cn) / 1e6:.2f} of "
                  f"{sum(c[1] for c in cn) / 1e6:.2f} ms per step exposed", "",
                  "| # in step | kernel | ms | exposed ms |", "|---|---|---|---|"]
        for j, (k, ns, ex) in sorted(enumerate(cn), key=lambda x: -x[1][2])[:15]:
            lines.append(f"| {j} | `{short(k)}` | {ns / 1e6:.3f} | {ex / 1e6:.3f} |")
    if ranks:
        lines += rank_lines(ranks)
    text = "\n".join(lines)
    print(text)
    if args.markdown:
        open(args.markdown, "w").write(text + "\n")
    if args.json:
        gap_list = lambda g: [dict(before=a, after=b, comm_during=d, count=c, ns=ns)
                              for (a, b, d), (c, ns) in g.items()]
        json.dump(dict(gpus=n, one=dict(per=p1, step_ms=s1, busy_ns=b1, gaps=gap_list(g1)),
                       many=dict(per=pn, step_ms=sn, busy_ns=bn, gaps=gap_list(gn),
                                 collectives=[dict(kernel=k, ns=ns, exposed_ns=ex)
                                              for k, ns, ex in cn or []])),
                  open(args.json, "w"), indent=1)


if __name__ == "__main__":
    main()
