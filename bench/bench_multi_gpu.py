#!/usr/bin/env python3
"""Multi-GPU training throughput: graphtrain FSDP / FSDP x TP vs PyTorch FSDP2 + torch.compile.

One program, one machine, one run: for every model of --models (llama3 1B and 8B by default),
every GPU count of --gpus (1, 2, 4) and every layout of --layouts it trains with

graphtrain — one mpirun per run (B = --batch, S = --seq, K = --steps, TMP a fresh folder):

    mpirun -np N --allow-run-as-root --oversubscribe --bind-to none -x NCCL_NVLS_ENABLE=0
        GRAPHTRAIN train
        --model.flavor F --training.device cuda --training.local_batch_size B
        --training.seq_len S --training.steps K --metrics.log_freq 1 --metrics.peak_tflops 989
        --job.print_config false --job.dump_folder TMP
        --parallelism.data_parallel_shard_degree N                      (layout fsdp)
        --parallelism.tensor_parallel_degree 2
        --parallelism.data_parallel_shard_degree N/2                    (layout fsdp_tp, N >= 2)
        [--metrics.comm_report true]      (only when the binary knows that option, see below)

(--launcher env starts the N ranks from this script instead, with the variables torchrun sets —
MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK — for graphtrain's TCP rendezvous, on a
machine without MPI; --launcher auto, the default, takes mpirun when it is installed.)
local_batch_size is per data-parallel rank, so a step is B x S x dp tokens (dp = N for fsdp,
N/2 for fsdp_tp). --accum A > 1 adds --training.global_batch_size B x dp x A: A micro-batches of
B per rank in a step, B x S x dp x A tokens (torch runs A forward + backward passes a step, each
loss divided by A). Step times are rank 0's metrics.jsonl step_seconds (bf16 mixed precision,
synthetic data, AdamW + clipping + schedule, CUDA graph replay: graphtrain's defaults).

PyTorch — one torchrun per run, in every layout graphtrain runs:

    python3 -m torch.distributed.run --standalone --nproc_per_node N bench_multi_gpu.py
        --torch-worker SPEC

Each rank builds transformers LlamaForCausalLM of bench_gpu.py's shape (untied output, llama3 RoPE
scaling, sdpa) on the meta device, wraps every decoder layer in activation checkpointing when
--torch-ac asks (full, or torchtitan's op-level selective policy: auto is selective for 8B, which
does not fit without it, none otherwise), torch.compiles every decoder layer in place
(nn.Module.compile, inductor defaults, caches off; --torch-compile model compiles forward + loss as
one function instead, none not at all), applies FSDP2 fully_shard to every decoder layer and then to the root
with MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32) (reshard after forward, the
default; --torch-reshard false keeps each layer's gathered parameters for its backward),
in layout fsdp_tp first applies torchtitan's llama3 tensor-parallel plan over TP 2 (sequence
parallel: the embedding row-wise with sequence-sharded output, the RMSNorms sequence-parallel,
q/k/v and gate/up column-wise, o and down row-wise back to sequence shards, the output layer
column-wise with vocabulary-sharded logits; apply_torch_tp) and shards FSDP2 over the N/2
data-parallel ranks of the 2-D mesh (a TP pair's ranks draw the same tokens, so a step is
B x S x N/2 tokens as graphtrain's; the cross-entropy is loss_parallel's and not compiled),
materializes its shards on its GPU (random normal 0.02 matrices, ones for the norms; the RoPE
tables recomputed), and trains with torch.optim.AdamW(fused=True) with bench_gpu.py's
hyper-parameters, parameter groups and schedule, clip_grad_norm_(1.0), and B x S random tokens
per rank (so B x S x N tokens per step). The loss is the cross-entropy of the logits cast to fp32
(torch.compiled unless --torch-compile none). One step = tokens, forward + loss, backward, clip,
AdamW, zero_grad; its loss.item() comes after the next step is queued, as graphtrain's trainer
reads a step's loss (bench_common.torch_steps), so a step's time is the time between the host
seeing two steps end, the device's time once the host keeps ahead. NCCL (gloo on the CPU). A
step's time is the slowest rank's.

Reported per (model, layout, N, system): median step time over steps --skip+1..K, tokens/s in
total and per GPU, MFU per GPU (bench_gpu.py's formula: tokens/s per GPU x (6 N_non-embedding +
12 L H Dh S) / --peak-tflops), peak GPU memory (nvidia-smi memory.used of each of the N GPUs
polled while the run lives, minus its value just before the run; the maximum over the GPUs), the
own count (torch: the largest torch.cuda.max_memory_allocated over ranks; graphtrain: its planned
arenas per rank + the 32 MiB cuBLASLt workspace), graphtrain / torch ratios (tokens/s and GPU
memory, against torch FSDP2 at the same N), scaling efficiency (tokens/s per GPU at N / that of
the 1-GPU run of the same system: graphtrain fsdp on 1 GPU, torch on 1 GPU) and, when graphtrain
prints one (--metrics.comm_report, issue 7 item 3), its communication report lines.

--variant NAME=FLAGS (repeatable) also runs graphtrain with FLAGS (whitespace-separated graphtrain
options, e.g. "nographs=--compile.cudagraphs false"; a VAR=VALUE word of an upper-case VAR sets
that environment variable for every rank instead, e.g. "simple=NCCL_PROTO=Simple") after each
graphtrain run, as rows
"graphtrain NAME" compared with the same torch run: an A/B of graphtrain settings side by side in
one call (its scaling efficiency is against the variant's own 1-GPU run, when --gpus has 1).

Every run has --timeout seconds; a run that fails or times out is reported as failed with the
tail of its log (its whole process tree is stopped) and the other runs still go. The JSON is
rewritten after every run.

--device cpu checks this script on a machine without a GPU: graphtrain --training.device cpu
under mpirun, torch FSDP2 over gloo on the CPU, default model test_tiny, batch 2, seq 64.
"""
import datetime
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import bench_common as bc  # shapes, FLOPs, hyper-parameters, schedule: bench/bench_common.py

