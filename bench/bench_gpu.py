#!/usr/bin/env python3
"""GPU training throughput: graphtrain `train` vs PyTorch eager and torch.compile, same model shape.

One program, one GPU, one run: for every model of --models (llama3 debugmodel and 1B by default,
batch 8 x seq 2048) it trains with

graphtrain — one process per run:

    graphtrain train --model.flavor F --training.device cuda --training.local_batch_size 8
        --training.seq_len 2048 --training.steps N --metrics.log_freq 1 --metrics.peak_tflops 989
        --job.print_config false --job.dump_folder TMP

(bf16 mixed precision, graphtrain's default: fp32 master parameters and AdamW state, bf16
compute, fp32 loss and gradients; synthetic data; AdamW lr 8e-4, betas 0.9/0.95, eps 1e-8, weight
decay 0.1 on matrices; global-norm clipping at 1.0). Step times come from the run's metrics.jsonl:
the trainer times data + forward + backward + clip + AdamW and waits for the GPU at the end of
every step (it reads the loss back).

PyTorch — one fresh Python process per run: transformers LlamaForCausalLM from a LlamaConfig of
the same shape (untied output, llama3 RoPE scaling, attn_implementation "sdpa"), built directly on
the GPU, fp32 parameters, forward + cross-entropy under torch.autocast(bfloat16) (the logits are
cast to fp32 for the loss, as torchtitan does), torch.optim.AdamW(fused=True) with the same
hyperparameters and parameter groups, torch.nn.utils.clip_grad_norm_(1.0). One step = random
tokens on the GPU, forward + loss, backward, clip, optimizer step, zero_grad; its loss.item()
comes after the next step is queued, as graphtrain's trainer reads a step's loss
(bench_common.torch_steps). Mode "compile" wraps forward + loss in one torch.compile
(inductor defaults; its caches disabled, so step 1 shows a cold compile); backward goes through
the compiled graph (AOTAutograd), clip and AdamW stay eager (fused kernels already).

Reported per run: median step time over steps --skip+1..N, tokens/s = tokens per step / that,
MFU = tokens/s x FLOPs per token / peak (torchtitan: 6 x non-embedding parameters +
12 x layers x heads x head_dim x seq; peak --peak-tflops, 989 for H100 SXM / H200 dense bf16),
the first step's time (compilation shows there), and peak GPU memory, two ways:
  - "GPU used": the device's memory.used (nvidia-smi, polled every --poll-s seconds while the run's
    process lives) minus its value just before the process started. The same method for every
    system; it includes the CUDA context, cuBLAS/cuDNN handles and, for torch, the caching
    allocator's reserve. graphtrain's "peak_memory_bytes" in metrics.jsonl is host RSS, not GPU
    memory, so it is not used here.
  - "own count": torch.cuda.max_memory_allocated for torch; for graphtrain the planned device
    arenas (persistent + step, from the memory plan it prints) plus its 32 MiB cuBLASLt workspace.

usage: bench/bench_gpu.py [GRAPHTRAIN] [--models debugmodel,1B] [--systems graphtrain,eager,compile]
        [--steps 20] [--skip 5] [--batch 8] [--seq 2048] [--timeout 420] [--json out.json]
        [--markdown out.md] [--log-dir DIR] [--kernel-times [--kernel-steps 4]]

--kernel-times adds, after the timed runs, one graphtrain run per model under a small CUPTI
activity library (CUDA_INJECTION64_PATH; built here with gcc) and lists GPU time per kernel name.
"""
import datetime
import json
import os
import re
import shutil
import statistics
import signal
import subprocess
import sys
import tempfile
import time

import bench_common as bc  # shapes, hyper-parameters, schedule, FLOPs: bench/bench_common.py

# The shapes of bench_common.SHAPES this script runs (test_tiny: a quick check of the script on a
# machine without a GPU, --device cpu).
MODELS = {name: bc.SHAPES[name] for name in ("debugmodel", "1B", "test_tiny")}
SYSTEMS = ("graphtrain", "eager", "compile")
SYSTEM_NAMES = {"graphtrain": "graphtrain", "eager": "torch eager", "compile": "torch.compile"}


# ---------------------------------------------------------------------------------------------
# PyTorch worker (own process; prints one JSON line per step, then a summary line)


