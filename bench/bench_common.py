"""What the benchmark scripts of bench/ share: the llama3 shapes they train, graphtrain's default
training hyper-parameters and schedule (which the PyTorch peers copy), torchtitan's FLOP count, the
transformers config of a shape, and the small helpers their drivers repeat (argument checks, worker
output, metrics.jsonl, the GPU memory monitor, result files).

Not a script: the scripts run as `python3 bench/X.py` and Python puts bench/ (the script's folder)
first on sys.path, so `import bench_common` finds this file. Only the standard library is imported
here; torch and transformers are imported inside the functions that need them (the drivers run
without them).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time

# Shapes of src/models/flavors.c with ffn written out (torchtitan's rule: int(8 dim / 3), times
# the flavor's multiplier, rounded up to its multiple_of: 192 for test_tiny, 768 for debugmodel,
# 8192 for 1B, 14336 for 8B) and the RoPE original context of each flavor. test_tiny is for quick
# checks of the scripts on a machine without a GPU.
SHAPES = {
    "test_tiny": dict(dim=64, layers=2, heads=4, kv_heads=4, vocab=256, ffn=192, rope_original=256),
    "debugmodel": dict(dim=256, layers=6, heads=16, kv_heads=16, vocab=2048, ffn=768,
                       rope_original=8192),
    "1B": dict(dim=2048, layers=16, heads=32, kv_heads=8, vocab=128256, ffn=8192,
               rope_original=8192),
    "8B": dict(dim=4096, layers=32, heads=32, kv_heads=8, vocab=128256, ffn=14336,
               rope_original=8192),
}
# graphtrain's defaults: AdamW lr, betas, eps, weight decay (matrices only), clipping max norm,
# warmup steps of the schedule.
LR, BETAS, EPS, WEIGHT_DECAY, MAX_NORM, WARMUP = 8e-4, (0.9, 0.95), 1e-8, 0.1, 1.0, 2
GT_CUBLASLT_WORKSPACE = 32 << 20  # src/backend/cuda/cuda.cu GT_CUDA_WORKSPACE


def lr_at(step, steps):
    """graphtrain's default schedule (torchtitan's): linear warmup over WARMUP steps starting at
    lr/WARMUP, then linear decay to 0 over the remaining steps."""
    if step <= WARMUP:
        return LR * step / WARMUP
    return LR * max(0.0, 1.0 - (step - WARMUP - 1) / max(1, steps - WARMUP))


def param_counts(m):
    """(all parameters, non-embedding parameters) of the llama3 shape m. torchtitan leaves only
    the token embedding out of the MFU count; the (untied) output projection stays in."""
    hd = m["dim"] // m["heads"]
    attn = m["dim"] * m["heads"] * hd * 2 + m["dim"] * m["kv_heads"] * hd * 2  # wq, wo, wk, wv
    layer = attn + 3 * m["dim"] * m["ffn"] + 2 * m["dim"]  # w1 w2 w3, two RMSNorm weights
    non_embedding = m["layers"] * layer + m["dim"] + m["dim"] * m["vocab"]  # final norm, output
    return non_embedding + m["vocab"] * m["dim"], non_embedding


def flops_per_token(m, seq):
    """torchtitan's model FLOPs per token: 6 N(non-embedding) + 12 L H Dh S."""
    _, n = param_counts(m)
    return 6 * n + 12 * m["layers"] * m["heads"] * (m["dim"] // m["heads"]) * seq


def llama_config(m):
    """transformers LlamaConfig of shape m (keys of SHAPES): untied output, llama3 RoPE scaling
    (theta 500000, factor 8, low/high frequency factors 1/4), attention "sdpa" (transformers'
    default)."""
    import transformers
    from transformers import LlamaConfig

    common = dict(
        hidden_size=m["dim"], intermediate_size=m["ffn"], num_hidden_layers=m["layers"],
        num_attention_heads=m["heads"], num_key_value_heads=m["kv_heads"], vocab_size=m["vocab"],
        head_dim=m["dim"] // m["heads"], rms_norm_eps=1e-5, max_position_embeddings=131072,
        tie_word_embeddings=False, attention_bias=False, mlp_bias=False, hidden_act="silu",
        attention_dropout=0.0)
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": m["rope_original"]}
    if int(transformers.__version__.split(".")[0]) >= 5:
        cfg = LlamaConfig(**common, rope_parameters=dict(scaling, rope_theta=500000.0))
    else:  # transformers 4.x spelling
        cfg = LlamaConfig(**common, rope_theta=500000.0, rope_scaling=scaling)
    cfg._attn_implementation = causal_sdpa()
    return cfg


def causal_sdpa():
    """The attention of llama_config: transformers' "sdpa" attention, always called without a mask
    (so with is_causal=True), as transformers itself calls it in eager mode for these full,
    unpadded sequences. Under torch.compile, transformers (5.17 at least) builds the causal mask as
    a tensor instead and calls sdpa with it and is_causal=False: a masked full attention, with GQA's
    k and v repeated, which on an H200 made torch.compile's attention 3x its eager time at 1B
    (bench_gpu.py --kernel-times, 2026-11-28). Registered as "sdpa_causal"; "sdpa" on a
    transformers without the attention and mask interfaces (4.x before masking_utils)."""
    try:
        from transformers import AttentionInterface
        from transformers.integrations.sdpa_attention import sdpa_attention_forward
        from transformers.masking_utils import AttentionMaskInterface
    except ImportError:
        return "sdpa"
    AttentionInterface.register("sdpa_causal", sdpa_attention_forward)
    AttentionMaskInterface.register("sdpa_causal", lambda *args, **kwargs: None)
    return "sdpa_causal"


def adamw_groups(model):
    """AdamW parameter groups as graphtrain's step (src/train/optim.c): weight decay on matrices
    only."""
    params = list(model.parameters())
    return [dict(params=[p for p in params if p.ndim >= 2], weight_decay=WEIGHT_DECAY),
            dict(params=[p for p in params if p.ndim < 2], weight_decay=0.0)]


def set_lr(opt, step, steps):
    """The schedule's learning rate for step (1-based) of steps, in every group of opt."""
    for group in opt.param_groups:
        group["lr"] = lr_at(step, steps)


def torch_step(model, opt, loss_fn, gen, dev, shape, step, steps, accum=1, context=None):
    """One step of the PyTorch peers of bench_gpu.py and bench_multi_gpu.py: the schedule's
    learning rate; accum micro-batches, each of random token ids and labels of shape (B, S, V) =
    shape drawn from gen on dev, loss = loss_fn(ids, labels) / accum and its backward (the
    gradients add up in .grad, as torchtitan's gradient accumulation does); then
    clip_grad_norm_(MAX_NORM), AdamW and zero_grad. Each micro-batch's forward and backward run
    inside context() when given (torch TP's loss_parallel). Returns the step's loss (the mean over
    its micro-batches) as a device tensor, not waited for: torch_steps reads it."""
    import contextlib

    import torch

    B, S, V = shape
    set_lr(opt, step, steps)
    loss = 0.0
    for _ in range(accum):
        ids = torch.randint(0, V, (B, S), generator=gen, device=dev)
        labels = torch.randint(0, V, (B, S), generator=gen, device=dev)
        with (context or contextlib.nullcontext)():
            micro = loss_fn(ids, labels) / accum
            micro.backward()
        loss = loss + micro.detach()
    torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss


def torch_steps(steps, one_step, record, ahead=True):
    """Runs one_step(step) for steps 1..steps as graphtrain's trainer runs its steps on a GPU: with
    ahead, step k is queued before step k-1's loss is read (.item(), which waits for the device),
    so the host prepares a step while the device runs the one before. record(step, seconds, loss)
    gets each step's loss and its time: from the host seeing the step before end to seeing this one
    end, which in a steady run is the step's period, whether the device or the host (FSDP2 holds
    its host back a few layers ahead of the device) sets it; the first step's runs from its start.
    So that the last step is seen to end the same way, one more step (steps + 1, at the schedule's
    learning rate 0) is queued after it and not recorded. ahead=False (the CPU, where a step is done
    when one_step returns) reads each loss at once."""
    lag = 1 if ahead else 0  # steps queued before the oldest one's loss is read
    queued, t_end = [], time.perf_counter()
    for step in range(1, steps + 1 + lag):
        queued.append((step, one_step(step)))
        if len(queued) > lag:
            k, loss = queued.pop(0)
            value = loss.item()
            now = time.perf_counter()
            record(k, now - t_end, value)
            t_end = now
    for _, loss in queued:  # the extra step, before the caller reads the peak memory and exits
        loss.item()


# ---------------------------------------------------------------------------------------------
# runs


def run_json_worker(cmd, timeout, env=None):
    """Runs a worker that prints its result as its last stdout line (JSON). Returns (result, wall
    seconds of the process); result is dict(error=...) when it fails or passes timeout (wall then
    None)."""
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        return dict(error=f"timed out after {timeout} s"), None
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        last = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
        return dict(error=last[-1] if last else f"exit {proc.returncode}"), wall
    return json.loads(proc.stdout.strip().splitlines()[-1]), wall


def worker_lines(out):
    """(per-step records, summary record) of a torch worker's output: the JSON lines with a
    "step" key, and the last one with "summary" set ({} when there is none)."""
    steps, summary = [], {}
    for line in out.splitlines():
        if line.startswith("{"):
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if rec.get("summary"):
                summary = rec
            elif "step" in rec:
                steps.append(rec)
    return steps, summary


def read_metrics(path):
    """graphtrain's metrics.jsonl records in step order; [] when the file is missing. A line that
    is not JSON (blank, or cut off by a kill) is left out."""
    records = []
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                try:
                    records.append(json.loads(line))
                except ValueError:
                    pass
    records.sort(key=lambda r: r["step"])
    return records


def tail(text, n=15):
    return "\n".join(text.strip().splitlines()[-n:])


def check_params(r, m):
    """Marks run r when its parameter count (-1: not known) differs from shape m's."""
    expect, _ = param_counts(m)
    if r.get("params", -1) not in (-1, expect):
        r["shape_mismatch"] = f"{r['params']} parameters, expected {expect}"


def print_progress(name, msg, r, t0):
    """One line per finished run: msg, the run's error and log tail, a shape mismatch, and the
    seconds since t0."""
    if "error" in r:
        msg += f" [{r['error']}]\n{r['log_tail']}"
    if "shape_mismatch" in r:
        msg += f" [SHAPE MISMATCH: {r['shape_mismatch']}]"
    print(f"{name}: {msg} ({time.perf_counter() - t0:.0f} s)", flush=True)


# ---------------------------------------------------------------------------------------------
# GPU memory


def gpus_used_bytes(ids):
    """{gpu index: memory.used bytes} for the indices in ids (one nvidia-smi call), or None."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index,memory.used",
                              "--format=csv,noheader,nounits", "-i", ",".join(map(str, ids))],
                             capture_output=True, text=True, timeout=10)
        if out.returncode != 0:
            return None
        used = {}
        for line in out.stdout.strip().splitlines():
            i, mib = line.split(",")
            used[int(i)] = int(mib) * 2**20
        return used if set(used) == set(ids) else None
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return None


BUSY_UTIL = 90  # a sample counts for the clock and power figures when the GPU is this busy (%)


class MemoryMonitor:
    """Samples GPUs `ids` while a run's process lives: one `nvidia-smi --query-gpu ... -lms`
    process streams memory.used, utilization, SM clock and power every period_s (a process per
    sample was too slow: ~17 samples in a 1B run). The run's footprint on a GPU is its peak
    memory.used minus the value read just before the run started. The samples taken while the GPU
    is at least BUSY_UTIL % utilized give its median clock and power under the run (a
    power-capped GPU lowers its clock, and ranks on slower GPUs make the others wait).
    ids None or empty: nothing is sampled and there are no figures."""

    FIELDS = ["memory.used", "utilization.gpu", "clocks.sm", "power.draw"]

    def __init__(self, ids, period_s):
        self.ids, self.period_s = ids, period_s
        self.base = gpus_used_bytes(ids) if ids else None
        self.peak, self.samples = dict(self.base or {}), 0
        self.busy = {i: [] for i in ids or []}  # (SM MHz, W) of busy samples
        self._proc = None
        self._thread = None

    def __enter__(self):
        if self.base is not None:
            try:
                self._proc = subprocess.Popen(
                    ["nvidia-smi", "--query-gpu=index," + ",".join(self.FIELDS),
                     "--format=csv,noheader,nounits", "-i", ",".join(map(str, self.ids)),
                     "-lms", str(max(10, int(self.period_s * 1000)))],
                    stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            except OSError:
                self._proc = None
            if self._proc:
                self._thread = threading.Thread(target=self._read, daemon=True)
                self._thread.start()
        return self

    def _read(self):
        for line in self._proc.stdout:
            cols = [c.strip() for c in line.split(",")]
            try:
                i, mib, util, mhz, watts = int(cols[0]), float(cols[1]), float(cols[2]), \
                    float(cols[3]), float(cols[4])
            except (ValueError, IndexError):
                continue  # "[N/A]" or a partial line
            if i not in self.peak:
                continue
            self.peak[i] = max(self.peak[i], int(mib) * 2**20)
            if util >= BUSY_UTIL and mhz > 0:
                self.busy[i].append((mhz, watts))
            self.samples += 1

    def __exit__(self, *exc):
        if self._proc:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
        if self._thread:
            self._thread.join(timeout=5)

    def busy_figures(self):
        """Per GPU of ids: median SM MHz and watts over its busy samples, and their count."""
        med = lambda v: statistics.median(v) if v else -1
        return dict(sm_mhz_busy_median_per_gpu=[med([m for m, _ in self.busy[i]]) for i in self.ids],
                    power_w_busy_median_per_gpu=[med([w for _, w in self.busy[i]])
                                                 for i in self.ids],
                    busy_samples_per_gpu=[len(self.busy[i]) for i in self.ids])

    def result(self):
        """Figures for all GPUs: the largest footprint, and each GPU's footprint and idle value."""
        if self.base is None:
            return dict(gpu_used_peak_bytes=-1, gpu_used_samples=0)
        per = [self.peak[i] - self.base[i] for i in self.ids]
        return dict(gpu_used_peak_bytes=max(per), gpu_used_peak_bytes_per_gpu=per,
                    gpu_used_idle_bytes_per_gpu=[self.base[i] for i in self.ids],
                    gpu_used_samples=self.samples, **self.busy_figures())

    def result_one(self):
        """Figures of a monitor of one GPU: its footprint and idle value."""
        if self.base is None:
            return dict(gpu_used_peak_bytes=-1, gpu_used_samples=0)
        i = self.ids[0]
        return dict(gpu_used_peak_bytes=self.peak[i] - self.base[i],
                    gpu_used_idle_bytes=self.base[i], gpu_used_samples=self.samples,
                    **self.busy_figures())


# ---------------------------------------------------------------------------------------------
# report


def summarize_steps(step_seconds, skip, tokens_per_step, fpt, peak_tflops, n_gpus=1):
    """Median step time over the steps after the first `skip`, tokens/s (in total and per GPU),
    MFU per GPU (tokens/s per GPU x FLOPs per token fpt / peak) and the first step's seconds;
    None when no step is left after `skip`."""
    timed = step_seconds[skip:]
    if not timed:
        return None
    ms = statistics.median(timed) * 1e3
    tps = tokens_per_step / (ms / 1e3)
    return dict(step_ms=ms, step_ms_min=min(timed) * 1e3, step_ms_max=max(timed) * 1e3,
                n_timed=len(timed), tokens_per_s=tps, tokens_per_s_per_gpu=tps / n_gpus,
                mfu=tps / n_gpus * fpt / (peak_tflops * 1e12), first_step_s=step_seconds[0])


def gib(b):
    return f"{b / 2**30:.2f}" if b is not None and b >= 0 else "–"


def write_json(path, results):
    """Writes results to path (nothing when path is None)."""
    if path:
        with open(path, "w") as f:
            json.dump(results, f, indent=1)


def write_markdown(path, results, where, text):
    """The tables in path (nothing when path is None), under a line with the date and machine and
    one with the command line."""
    if path:
        with open(path, "w") as f:
            f.write(f"{results['date']}, {where}\n\n`{' '.join(sys.argv)}`\n" + text + "\n")


# ---------------------------------------------------------------------------------------------
# command line


def arg_parser(doc):
    """The scripts' parser: the first line of the module docstring doc as description, and the
    graphtrain binary as the optional first argument (default build/graphtrain of the repo)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("graphtrain", nargs="?", default=os.path.join(root, "build", "graphtrain"))
    return ap


def require_known(what, got, known):
    """Exits naming the first of got that is not in known."""
    for x in got:
        if x not in known:
            sys.exit(f"unknown {what} {x!r} (known: {', '.join(known)})")


def require_steps(steps, skip):
    """Exits unless at least one step is left after the skipped ones."""
    if not steps > skip >= 0:
        sys.exit(f"--steps ({steps}) must exceed --skip ({skip})")


def require_executable(path):
    """Exits unless path is an executable file (the graphtrain binary)."""
    if not os.access(path, os.X_OK):
        sys.exit(f"graphtrain binary {path!r} not found or not executable")