# bench_gpu.py's shapes plus 8B.
MODELS = {name: bc.SHAPES[name] for name in ("debugmodel", "1B", "test_tiny", "8B")}
LAYOUTS = ("fsdp", "fsdp_tp")
SYSTEMS = ("graphtrain", "torch")
NAMES = {"graphtrain": "graphtrain", "torch": "torch FSDP2"}
TP = 2  # the tensor-parallel degree of layout fsdp_tp


# ---------------------------------------------------------------------------------------------
# PyTorch FSDP2 worker (one process per rank under torchrun; rank 0 prints one JSON line per step
# and a summary line with every rank's step times and memory)


def selective_op_context():
    """context_fn of torchtitan's op-level selective activation checkpointing: inside a layer the
    backward keeps the outputs of every other matmul (the 1st, 3rd, ... of each forward), of the
    attention kernels, of reduce-scatters and of max, and recomputes everything else."""
    import torch
    from functools import partial
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts
    aten = torch.ops.aten
    names = ("_scaled_dot_product_efficient_attention", "_scaled_dot_product_flash_attention",
             "_scaled_dot_product_cudnn_attention", "max")
    keep = {aten.mm.default} | {getattr(aten, n).default for n in names if hasattr(aten, n)}
    if hasattr(torch.ops, "_c10d_functional"):
        keep.add(torch.ops._c10d_functional.reduce_scatter_tensor.default)

    def policy(meta, ctx, func, *args, **kwargs):
        key = "recompute_mm_count" if ctx.is_recompute else "forward_mm_count"
        if func == aten.mm.default:
            meta[key] = meta.get(key, 0) + 1
        save = func in keep and not (func == aten.mm.default and meta[key] % 2 == 0)
        return CheckpointPolicy.MUST_SAVE if save else CheckpointPolicy.PREFER_RECOMPUTE

    def context():
        return create_selective_checkpoint_contexts(partial(policy, {}))
    return context