def torch_worker(spec):
    import torch
    import torch.nn.functional as F
    import transformers
    from transformers import LlamaForCausalLM

    m = MODELS[spec["model"]]
    dev = torch.device(spec["device"])
    torch.manual_seed(0)
    cfg = bc.llama_config(m)
    with dev:  # initialise on the device: a 1B model initialised on the CPU takes many seconds
        model = LlamaForCausalLM(cfg)
    model = model.float().train()
    n_params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(bc.adamw_groups(model), lr=bc.LR, betas=bc.BETAS, eps=bc.EPS,
                            fused=True)
    V = m["vocab"]

    def forward_loss(ids, labels):
        logits = model(input_ids=ids, use_cache=False).logits
        return F.cross_entropy(logits.float().reshape(-1, V), labels.reshape(-1))

    step_fn = torch.compile(forward_loss) if spec["mode"] == "compile" else forward_loss

    def autocast_loss(ids, labels):
        with torch.autocast(device_type=dev.type, dtype=torch.bfloat16):
            return step_fn(ids, labels)

    cuda = dev.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats(dev)
    steps = spec["steps"]
    gen = torch.Generator(device=dev).manual_seed(spec["seed"])
    # --kernel-times: the last profile_steps steps, and the unrecorded one after them, under
    # torch.profiler (GPU activity only); the queue is drained first so that no earlier step's
    # kernels fall inside
    first_profiled = steps - spec.get("profile_steps", 0) + 1
    prof = None

    def one_step(step):
        nonlocal prof
        if step == first_profiled and first_profiled <= steps:
            if cuda:
                torch.cuda.synchronize(dev)
            prof = torch.profiler.profile(activities=[
                torch.profiler.ProfilerActivity.CUDA if cuda else torch.profiler.ProfilerActivity.CPU])
            prof.start()
        return bc.torch_step(model, opt, autocast_loss, gen, dev,
                             (spec["batch"], spec["seq"], V), step, steps)

    bc.torch_steps(
        steps,
        one_step,
        lambda step, seconds, loss_value: print(json.dumps(dict(
            step=step, step_seconds=seconds, loss=loss_value)), flush=True),
        ahead=cuda)
    if prof is not None:
        if cuda:
            torch.cuda.synchronize(dev)
        prof.stop()
        print(json.dumps(dict(kernels=profiled_kernels(prof, cuda),
                              profiled_steps=steps - first_profiled + 2)), flush=True)
    print(json.dumps(dict(
        summary=True, params=n_params, torch=torch.__version__,
        transformers=transformers.__version__,
        device_name=torch.cuda.get_device_name(dev) if cuda else "cpu",
        max_memory_allocated=torch.cuda.max_memory_allocated(dev) if cuda else -1,
        max_memory_reserved=torch.cuda.max_memory_reserved(dev) if cuda else -1,
        adamw_fused=opt.defaults.get("fused"))), flush=True)


def profiled_kernels(prof, cuda):
    """[name, ns, calls] of every GPU kernel (every CPU op on the CPU) the profiler saw, by its
    own time, largest first."""
    from torch.autograd import DeviceType

    want = DeviceType.CUDA if cuda else DeviceType.CPU
    rows = {}
    for e in prof.events():
        if e.device_type != want:
            continue
        ns = int(round((e.self_device_time_total if cuda else e.self_cpu_time_total) * 1000))
        r = rows.setdefault(e.name, [e.name, 0, 0])
        r[1] += ns
        r[2] += 1
    return sorted(rows.values(), key=lambda r: -r[1])


# ---------------------------------------------------------------------------------------------
# processes


def run_process(cmd, timeout, log_path, env=None, cwd=None):
    """Runs cmd in its own process group with stdout+stderr in log_path; on timeout kills that
    group. Returns (exit status or None on timeout, output text)."""
    with open(log_path, "w+") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, text=True, env=env,
                                cwd=cwd, start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            rc = None
        log.seek(0)
        return rc, log.read()


# ---------------------------------------------------------------------------------------------
# runs


def run_graphtrain(args, model, log_path):
    dump = tempfile.mkdtemp(prefix="bench_gpu_")
    cmd = [args.graphtrain, "train", "--model.flavor", model,
           "--training.device", args.device,
           "--training.local_batch_size", str(args.batch), "--training.seq_len", str(args.seq),
           "--training.steps", str(args.steps), "--metrics.log_freq", "1",
           "--metrics.peak_tflops", str(args.peak_tflops), "--job.print_config", "false",
           "--job.dump_folder", dump] + args.gt_args.split()
    with bc.MemoryMonitor(args.gpu_ids, args.poll_s) as mon:
        t0 = time.perf_counter()
        rc, out = run_process(cmd, args.timeout, log_path)
        wall = time.perf_counter() - t0
    records = bc.read_metrics(os.path.join(dump, "metrics.jsonl"))
    shutil.rmtree(dump, ignore_errors=True)
    r = dict(command=" ".join(cmd), wall_seconds=wall, **mon.result_one(),
             step_seconds=[x["step_seconds"] for x in records],
             losses=[x["loss"] for x in records],
             graphtrain_mfu=[x.get("mfu") for x in records],
             graphtrain_model_flops_per_step=records[0].get("model_flops_per_step")
             if records else None)
    p = re.search(r"(\d+) parameters", out)
    r["params"] = int(p.group(1)) if p else -1
    arenas = [int(x) for x in re.findall(r"(?:persistent|step)\s+arena\s+(\d+) bytes", out)]
    r["planned_arena_bytes"] = sum(arenas) if arenas else -1
    r["own_peak_bytes"] = sum(arenas) + bc.GT_CUBLASLT_WORKSPACE if arenas else -1
    if rc != 0:
        why = f"timed out after {args.timeout} s" if rc is None else f"exit status {rc}"
        r["error"] = f"{why}; {len(records)} of {args.steps} steps logged"
        r["log_tail"] = bc.tail(out)
    return r


def run_torch(args, model, mode, log_path, profile_steps=0):
    """A timed torch run of args.steps steps; with profile_steps, a run of profile_steps + 2 steps
    whose last profile_steps (and the unrecorded step after them) are profiled: r["kernels"] as
    run_kernel_times gives them, over r["steps"] steps."""
    n_steps = profile_steps + 2 if profile_steps else args.steps
    spec = dict(model=model, mode=mode, steps=n_steps, seed=0, batch=args.batch, seq=args.seq,
                device=args.device, profile_steps=profile_steps)
    env = dict(os.environ, TORCHINDUCTOR_FORCE_DISABLE_CACHES="1")
    cmd = [sys.executable, os.path.abspath(__file__), "--torch-worker", json.dumps(spec)]
    with bc.MemoryMonitor(args.gpu_ids, args.poll_s) as mon:
        t0 = time.perf_counter()
        rc, out = run_process(cmd, args.timeout, log_path, env=env)
        wall = time.perf_counter() - t0
    steps, summary = bc.worker_lines(out)
    r = dict(wall_seconds=wall, **mon.result_one(), step_seconds=[x["step_seconds"] for x in steps],
             losses=[x["loss"] for x in steps], params=summary.get("params", -1),
             own_peak_bytes=summary.get("max_memory_allocated", -1),
             torch_max_memory_reserved=summary.get("max_memory_reserved", -1),
             torch=summary.get("torch"), transformers=summary.get("transformers"),
             device_name=summary.get("device_name"), adamw_fused=summary.get("adamw_fused"))
    if profile_steps:
        prof = [json.loads(x) for x in out.splitlines() if x.startswith('{"kernels"')]
        r["kernels"] = [dict(name=n, ns=ns, calls=c) for n, ns, c in
                        (prof[0]["kernels"] if prof else [])]
        r["steps"] = prof[0]["profiled_steps"] if prof else 1
        r["kernel_ns"] = sum(k["ns"] for k in r["kernels"])
    if rc != 0:
        why = f"timed out after {args.timeout} s" if rc is None else f"exit status {rc}"
        r["error"] = f"{why}; {len(steps)} of {n_steps} steps done"
        r["log_tail"] = bc.tail(out)
    return r


# ---------------------------------------------------------------------------------------------
# graphtrain kernel time breakdown (--kernel-times): a CUPTI activity library injected into the
# graphtrain process through CUDA_INJECTION64_PATH records every kernel's and copy's start/end on
# the GPU and, at exit, writes the total time and launch count per kernel name. No profiler tool
# (nsys, ncu) is needed on the machine, only CUPTI (CUDA toolkit or the nvidia-*-cupti wheel).