def apply_torch_tp(model, tp_mesh):
    """torchtitan's llama3 tensor-parallel plan with sequence parallelism on transformers'
    LlamaForCausalLM: the embedding row-wise with its output sharded over the sequence, every
    RMSNorm sequence-parallel, q/k/v and w1/w3 (gate/up) column-wise, o and w2 (down) row-wise back
    to sequence shards, and the output layer column-wise with its logits left sharded over the
    vocabulary for the loss-parallel cross-entropy (torchtitan's default)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput,
                                                   RowwiseParallel, SequenceParallel,
                                                   parallelize_module)
    parallelize_module(model, tp_mesh, {
        "model.embed_tokens": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        "model.norm": SequenceParallel(),
        "lm_head": ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1),
                                   use_local_output=False),
    })
    for layer in model.model.layers:
        parallelize_module(layer, tp_mesh, {
            "input_layernorm": SequenceParallel(),
            "self_attn": PrepareModuleInput(input_kwarg_layouts={"hidden_states": Shard(1)},
                                            desired_input_kwarg_layouts={
                                                "hidden_states": Replicate()},
                                            use_local_output=True),
            "self_attn.q_proj": ColwiseParallel(),
            "self_attn.k_proj": ColwiseParallel(),
            "self_attn.v_proj": ColwiseParallel(),
            "self_attn.o_proj": RowwiseParallel(output_layouts=Shard(1)),
            "post_attention_layernorm": SequenceParallel(),
            "mlp": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(
                Replicate(),), use_local_output=True),
            "mlp.gate_proj": ColwiseParallel(),
            "mlp.up_proj": ColwiseParallel(),
            "mlp.down_proj": RowwiseParallel(output_layouts=Shard(1)),
        })


def torch_worker(spec):
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    import transformers
    from torch.distributed.device_mesh import init_device_mesh
    from transformers import LlamaForCausalLM
    try:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    except ImportError:  # torch < 2.6
        from torch.distributed._composable.fsdp import MixedPrecisionPolicy, fully_shard

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    cuda = spec["device"] == "cuda"
    if cuda:
        dev = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(dev)
        dist.init_process_group("nccl", device_id=dev)
    else:
        dev = torch.device("cpu")
        dist.init_process_group("gloo")
    tp = spec.get("tp", 1)
    if world % tp:
        raise SystemExit(f"{world} ranks are not a multiple of TP {tp}")
    # ranks r = dp_rank x tp + tp_rank: a TP group's ranks are neighbours and see the same tokens
    mesh2 = (init_device_mesh(dev.type, (world // tp, tp), mesh_dim_names=("dp", "tp"))
             if tp > 1 else None)
    mesh = mesh2["dp"] if tp > 1 else init_device_mesh(dev.type, (world,))
    dp_rank = rank // tp
    m = MODELS[spec["model"]]
    cfg = bc.llama_config(m)
    torch.manual_seed(spec["seed"] + rank)

    # Meta first: a full fp32 8B (32 GB) per GPU before sharding would show in the peak memory.
    with torch.device("meta"):
        model = LlamaForCausalLM(cfg)
    model.train()
    if tp > 1:
        apply_torch_tp(model, mesh2["tp"])
    layers = model.model.layers
    if spec["ac"] in ("full", "selective"):
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
            checkpoint_wrapper)
        # full: torchtitan's full activation checkpointing, every layer recomputed;
        # selective: torchtitan's op-level policy (selective_ac_option "op", its 8B default)
        extra = {} if spec["ac"] == "full" else dict(context_fn=selective_op_context())
        for i in range(len(layers)):
            layers[i] = checkpoint_wrapper(layers[i], preserve_rng_state=False, **extra)
    if spec["compile"] == "layer":
        for layer in layers:  # torchtitan's per-block compile; FSDP hooks stay outside the graphs
            layer.compile()
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in layers:
        fully_shard(layer, mesh=mesh, mp_policy=mp,
                    reshard_after_forward=spec.get("reshard", True))
    fully_shard(model, mesh=mesh, mp_policy=mp)
    model.to_empty(device=dev)
    with torch.no_grad():
        for p in model.parameters():  # each rank fills its own shard; values only set the loss
            local = p.to_local() if hasattr(p, "to_local") else p
            if p.ndim >= 2:
                local.normal_(0.0, 0.02)
            else:
                local.fill_(1.0)
    with dev:  # the RoPE tables are non-persistent buffers: to_empty left them uninitialised
        model.model.rotary_emb = type(model.model.rotary_emb)(config=cfg)
    n_params = sum(p.numel() for p in model.parameters())  # DTensor numel is the global size

    groups = bc.adamw_groups(model)
    try:
        opt = torch.optim.AdamW(groups, lr=bc.LR, betas=bc.BETAS, eps=bc.EPS, fused=True)
        fused = True
    except (RuntimeError, ValueError) as e:  # reported in the summary, never silently
        if cuda:
            raise
        print(f"fused AdamW refused on {dev.type}: {e}; using foreach", file=sys.stderr)
        opt = torch.optim.AdamW(groups, lr=bc.LR, betas=bc.BETAS, eps=bc.EPS, foreach=True)
        fused = False
    V = m["vocab"]

    def ce(logits, labels):
        return F.cross_entropy(logits.float().reshape(-1, V), labels.reshape(-1))

    def forward_loss(ids, labels):
        return loss_fn(model(input_ids=ids, use_cache=False).logits, labels)

    def forward_loss_tp(ids, labels):
        # The embedding's output is sequence-sharded, so the model would take its positions from
        # the shard's length: the whole sequence's are passed. The logits stay vocabulary-sharded
        # (a DTensor) for the loss-parallel cross-entropy, whose scalar is replicated.
        pos = torch.arange(ids.shape[1], device=dev).expand(ids.shape[0], -1)
        logits = model(input_ids=ids, position_ids=pos, use_cache=False).logits
        return ce(logits, labels).full_tensor()

    loss_fn = torch.compile(ce) if spec["compile"] == "layer" else ce
    step_fn = torch.compile(forward_loss) if spec["compile"] == "model" else forward_loss
    context = None  # torch_step's forward and backward context
    if tp > 1:  # the loss is not compiled: loss_parallel's sharded cross-entropy is eager
        from torch.distributed.tensor.parallel import loss_parallel
        step_fn, context = forward_loss_tp, loss_parallel
    if cuda:
        torch.cuda.reset_peak_memory_stats(dev)
    steps = spec["steps"]
    gen = torch.Generator(device=dev).manual_seed(spec["seed"] + 1000 + dp_rank)
    times = []

    def one_step(step):
        return bc.torch_step(model, opt, step_fn, gen, dev, (spec["batch"], spec["seq"], V),
                             step, steps, spec.get("accum", 1), context)

    def record(step, seconds, loss_value):
        times.append(seconds)
        if rank == 0:
            print(json.dumps(dict(step=step, step_seconds=seconds, loss=loss_value)), flush=True)

    bc.torch_steps(steps, one_step, record, ahead=cuda)
    mine = dict(step_seconds=times,
                max_memory_allocated=torch.cuda.max_memory_allocated(dev) if cuda else -1,
                max_memory_reserved=torch.cuda.max_memory_reserved(dev) if cuda else -1)
    every = [None] * world
    dist.all_gather_object(every, mine)
    if rank == 0:
        print(json.dumps(dict(
            summary=True, params=n_params, world=world, torch=torch.__version__,
            transformers=transformers.__version__, backend=dist.get_backend(),
            compile=spec["compile"], ac=spec["ac"], adamw_fused=fused, tp=tp,
            device_name=torch.cuda.get_device_name(dev) if cuda else "cpu",
            step_seconds_per_rank=[x["step_seconds"] for x in every],
            max_memory_allocated_per_rank=[x["max_memory_allocated"] for x in every],
            max_memory_reserved_per_rank=[x["max_memory_reserved"] for x in every])), flush=True)
    dist.destroy_process_group()


# ---------------------------------------------------------------------------------------------
# process trees that always end


def session_pids(sid):
    """Processes of session sid (the run's own session: mpirun or torchrun and every rank they
    started, also after a rank lost its parent)."""
    pids = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if int(fields[3]) == sid and fields[0] != "Z":  # after ")": state ppid pgrp sid
                pids.append(int(d))
        except (OSError, IndexError, ValueError):
            continue
    return pids


def stop_session(sid, grace_s=10.0):
    """SIGTERM to every process of session sid (mpirun and torchrun pass it on to their ranks),
    then SIGKILL to whatever is left after grace_s."""
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 0.0)):
        pids = session_pids(sid)
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and session_pids(sid):
            time.sleep(0.2)


def run_tree(cmd, timeout, log_path, env=None):
    """Runs cmd in a new session with stdout+stderr in log_path. On timeout, and after any exit,
    every process left in that session is stopped, so no rank outlives its run (a leftover would
    hold a GPU and shift the next run's memory baseline). Returns (status or None, output); on
    timeout the output is what the run printed before it was stopped (the launchers' own
    tracebacks about the signal would only hide it), and the log file keeps everything."""
    with open(log_path, "w+") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, text=True, env=env,
                                start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            rc = None
        if rc is None:
            log.flush()
            with open(log_path) as f:
                before = f.read()
        stop_session(proc.pid)
        if rc is None:
            proc.wait()
            return None, before
        log.seek(0)
        return rc, log.read()


def spawn_ranks(n, cmd):
    """--launcher env: starts n copies of cmd with the variables torchrun sets (MASTER_ADDR,
    MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE) and waits; the first rank that
    fails stops the others (SIGTERM, SIGKILL 10 s later), as mpirun does. Exits with the first
    non-zero status, else 0."""
    import socket
    with socket.socket() as s:  # a free port for rank 0's rendezvous
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank in range(n):
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                   WORLD_SIZE=str(n), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(n),
                   NCCL_NVLS_ENABLE="0")
        procs.append(subprocess.Popen(cmd, env=env))
    status = 0
    while any(p.poll() is None for p in procs):
        failed = [p.returncode for p in procs if p.returncode not in (None, 0)]
        if failed:
            status = failed[0]
            print(f"bench_multi_gpu: a rank exited with status {status}; stopping the others",
                  file=sys.stderr, flush=True)
            for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 0.0)):
                for p in procs:
                    if p.poll() is None:
                        p.send_signal(sig)
                deadline = time.monotonic() + wait
                while time.monotonic() < deadline and any(p.poll() is None for p in procs):
                    time.sleep(0.2)
            break
        time.sleep(0.2)
    for p in procs:
        p.wait()
        if status == 0 and p.returncode != 0:
            status = p.returncode
    sys.exit(status if status > 0 else 1 if status else 0)


# ---------------------------------------------------------------------------------------------
# runs


def supports_comm_report(graphtrain):
    """Whether the binary knows --metrics.comm_report (issue 7 item 3; may not exist yet)."""
    try:
        with open(graphtrain, "rb") as f:
            return b"comm_report" in f.read()
    except OSError:
        return False


COMM_LINE = re.compile(r"comm|collective|all_gather|reduce_scatter|all_reduce|exposed", re.I)


def comm_report_lines(out):
    """The comm report's lines from a graphtrain log: from the first line that names the comm
    report or exposed communication to the end of that block (format not fixed yet)."""
    lines = out.splitlines()
    for i, line in enumerate(lines):
        if re.search(r"comm(unication)?[ _]report|exposed", line, re.I):
            block = [line]
            for nxt in lines[i + 1:]:
                if not nxt.strip() or not (nxt.startswith(" ") or COMM_LINE.search(nxt)):
                    break
                block.append(nxt)
            return block
    return []


def exposed_ms(lines):
    """Total exposed communication per step in ms, when a report line says "exposed ... X ms"."""
    for line in reversed(lines):
        hit = re.search(r"exposed\D*?([\d.]+)\s*ms", line, re.I)
        if hit:
            return float(hit.group(1))
    return None


def run_graphtrain(args, model, layout, n, log_path, extra=()):
    dump = tempfile.mkdtemp(prefix="bench_multi_gpu_")
    dp = n if layout == "fsdp" else n // TP
    if args.launcher == "mpirun":
        launch = ["mpirun", "-np", str(n), "--allow-run-as-root", "--oversubscribe",
                  "--bind-to", "none", "-x", "NCCL_NVLS_ENABLE=0"]
    else:  # this script starts the ranks with torchrun's variables (graphtrain's TCP rendezvous)
        launch = [sys.executable, os.path.abspath(__file__), "--spawn-ranks", str(n)]
    cmd = launch + [args.graphtrain, "train", "--model.flavor", model,
           "--training.device", args.device, "--training.local_batch_size", str(args.batch),
           "--training.seq_len", str(args.seq), "--training.steps", str(args.steps),
           "--metrics.log_freq", "1", "--metrics.peak_tflops", f"{args.peak_tflops:g}",
           "--job.print_config", "false", "--job.dump_folder", dump]
    if layout == "fsdp_tp":
        cmd += ["--parallelism.tensor_parallel_degree", str(TP)]
    cmd += ["--parallelism.data_parallel_shard_degree", str(dp)]
    if args.accum > 1:
        cmd += ["--training.global_batch_size", str(args.batch * dp * args.accum)]
    if args.comm_report:
        cmd += ["--metrics.comm_report", "true"]
    env = dict(os.environ, NCCL_NVLS_ENABLE="0")
    for word in extra:  # a variant's flags, and environment variables for every rank
        var = re.fullmatch(r"([A-Z_][A-Z0-9_]*)=(.*)", word)
        if not var:
            cmd.append(word)
            continue
        env[var.group(1)] = var.group(2)
        if args.launcher == "mpirun":  # exported to the ranks: mpirun -x VAR
            cmd[len(launch):len(launch)] = ["-x", word]
    with bc.MemoryMonitor(args.gpu_ids(n), args.poll_s) as mon:
        t0 = time.perf_counter()
        rc, out = run_tree(cmd, args.timeout, log_path, env=env)
        wall = time.perf_counter() - t0
    records = bc.read_metrics(os.path.join(dump, "metrics.jsonl"))
    shutil.rmtree(dump, ignore_errors=True)
    comm = comm_report_lines(out)
    r = dict(command=" ".join(cmd), wall_seconds=wall, **mon.result(), dp=dp,
             tokens_per_step=args.batch * args.seq * dp * args.accum,
             step_seconds=[x["step_seconds"] for x in records],
             losses=[x["loss"] for x in records],
             graphtrain_mfu=[x.get("mfu") for x in records],
             comm_report=comm, exposed_comm_ms=exposed_ms(comm))
    p = re.search(r"(\d+) parameters", out)
    r["params"] = int(p.group(1)) if p else -1
    # graphtrain's own account of the time outside the steps (rank 0)
    p = re.search(r"set up in ([\d.]+) s", out)
    r["setup_seconds"] = float(p.group(1)) if p else None
    p = re.search(r"\(graphs ([\d.]+) s, parameters ([\d.]+) s, step programs ([\d.]+) s\)", out)
    r["setup_parts_seconds"] = dict(graphs=float(p.group(1)), parameters=float(p.group(2)),
                                    step_programs=float(p.group(3))) if p else None
    # checkpoints (a variant with --checkpoint.enable true): rank 0's seconds per save, and its
    # parts (GB, state to host, every rank's writes into the file, the tensor hashes, the file hash
    # and publishing)
    saves = re.findall(r"checkpoint: saved step \d+ to \S+ \(([\d.]+) s\): ([\d.]+) GB; before it "
                       r"the state to the host ([\d.]+) s; in it the writes ([\d.]+) s, tensor "
                       r"hashes ([\d.]+) s, file hash and publishing ([\d.]+) s", out)
    r["checkpoint_save_seconds"] = [float(x[0]) for x in saves]
    r["checkpoint_save_parts"] = [dict(zip(("seconds", "gb", "state_to_host", "writes",
                                            "tensor_hashes", "file_hash"), map(float, x)))
                                  for x in saves]
    # asynchronous saves (--checkpoint.async_mode): per save, its seconds from start to publishing,
    # the step after which it was published, GB, the step loop's share (all of it, and the
    # snapshot, and its wait for the snapshot's memory), and the background writes, tensor hashes
    # and the file hash and publishing
    async_saves = re.findall(
        r"checkpoint: saved step (\d+) to \S+ in the background \(([\d.]+) s, published after step "
        r"(\d+)\): ([\d.]+) GB; the step loop spent ([\d.]+) s on it \(the snapshot of the state "
        r"([\d.]+) s, of which waiting for its memory ([\d.]+) s\); the writes ([\d.]+) s, tensor "
        r"hashes ([\d.]+) s, file hash and publishing ([\d.]+) s", out)
    r["checkpoint_async_saves"] = [
        dict(zip(("step", "seconds", "published_after_step", "gb", "step_loop", "snapshot",
                  "snapshot_memory", "writes", "tensor_hashes", "file_hash"), map(float, x)))
        for x in async_saves]
    pinned = re.search(r"checkpoint: the snapshot's ([\d.]+) GB of host memory were pinned while "
                       r"the first step ran \(([\d.]+) s\)", out)
    r["checkpoint_snapshot_pinned"] = dict(gb=float(pinned.group(1)),
                                           seconds=float(pinned.group(2))) if pinned else None
    # the matmul tuning of the first step: shapes timed, shapes from the cache file, host seconds
    tune = re.search(r"matmul tuning: (\d+) shape\(s\) timed their cuBLASLt candidates, (\d+) "
                     r"taken from .*?; ([\d.]+) s", out)
    r["matmul_tuning"] = dict(timed=int(tune.group(1)), cached=int(tune.group(2)),
                              seconds=float(tune.group(3))) if tune else None
    p = re.search(r"finished: parameters to the host ([\d.]+) s, their hash ([\d.]+) s, "
                  r"release ([\d.]+) s", out)
    r["finish_seconds"] = dict(params_to_host=float(p.group(1)), params_hash=float(p.group(2)),
                               release=float(p.group(3))) if p else None
    planned = re.search(r"planned (\d+) bytes", out)  # per rank: "memory per rank ...: planned"
    r["own_peak_bytes"] = int(planned.group(1)) + bc.GT_CUBLASLT_WORKSPACE if planned else -1
    if rc != 0:
        why = f"timed out after {args.timeout:g} s" if rc is None else f"exit status {rc}"
        r["error"] = f"{why}; {len(records)} of {args.steps} steps logged"
        r["log_tail"] = bc.tail(out, args.tail_lines)
    return r


def torch_ac(args, model):
    """Activation checkpointing of the torch peer: auto is selective for 8B (torchtitan's 8B
    default; without checkpointing, 8B's activations at batch 8 x 2048 plus its weights,
    gradients and AdamW state do not fit one H200 even sharded over 4), none otherwise."""
    if args.torch_ac != "auto":
        return args.torch_ac
    return "selective" if model == "8B" else "none"


def run_torch(args, model, layout, n, log_path):
    tp = TP if layout == "fsdp_tp" else 1
    spec = dict(model=model, steps=args.steps, seed=0, batch=args.batch, seq=args.seq,
                accum=args.accum, tp=tp,
                device=args.device, compile=args.torch_compile, ac=torch_ac(args, model),
                reshard=args.torch_reshard == "true")
    env = dict(os.environ, TORCHINDUCTOR_FORCE_DISABLE_CACHES="1", NCCL_NVLS_ENABLE="0")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           "--nproc_per_node", str(n), os.path.abspath(__file__), "--torch-worker",
           json.dumps(spec)]
    with bc.MemoryMonitor(args.gpu_ids(n), args.poll_s) as mon:
        t0 = time.perf_counter()
        rc, out = run_tree(cmd, args.timeout, log_path, env=env)
        wall = time.perf_counter() - t0
    rank0, summary = bc.worker_lines(out)
    per_rank = summary.get("step_seconds_per_rank")
    # A step ends when its slowest rank ends; without the summary (a failed run) rank 0's times.
    steps = ([max(t) for t in zip(*per_rank)] if per_rank
             else [x["step_seconds"] for x in rank0])
    mem = summary.get("max_memory_allocated_per_rank") or [-1]
    r = dict(command=" ".join(cmd[:-1] + [f"'{cmd[-1]}'"]), wall_seconds=wall, **mon.result(),
             dp=n // tp, tp=tp, tokens_per_step=args.batch * args.seq * (n // tp) * args.accum,
             step_seconds=steps,
             step_seconds_per_rank=per_rank, losses_rank0=[x["loss"] for x in rank0],
             params=summary.get("params", -1), own_peak_bytes=max(mem),
             torch_max_memory_allocated_per_rank=mem,
             torch_max_memory_reserved_per_rank=summary.get("max_memory_reserved_per_rank"),
             torch=summary.get("torch"), transformers=summary.get("transformers"),
             backend=summary.get("backend"), compile=args.torch_compile, ac=spec["ac"],
             reshard_after_forward=spec["reshard"],
             device_name=summary.get("device_name"), adamw_fused=summary.get("adamw_fused"))
    if rc != 0 or not summary:
        why = (f"timed out after {args.timeout:g} s" if rc is None
               else f"exit status {rc}" if rc else "no summary line")
        r["error"] = f"{why}; {len(rank0)} of {args.steps} steps done"
        r["log_tail"] = bc.tail(out, args.tail_lines)
    return r


# ---------------------------------------------------------------------------------------------
# report


def summarize(r, args, model, n):
    """Median step time over the timed steps and what follows from it; None when too few ran."""
    if not r:
        return None
    return bc.summarize_steps(r["step_seconds"], args.skip, r["tokens_per_step"],
                              bc.flops_per_token(MODELS[model], args.seq), args.peak_tflops, n)


def key(model, layout, n, system):
    return f"{model}/{layout}/{n}/{system}"


def reference_key(model, system):
    """The 1-GPU run a system's scaling efficiency is measured against."""
    return key(model, "fsdp", 1, system)


def torch_key(model, layout, n):
    return key(model, layout, n, "torch")


def system_name(system, layout="fsdp"):
    """Row label: graphtrain, torch FSDP2 (+ TP in layout fsdp_tp), or "graphtrain NAME" for a
    --variant."""
    base, _, variant = system.partition(":")
    tp = " + TP" if base == "torch" and layout == "fsdp_tp" else ""
    return NAMES[base] + tp + (f" {variant}" if variant else "")


def parse_variants(specs):
    """--variant NAME=FLAGS values as [(name, [flags])]; exits naming a malformed one."""
    out = []
    for spec in specs:
        name, eq, flags = spec.partition("=")
        if not eq or not re.fullmatch(r"[A-Za-z0-9_.-]+", name) or not flags.split():
            sys.exit(f"--variant {spec!r}: expected NAME=FLAGS, NAME of letters, digits, '_', "
                     "'.', '-' and at least one flag")
        if name in (v[0] for v in out):
            sys.exit(f"--variant {name!r} given twice")
        out.append((name, flags.split()))
    return out


def ratio(a, b):
    return f"{a / b:.2f}" if a is not None and b and a > 0 and b > 0 else "–"


def graphtrain_systems(args):
    """graphtrain, then one system per --variant ("graphtrain:NAME"); none without graphtrain."""
    if "graphtrain" not in args.systems:
        return []
    return ["graphtrain"] + [f"graphtrain:{name}" for name, _ in args.variants]


def tables(results, args):
    runs = results["runs"]
    lines = []
    for model in args.models:
        fpt = bc.flops_per_token(MODELS[model], args.seq)
        lines.append(
            f"\n**{model}** — local batch {args.batch} × seq {args.seq} per data-parallel rank"
            f"{f' and micro-batch, {args.accum} micro-batches a step' if args.accum > 1 else ''}, "
            f"{fpt / 1e9:.3f} GFLOP/token (torchtitan), median of steps "
            f"{args.skip + 1}..{args.steps}; torch = FSDP2 `fully_shard` + torch.compile "
            f"({args.torch_compile}), activation checkpointing {torch_ac(args, model)}, "
            f"reshard_after_forward {args.torch_reshard}; torch's fsdp_tp: FSDP2 over the "
            f"data-parallel ranks × TP {TP} (torchtitan's plan: sequence parallel, loss "
            f"parallel, the loss not compiled); graphtrain is compared with torch in the same "
            f"layout\n")
        lines.append("| layout | GPUs | system | step ms (min–max) | tokens/step | tokens/s | "
                     "tokens/s/GPU | MFU/GPU | peak GPU used GiB (max GPU) | own count GiB | "
                     "graphtrain ÷ torch tokens/s | graphtrain ÷ torch GPU used | "
                     "scaling eff. vs 1 GPU | exposed comm ms | first step s |")
        lines.append("|---" * 15 + "|")
        for n in args.gpus:  # at each GPU count and layout: graphtrain, then torch
            torch_rows = ["torch"] if "torch" in args.systems else []
            rows = [(layout, key(model, layout, n, system)) for layout in args.layouts
                    for system in graphtrain_systems(args) + torch_rows]
            for layout, k in rows:
                r = runs.get(k)
                if r is None:
                    continue
                system = k.rsplit("/", 1)[1]
                s = summarize(r, args, model, n)
                if s is None:
                    lines.append(f"| {layout} | {n} | {system_name(system, layout)} | failed: "
                                 f"{r.get('error', 'no timed steps')} " + "| " * 11 + "|")
                    continue
                speed = mem = "–"
                if system.startswith("graphtrain"):  # against torch on the same GPUs, layout
                    th = runs.get(torch_key(model, layout, n))
                    ts = summarize(th, args, model, n)
                    speed = ratio(s["tokens_per_s"], ts and ts["tokens_per_s"])
                    mem = ratio(r.get("gpu_used_peak_bytes"),
                                (th or {}).get("gpu_used_peak_bytes"))
                rs = summarize(runs.get(reference_key(model, system)), args, model, 1)
                eff = ratio(s["tokens_per_s_per_gpu"], rs and rs["tokens_per_s_per_gpu"])
                exp = r.get("exposed_comm_ms")
                name = system_name(system, layout) + (f" (partial: {r['error']})"
                                                      if "error" in r else "")
                lines.append(
                    f"| {layout} | {n} | {name} | {s['step_ms']:.1f} "
                    f"({s['step_ms_min']:.1f}–{s['step_ms_max']:.1f}) | "
                    f"{r['tokens_per_step']:,} | {s['tokens_per_s']:,.0f} | "
                    f"{s['tokens_per_s_per_gpu']:,.0f} | {s['mfu'] * 100:.1f} % | "
                    f"{bc.gib(r.get('gpu_used_peak_bytes'))} | {bc.gib(r.get('own_peak_bytes'))} | "
                    f"{speed} | {mem} | {eff} | {f'{exp:.1f}' if exp is not None else '–'} | "
                    f"{s['first_step_s']:.1f} |")
    lines.append(
        "\nPeak GPU used: memory.used (nvidia-smi) of each GPU of the run, peak minus its idle "
        "value, the largest over the GPUs (CUDA context and torch's cache included). Own count: "
        "max over ranks of torch.cuda.max_memory_allocated; graphtrain's planned arenas per rank "
        "+ 32 MiB cuBLASLt workspace. Scaling efficiency: tokens/s per GPU ÷ that of the same "
        "system's 1-GPU run (graphtrain: fsdp on 1 GPU; a variant: its own). MFU per GPU at "
        f"{args.peak_tflops:g} TFLOP/s.")
    clocks = [(k, r) for k, r in runs.items() if r.get("sm_mhz_busy_median_per_gpu")]
    if clocks:
        lines.append(f"\nUnder load (nvidia-smi samples at ≥ {bc.BUSY_UTIL} % utilization), "
                     "median SM clock MHz / board power W of each GPU of the run:\n")
        for k, r in clocks:
            per = zip(r["sm_mhz_busy_median_per_gpu"], r["power_w_busy_median_per_gpu"],
                      r["busy_samples_per_gpu"])
            lines.append(f"- {k}: " + ", ".join(f"{m:.0f} / {w:.0f} ({c} samples)"
                                               for m, w, c in per))
    for note in results.get("skipped", []):
        lines.append(f"\n{note}")
    for k, r in runs.items():
        if r.get("comm_report"):
            lines.append(f"\n{k}: communication report\n\n```\n"
                         + "\n".join(r["comm_report"]) + "\n```")
    for k, r in runs.items():
        if "error" in r:
            lines.append(f"\n{k} failed ({r['error']}); end of its log:\n\n```\n"
                         f"{r.get('log_tail', '')}\n```")
    return "\n".join(lines)


def main():
    ap = bc.arg_parser(__doc__)
    ap.add_argument("--gpus", default="1,2,4", help="GPU counts (ranks per run)")
    ap.add_argument("--models", help="default 1B,8B (test_tiny with --device cpu)")
    ap.add_argument("--layouts", default=",".join(LAYOUTS), help="fsdp, fsdp_tp (TP 2, N >= 2)")
    ap.add_argument("--systems", default=",".join(SYSTEMS), help="graphtrain, torch")
    ap.add_argument("--variant", action="append", default=[], metavar="NAME=FLAGS",
                    help="also run graphtrain with these extra flags, as rows 'graphtrain NAME' "
                         "(repeatable)")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--skip", type=int, default=4, help="warm-up steps left out of the medians")
    ap.add_argument("--batch", type=int, help="local batch per data-parallel rank (default 8; "
                                              "2 with --device cpu)")
    ap.add_argument("--seq", type=int, help="default 2048 (64 with --device cpu)")
    ap.add_argument("--accum", type=int, default=1,
                    help="micro-batches per step (gradient accumulation), both systems: "
                         "graphtrain's --training.global_batch_size is batch x dp x accum")
    ap.add_argument("--peak-tflops", type=float, default=989.0)
    ap.add_argument("--timeout", type=float, default=600, help="seconds per run")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                    help="cpu checks the script itself (graphtrain on the CPU, torch over gloo)")
    ap.add_argument("--torch-compile", default="layer", choices=("layer", "model", "none"),
                    help="torch.compile per decoder layer (+ the loss), of forward + loss as one "
                         "function, or not at all")
    ap.add_argument("--torch-ac", default="auto", choices=("auto", "none", "full", "selective"),
                    help="activation checkpointing of every torch decoder layer: full, selective "
                         "(torchtitan's op policy) or none (auto: selective for 8B, else none)")
    ap.add_argument("--torch-reshard", default="true", choices=("true", "false"),
                    help="FSDP2 reshard_after_forward of every torch decoder layer (true: "
                         "torchtitan's default, gathered again for the backward)")
    ap.add_argument("--comm-report", default="auto", choices=("auto", "on", "off"),
                    help="pass --metrics.comm_report true to graphtrain (auto: when the binary "
                         "knows the option)")
    ap.add_argument("--launcher", default="auto", choices=("auto", "mpirun", "env"),
                    help="how graphtrain's ranks start: mpirun, or env (this script starts them "
                         "with torchrun's MASTER_ADDR/MASTER_PORT/RANK/WORLD_SIZE/LOCAL_RANK; "
                         "CUDA only: graphtrain's CPU communicator is MPI); auto: mpirun when it "
                         "is installed, else env")
    ap.add_argument("--poll-s", type=float, default=0.1, help="nvidia-smi polling period")
    ap.add_argument("--tail-lines", type=int, default=20, help="log lines kept of a failed run")
    ap.add_argument("--json", help="write every run (all step times) here")
    ap.add_argument("--markdown", help="write the tables here")
    ap.add_argument("--log-dir", help="keep each run's output here")
    args = ap.parse_args()

    cpu = args.device == "cpu"
    args.models = (args.models or ("test_tiny" if cpu else "1B,8B")).split(",")
    args.batch = args.batch or (2 if cpu else 8)
    args.seq = args.seq or (64 if cpu else 2048)
    args.layouts = args.layouts.split(",")
    args.systems = args.systems.split(",")
    try:
        args.gpus = sorted({int(x) for x in args.gpus.split(",")})
    except ValueError:
        sys.exit(f"--gpus {args.gpus!r}: expected counts like 1,2,4")
    bc.require_known("model", args.models, MODELS)
    bc.require_known("layout", args.layouts, LAYOUTS)
    bc.require_known("system", args.systems, SYSTEMS)
    args.variants = parse_variants(args.variant)
    if min(args.gpus) < 1:
        sys.exit("--gpus: every count must be at least 1")
    bc.require_steps(args.steps, args.skip)
    if args.accum < 1:
        sys.exit("--accum must be at least 1")
    if "torch" in args.systems and "fsdp_tp" in args.layouts and args.torch_compile == "model":
        # torch 2.15 fails compiling the FSDP2 + TP forward as one function ("Mixing fake modes")
        sys.exit("--torch-compile model: not with layout fsdp_tp (torch TP compiles per layer: "
                 "use --torch-compile layer or none)")
    if "graphtrain" in args.systems:
        bc.require_executable(args.graphtrain)
        if args.launcher == "auto":
            args.launcher = "mpirun" if shutil.which("mpirun") else "env"
        if args.launcher == "mpirun" and not shutil.which("mpirun"):
            sys.exit("mpirun not found (--launcher env starts graphtrain's ranks without MPI)")
    args.comm_report = (args.comm_report == "on" or args.comm_report == "auto"
                        and supports_comm_report(args.graphtrain))

    n_gpus, gpu_name = None, None
    if not cpu:
        q = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version",
                            "--format=csv,noheader"], capture_output=True, text=True)
        names = q.stdout.strip().splitlines() if q.returncode == 0 else []
        n_gpus, gpu_name = len(names), (f"{len(names)} × {names[0]}" if names else None)
    args.gpu_ids = lambda n: list(range(n)) if n_gpus else None
    log_dir = args.log_dir or tempfile.mkdtemp(prefix="bench_multi_gpu_logs_")
    os.makedirs(log_dir, exist_ok=True)
    results = dict(date=datetime.date.today().isoformat(), gpu=gpu_name, argv=sys.argv,
                   steps=args.steps, skip=args.skip, batch=args.batch, seq=args.seq,
                   accum=args.accum,
                   peak_tflops=args.peak_tflops, models=args.models, gpus=args.gpus,
                   layouts=args.layouts, variants=args.variant, torch_compile=args.torch_compile,
                   comm_report=args.comm_report, launcher=args.launcher, runs={})

    def record(k, r, model, t0):
        results["runs"][k] = r
        bc.check_params(r, MODELS[model])
        n = int(k.split("/")[2])
        s = summarize(r, args, model, n)
        msg = (f"{s['step_ms']:.1f} ms/step, {s['tokens_per_s']:,.0f} tokens/s, "
               f"{s['tokens_per_s_per_gpu']:,.0f}/GPU, MFU {s['mfu'] * 100:.1f} %" if s else "")
        if r.get("setup_seconds") is not None:
            msg += f"; set up {r['setup_seconds']:.1f} s"
        if r.get("setup_parts_seconds"):
            msg += " (" + ", ".join(f"{k} {v:.1f} s" for k, v in r["setup_parts_seconds"].items()) + ")"
        for c in r.get("checkpoint_save_parts") or []:
            msg += (f", checkpoint save {c['seconds']:.1f} s ({c['gb']:.1f} GB; state to the host "
                    f"{c['state_to_host']:.1f} s before it; writes {c['writes']:.1f} s, tensor "
                    f"hashes {c['tensor_hashes']:.1f} s, file hash {c['file_hash']:.1f} s)")
        for c in r.get("checkpoint_async_saves") or []:
            msg += (f", async save of step {c['step']:.0f} {c['seconds']:.1f} s (published after "
                    f"step {c['published_after_step']:.0f}; the step loop {c['step_loop']:.1f} s, "
                    f"the snapshot {c['snapshot']:.1f} s of it; writes {c['writes']:.1f} s)")
        if r.get("matmul_tuning"):
            c = r["matmul_tuning"]
            msg += (f", matmul tuning {c['timed']} timed, {c['cached']} cached "
                    f"({c['seconds']:.1f} s)")
        if r.get("checkpoint_snapshot_pinned"):
            c = r["checkpoint_snapshot_pinned"]
            msg += f", snapshot pinned in the first step ({c['gb']:.1f} GB, {c['seconds']:.1f} s)"
        if r.get("finish_seconds"):
            msg += ", finish " + ", ".join(f"{k} {v:.1f} s" for k, v in r["finish_seconds"].items())
        bc.print_progress(k, msg, r, t0)
        bc.write_json(args.json, results)

    for model in args.models:
        for n in args.gpus:
            if n_gpus is not None and n > n_gpus:
                note = f"{model} on {n} GPUs: skipped, only {n_gpus} GPU(s) here"
                results.setdefault("skipped", []).append(note)
                print(note, flush=True)
                continue
            for layout in args.layouts:
                if layout == "fsdp_tp" and (n < TP or n % TP):
                    continue
                for system in graphtrain_systems(args):
                    k = key(model, layout, n, system)
                    extra = dict(args.variants).get(system.partition(":")[2], [])
                    t0 = time.perf_counter()
                    log = os.path.join(log_dir, re.sub(r"[/:]", "_", k) + ".log")
                    r = run_graphtrain(args, model, layout, n, log, extra)
                    record(k, r, model, t0)
                if "torch" in args.systems:
                    k = torch_key(model, layout, n)
                    t0 = time.perf_counter()
                    log = os.path.join(log_dir, k.replace("/", "_") + ".log")
                    record(k, run_torch(args, model, layout, n, log), model, t0)
    text = tables(results, args)
    print(text)
    bc.write_markdown(args.markdown, results, gpu_name or args.device, text)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--torch-worker":
        torch_worker(json.loads(sys.argv[2]))
    elif len(sys.argv) > 3 and sys.argv[1] == "--spawn-ranks":
        spawn_ranks(int(sys.argv[2]), sys.argv[3:])
    else:
        main()