KERNEL_TIMES_C = r"""
#include <cupti.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct { char *name; uint64_t ns, calls; } entry;
static entry *tab;
static size_t n_tab, cap_tab;
static uint64_t copy_ns, copy_calls;
static int copy_spans; /* GT_BENCH_COPY_SPANS=1: copies are spans too, named "[memcpy KIND]" */
typedef struct { uint64_t start, end; size_t name; uint32_t stream; } span;
static span *spans;
static size_t n_spans, cap_spans;

static void add_span(uint64_t start, uint64_t end, size_t name, uint32_t stream)
{
    if (n_spans == cap_spans) {
        cap_spans = cap_spans ? 2 * cap_spans : 4096;
        spans = realloc(spans, cap_spans * sizeof *spans);
        if (!spans) abort();
    }
    spans[n_spans++] = (span){start, end, name, stream};
}

static size_t add(const char *name, uint64_t ns)
{
    for (size_t i = 0; i < n_tab; i++)
        if (strcmp(tab[i].name, name) == 0) { tab[i].ns += ns; tab[i].calls++; return i; }
    if (n_tab == cap_tab) {
        cap_tab = cap_tab ? 2 * cap_tab : 256;
        tab = realloc(tab, cap_tab * sizeof *tab);
        if (!tab) abort();
    }
    tab[n_tab++] = (entry){strdup(name), ns, 1};
    return n_tab - 1;
}

static void CUPTIAPI buf_requested(uint8_t **buf, size_t *size, size_t *max_records)
{
    *size = 8u << 20;
    *buf = aligned_alloc(8, *size);
    *max_records = 0;
}

static void CUPTIAPI buf_completed(CUcontext ctx, uint32_t stream, uint8_t *buf, size_t size,
                                   size_t valid)
{
    (void)ctx, (void)stream, (void)size;
    CUpti_Activity *r = NULL;
    while (cuptiActivityGetNextRecord(buf, valid, &r) == CUPTI_SUCCESS) {
        if (r->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL ||
            r->kind == CUPTI_ACTIVITY_KIND_KERNEL) {
            const KREC *k = (const KREC *)r;
            add_span(k->start, k->end, add(k->name ? k->name : "?", k->end - k->start),
                     k->streamId);
        } else if (r->kind == CUPTI_ACTIVITY_KIND_MEMCPY2) { /* between GPUs (NCCL's copy engines) */
            const PREC *m = (const PREC *)r;
            copy_ns += m->end - m->start;
            copy_calls++;
            if (copy_spans)
                add_span(m->start, m->end, add("[memcpy PtoP]", m->end - m->start), m->streamId);
        } else if (r->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
            const MREC *m = (const MREC *)r;
            copy_ns += m->end - m->start;
            copy_calls++;
            if (copy_spans) {
                const char *kind = m->copyKind == CUPTI_ACTIVITY_MEMCPY_KIND_HTOD   ? "[memcpy HtoD]"
                                   : m->copyKind == CUPTI_ACTIVITY_MEMCPY_KIND_DTOH ? "[memcpy DtoH]"
                                   : m->copyKind == CUPTI_ACTIVITY_MEMCPY_KIND_DTOD ? "[memcpy DtoD]"
                                   : m->copyKind == CUPTI_ACTIVITY_MEMCPY_KIND_PTOP ? "[memcpy PtoP]"
                                                                                     : "[memcpy]";
                add_span(m->start, m->end, add(kind, m->end - m->start), m->streamId);
            }
        }
    }
    free(buf);
}

static void dump(void)
{
    cuptiActivityFlushAll(1);
    const char *path = getenv("GT_BENCH_KERNEL_TIMES");
    const char *rank = getenv("OMPI_COMM_WORLD_RANK"); /* one file per rank under mpirun */
    char ranked[4096];
    if (path && rank && snprintf(ranked, sizeof ranked, "%s.rank%s", path, rank) < 4096)
        path = ranked;
    FILE *f = path ? fopen(path, "w") : NULL;
    if (!f) return;
    for (size_t i = 0; i < n_tab; i++)
        fprintf(f, "kernel\t%llu\t%llu\t%s\n", (unsigned long long)tab[i].ns,
                (unsigned long long)tab[i].calls, tab[i].name);
    fprintf(f, "memcpy\t%llu\t%llu\t-\n", (unsigned long long)copy_ns,
            (unsigned long long)copy_calls);
    for (size_t i = 0; i < n_spans; i++)
        fprintf(f, "span\t%llu\t%llu\t%zu\t%u\n", (unsigned long long)spans[i].start,
                (unsigned long long)spans[i].end, spans[i].name, spans[i].stream);
    fclose(f);
}

int InitializeInjection(void)
{
    const char *cs = getenv("GT_BENCH_COPY_SPANS");
    copy_spans = cs && cs[0] == '1';
    if (cuptiActivityRegisterCallbacks(buf_requested, buf_completed) != CUPTI_SUCCESS) return 0;
    cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
    cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY);
    cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY2);
    atexit(dump);
    return 1;
}
"""


def find_cupti():
    """(include dir, lib dir) of a CUPTI whose header and library sit together, or None."""
    import glob
    roots = ["/usr/local/cuda", "/usr/local/cuda/extras/CUPTI"]
    for sp in sys.path:
        roots += glob.glob(os.path.join(sp, "nvidia", "*")) + glob.glob(os.path.join(sp, "nvidia"))
    for root in roots:
        inc = os.path.join(root, "include")
        if not os.path.exists(os.path.join(inc, "cupti.h")):
            continue
        for lib in ("lib64", "lib", "targets/x86_64-linux/lib", "extras/CUPTI/lib64"):
            libdir = os.path.join(root, lib)
            if glob.glob(os.path.join(libdir, "libcupti.so*")):
                return inc, libdir
    return None


def build_kernel_times_lib(work):
    """Compiles the injection library into work/; returns its path or raises RuntimeError."""
    import glob
    found = find_cupti()
    if not found:
        raise RuntimeError("no CUPTI (cupti.h + libcupti.so) found")
    inc, libdir = found
    text = "".join(open(h).read() for h in glob.glob(os.path.join(inc, "cupti_activity*.h")))

    def latest(base):  # the record layout CUPTI fills is the newest its header declares
        v = [int(x) for x in re.findall(base + r"(\d+)\b", text)]
        return base + (str(max(v)) if v else "")

    src = os.path.join(work, "kernel_times.c")
    with open(src, "w") as f:
        f.write(KERNEL_TIMES_C)
    lib = os.path.join(work, "kernel_times.so")
    libs = sorted(glob.glob(os.path.join(libdir, "libcupti.so*")), key=len)
    cmd = ["gcc", "-shared", "-fPIC", "-O2", "-I" + inc, "-I/usr/local/cuda/include",
           f"-DKREC={latest('CUpti_ActivityKernel')}", f"-DMREC={latest('CUpti_ActivityMemcpy')}",
           f"-DPREC={latest('CUpti_ActivityMemcpyPtoP')}",
           src, "-o", lib, libs[0], "-Wl,-rpath," + libdir]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{bc.tail(out.stderr)}")
    return lib


def demangle(names):
    if not shutil.which("c++filt"):
        return names
    out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True)
    lines = out.stdout.splitlines()
    return lines if out.returncode == 0 and len(lines) == len(names) else names


def run_kernel_times(args, model, lib, log_path):
    """A separate graphtrain run (--kernel-steps steps) under the CUPTI library."""
    times = log_path[:-4] + ".tsv"
    env = dict(os.environ, CUDA_INJECTION64_PATH=lib, GT_BENCH_KERNEL_TIMES=times)
    dump = tempfile.mkdtemp(prefix="bench_gpu_")
    cmd = [args.graphtrain, "train", "--model.name", args.model_name, "--model.flavor", model,
           "--training.device", "cuda",
           "--training.local_batch_size", str(args.batch), "--training.seq_len", str(args.seq),
           "--training.steps", str(args.kernel_steps), "--metrics.log_freq", "1",
           "--job.print_config", "false", "--job.dump_folder", dump] + args.gt_args.split()
    rc, out = run_process(cmd, args.timeout, log_path, env=env)
    shutil.rmtree(dump, ignore_errors=True)
    r = dict(command=" ".join(cmd), steps=args.kernel_steps, kernel_steps=args.kernel_steps,
             kernels=[])
    if rc != 0:
        r["error"] = (f"timed out after {args.timeout} s" if rc is None else f"exit status {rc}")
        r["log_tail"] = bc.tail(out)
    if not os.path.exists(times):
        r.setdefault("error", "the CUPTI library wrote nothing (injection not loaded?)")
        return r
    names, totals, spans, memcpy = read_span_file(times)
    if memcpy:
        r["memcpy_ns"], r["memcpy_calls"] = memcpy
    try:
        ends = step_ends(spans, names, args.kernel_steps)
    except RuntimeError as e:
        r.setdefault("error", str(e))
        ends = []
    if len(ends) >= 2:  # steps 2..N: step 1 also draws the parameters and captures the graph
        per = {}
        spans = [x for x in spans if ends[0] < x[0] and x[1] <= ends[-1]]
        for start, end, i, _ in spans:
            k = per.setdefault(i, [0, 0])
            k[0], k[1] = k[0] + end - start, k[1] + 1
        r["steps"] = len(ends) - 1
        r["step_ends_ns"] = ends
        r["last_step_ns"], r["gap_ns"], r["gaps"] = busy_gaps(
            [(s, e) for s, e, _, _ in spans if s > ends[-2]])
    else:  # no spans: the library's totals over every step
        per = {i: list(t) for i, t in enumerate(totals)}
    r["kernels"] = sorted((dict(name=names[i], ns=ns, calls=calls)
                           for i, (ns, calls) in per.items()), key=lambda k: -k["ns"])
    r["kernel_ns"] = sum(k["ns"] for k in r["kernels"])
    return r


def read_span_file(path):
    """The CUPTI library's file: (kernel names, demangled, in the order the spans index them;
    (ns, launches) per name over the whole run; the spans (start, end, name index, stream) sorted
    by start, host transfers (the step's inputs in, the loss out, between steps) left out;
    (ns, count) of all host copies, or None)."""
    names, totals, spans, memcpy = [], [], [], None
    with open(path) as f:
        for line in f:
            kind, a, b, c = line.rstrip("\n").split("\t", 3)
            if kind == "memcpy":
                memcpy = (int(a), int(b))
            elif kind == "span":
                idx, stream = c.split("\t")
                spans.append((int(a), int(b), int(idx), int(stream)))
            else:
                names.append(c)
                totals.append((int(a), int(b)))
    names = demangle(names)
    spans = sorted(x for x in spans if names[x[2]] not in ("[memcpy HtoD]", "[memcpy DtoH]"))
    return names, totals, spans, memcpy


def step_ends(spans, names, steps):
    """End time of each of `steps` steps in spans ((start, end, name index, ...) sorted by start):
    the end of its multi-tensor AdamW launch (one per step, the last kernel of the step), or,
    without those, of every len(spans) / steps-th span."""
    ends = [x[1] for x in spans if "adamw_multi" in names[x[2]]]
    if len(ends) == steps:
        return ends
    n = len(spans) // steps
    if n == 0 or n * steps != len(spans):
        raise RuntimeError(f"{len(spans)} device spans are not {steps} equal steps and the step "
                           f"has {len(ends)} AdamW launches, not one")
    return [max(x[1] for x in spans[k * n:(k + 1) * n]) for k in range(steps)]


def busy_gaps(spans):
    """(ns from the first start to the last end, ns in between with no kernel running, number of
    such gaps) of spans (start, end) sorted by start."""
    if not spans:
        return 0, 0, 0
    gap_ns, gaps, end = 0, 0, spans[0][1]
    for start, stop in spans[1:]:
        if start > end:
            gap_ns, gaps = gap_ns + start - end, gaps + 1
        end = max(end, stop)
    return end - spans[0][0], gap_ns, gaps


def gpu_step_times(r):
    """'; GPU time per step ...' from step_ends_ns (steps 2..N)."""
    t = r.get("step_ends_ns") or []
    d = [(b - a) / 1e6 for a, b in zip(t, t[1:])]
    if not d:
        return ""
    return (f"; GPU time per step from one step's end to the next's, steps 2..{len(d) + 1}:"
            f" median {statistics.median(d):.1f} ms (min {min(d):.1f}, max {max(d):.1f})")


def kernel_table(model, r, top):
    lines = [f"\n**{model}: graphtrain GPU time per kernel** — CUPTI kernel activity, the last "
             f"{r['steps']} of {r['kernel_steps']} steps; total kernel time "
             f"{r.get('kernel_ns', 0) / 1e6 / r['steps']:.1f} ms/step, host↔device copies "
             f"{r.get('memcpy_ns', 0) / 1e6:.1f} ms in the whole run; last step: "
             f"{r.get('last_step_ns', 0) / 1e6:.1f} ms from its first kernel's start to its "
             f"last one's end, {r.get('gap_ns', 0) / 1e6:.2f} ms of it with no kernel running "
             f"({r.get('gaps', 0)} gaps)" + gpu_step_times(r)
             + (f" [{r['error']}]" if "error" in r else "") + "\n"]
    return "\n".join(lines + kernel_rows(r, top))


def kernel_rows(r, top):
    """The table of r's top kernels: ms and launches per step, share of all kernel time."""
    lines = ["| kernel | ms/step | share | launches/step |", "|---|---|---|---|"]
    total = r.get("kernel_ns") or 1
    for k in r["kernels"][:top]:
        name = k["name"] if len(k["name"]) <= 110 else k["name"][:107] + "..."
        lines.append(f"| `{name.replace('|', '/')}` | {k['ns'] / 1e6 / r['steps']:.2f} | "
                     f"{100 * k['ns'] / total:.1f} % | {k['calls'] / r['steps']:.0f} |")
    return lines


def kernel_category(name):
    """The kind of work of a kernel, by its name, to set graphtrain's kernels beside torch's:
    attention (graphtrain's and cuDNN's sdpa with cuDNN's helper kernels, torch's flash /
    efficient / cuDNN), matmul (cuBLAS(Lt) and CUTLASS), the optimizer (both sides' fused AdamW),
    communication (NCCL) or the rest (elementwise, norms, RoPE, the loss, reductions, copies;
    Inductor's Triton kernels)."""
    n = name.lower()
    if "nccl" in n:
        return "communication"
    if any(k in n for k in ("flash", "fmha", "sdpa", "attn", "attention", "cudnn::fusion")):
        return "attention"
    if any(k in n for k in ("gemm", "nvjet", "xmma", "cutlass", "cublas", "::mm", "::addmm")):
        return "matmul"
    if "adam" in n:
        return "optimizer (AdamW)"
    return "the rest"


def category_table(model, columns):
    """GPU ms per step by kernel_category, one column per (title, kernel run)."""
    cats = ("matmul", "attention", "optimizer (AdamW)", "communication", "the rest")
    per = []
    for _, r in columns:
        d = dict.fromkeys(cats, 0.0)
        for k in r.get("kernels", []):
            d[kernel_category(k["name"])] += k["ns"] / 1e6 / max(r.get("steps", 1), 1)
        per.append(d)
    lines = [f"\n**{model}: GPU ms per step by kind of kernel**\n",
             "| kind | " + " | ".join(t for t, _ in columns) + " |",
             "|---|" + "---|" * len(columns)]
    for c in cats + ("all kernels",):
        vals = [sum(d.values()) if c == "all kernels" else d[c] for d in per]
        lines.append(f"| {c} | " + " | ".join(f"{v:.2f}" for v in vals) + " |")
    return "\n".join(lines)


def torch_kernel_table(model, name, r, top):
    lines = [f"\n**{model}: {name} GPU time per kernel** — torch.profiler over {r['steps']} "
             f"steps after warm-up; total kernel time {r.get('kernel_ns', 0) / 1e6 / r['steps']:.1f}"
             " ms/step" + (f" [{r['error']}]" if "error" in r else "") + "\n"]
    return "\n".join(lines + kernel_rows(r, top))


# ---------------------------------------------------------------------------------------------
# report


def summarize(r, args, model):
    """Median step time over the timed steps; None when too few steps ran."""
    return bc.summarize_steps(r["step_seconds"], args.skip, args.batch * args.seq,
                              bc.flops_per_token(MODELS[model], args.seq), args.peak_tflops)


def tables(results, args):
    lines = []
    for model in results["models"]:
        m = MODELS[model]
        fpt = bc.flops_per_token(m, args.seq)
        lines.append(f"\n**{model}** — batch {args.batch} × seq {args.seq} = "
                     f"{args.batch * args.seq} tokens/step, {fpt / 1e9:.3f} GFLOP/token "
                     f"(torchtitan), median of steps {args.skip + 1}..{args.steps}\n")
        lines.append("| system | step ms (min–max) | tokens/s | MFU | peak GPU used GiB | "
                     "own count GiB | graphtrain tokens/s ÷ this | graphtrain GPU used ÷ this | "
                     "first step s |")
        lines.append("|---|---|---|---|---|---|---|---|---|")
        runs = results["runs"].get(model, {})
        gt = runs.get("graphtrain")
        gt_s = summarize(gt, args, model) if gt else None
        for system in args.systems:
            r = runs.get(system)
            if r is None:
                continue
            s = summarize(r, args, model)
            if s is None:
                lines.append(f"| {SYSTEM_NAMES[system]} | {r.get('error', 'no timed steps')} "
                             "| | | | | | | |")
                continue
            speed = f"{gt_s['tokens_per_s'] / s['tokens_per_s']:.2f}" if gt_s else "–"
            mem = "–"
            gt_mem = (gt or {}).get("gpu_used_peak_bytes", -1)
            mem_r = r.get("gpu_used_peak_bytes", -1)
            if gt_mem > 0 and mem_r > 0:
                mem = f"{gt_mem / mem_r:.2f}"
            name = SYSTEM_NAMES[system] + (" (partial: " + r["error"] + ")" if "error" in r else "")
            lines.append(
                f"| {name} | {s['step_ms']:.1f} "
                f"({s['step_ms_min']:.1f}–{s['step_ms_max']:.1f}) | "
                f"{s['tokens_per_s']:,.0f} | {s['mfu'] * 100:.1f} % | "
                f"{bc.gib(r.get('gpu_used_peak_bytes'))} | {bc.gib(r.get('own_peak_bytes'))} | "
                f"{speed} | {mem} | {s['first_step_s']:.1f} |")
    lines.append("\nGPU used: device memory.used (nvidia-smi) peak minus idle, same method for "
                 "every row (CUDA context included). Own count: torch.cuda.max_memory_allocated; "
                 "graphtrain's planned device arenas + 32 MiB cuBLASLt workspace.")
    return "\n".join(lines)


def main():
    ap = bc.arg_parser(__doc__)
    ap.add_argument("--models", default="debugmodel,1B")
    ap.add_argument("--model-name", default="llama3",
                    help="graphtrain's model family of --kernel-times-only runs (deepseek_v3: "
                         "no torch peer here; see ../shared/peers/torchtitan_deepseek_v3.py)")
    ap.add_argument("--systems", default=",".join(SYSTEMS),
                    help="graphtrain, eager (torch eager), compile (torch.compile)")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--skip", type=int, default=5, help="warm-up steps left out of the medians")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--peak-tflops", type=float, default=989.0)
    ap.add_argument("--timeout", type=float, default=420, help="seconds per run")
    ap.add_argument("--device", default="cuda", help="cuda, or cpu to check the script itself")
    ap.add_argument("--gpu", type=int, default=0, help="GPU index for nvidia-smi")
    ap.add_argument("--poll-s", type=float, default=0.1, help="nvidia-smi polling period")
    ap.add_argument("--kernel-times", action="store_true",
                    help="after the timed runs, one more graphtrain run per model under a CUPTI "
                         "library: GPU time per kernel")
    ap.add_argument("--kernel-times-only", action="store_true",
                    help="only the --kernel-times runs (no timed runs)")
    ap.add_argument("--kernel-steps", type=int, default=4, help="steps of that run")
    ap.add_argument("--kernel-top", type=int, default=25, help="kernels listed per model")
    ap.add_argument("--gt-args", default="",
                    help="more graphtrain flags, space-separated (e.g. a dataset)")
    ap.add_argument("--json", help="write every run (all step times) here")
    ap.add_argument("--markdown", help="write the tables here")
    ap.add_argument("--log-dir", help="keep each run's output here")
    args = ap.parse_args()

    args.models = args.models.split(",")
    args.systems = args.systems.split(",")
    if not (args.kernel_times_only and args.model_name != "llama3"):
        bc.require_known("model", args.models, MODELS)  # other families: any flavor, kernel times
    bc.require_known("system", args.systems, SYSTEMS)
    bc.require_steps(args.steps, args.skip)
    if "graphtrain" in args.systems:
        bc.require_executable(args.graphtrain)
    if args.device != "cuda" or not shutil.which("nvidia-smi"):
        args.gpu = None
    args.gpu_ids = [args.gpu] if args.gpu is not None else None  # the GPU memory monitor's
    log_dir = args.log_dir or tempfile.mkdtemp(prefix="bench_gpu_logs_")
    os.makedirs(log_dir, exist_ok=True)

    gpu_name = None
    if args.gpu is not None:
        q = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version",
                            "--format=csv,noheader", "-i", str(args.gpu)],
                           capture_output=True, text=True)
        gpu_name = q.stdout.strip()
    results = dict(date=datetime.date.today().isoformat(), gpu=gpu_name, argv=sys.argv,
                   steps=args.steps, skip=args.skip, batch=args.batch, seq=args.seq,
                   peak_tflops=args.peak_tflops, models=args.models, runs={})

    if args.kernel_times_only:
        args.kernel_times = True
    for model in [] if args.kernel_times_only else args.models:
        for system in args.systems:
            log_path = os.path.join(log_dir, f"{model}_{system}.log")
            t0 = time.perf_counter()
            if system == "graphtrain":
                r = run_graphtrain(args, model, log_path)
            else:
                r = run_torch(args, model, system, log_path)
            results["runs"].setdefault(model, {})[system] = r
            bc.check_params(r, MODELS[model])
            s = summarize(r, args, model)
            msg = f"{s['step_ms']:.1f} ms/step, {s['tokens_per_s']:,.0f} tokens/s" if s else ""
            bc.print_progress(f"{model}/{system}", msg, r, t0)
            bc.write_json(args.json, results)
    text = "" if args.kernel_times_only else tables(results, args)
    lib = None
    if args.kernel_times and "graphtrain" in args.systems and args.device == "cuda":
        try:
            lib = build_kernel_times_lib(log_dir)
        except RuntimeError as e:
            text += f"\n\nkernel times: {e}"
    for model in args.models if args.kernel_times else []:
        runs = []
        for system in args.systems:
            t0 = time.perf_counter()
            log_path = os.path.join(log_dir, f"{model}_{system}_kernels.log")
            if system == "graphtrain":
                if lib is None:
                    continue
                r = run_kernel_times(args, model, lib, log_path)
            else:
                r = run_torch(args, model, system, log_path, profile_steps=args.kernel_steps)
            runs.append((system, r))
            results.setdefault("kernel_times", {}).setdefault(model, {})[system] = r
            print(f"{model}/{system} kernel times: {len(r['kernels'])} kernels "
                  f"{r.get('error', '')} ({time.perf_counter() - t0:.0f} s)", flush=True)
            bc.write_json(args.json, results)
        if len(runs) > 1:
            text += "\n" + category_table(model, [(SYSTEM_NAMES[x], r) for x, r in runs])
        for system, r in runs:
            text += "\n" + (kernel_table(model, r, args.kernel_top) if system == "graphtrain" else
                            torch_kernel_table(model, SYSTEM_NAMES[system], r, args.kernel_top))
    print(text)
    bc.write_markdown(args.markdown, results, gpu_name or args.device, text)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--torch-worker":
        torch_worker(json.loads(sys.argv[2]))
    else:
        main()
