#!/usr/bin/env python3
"""Checks bench_multi_gpu.py's torch TP peer (apply_torch_tp) against the unsharded model.

Run on the CPU over gloo, two ranks:

    python3 -m torch.distributed.run --standalone --nproc_per_node 2 bench/check_torch_tp.py

Both ranks build the same fp32 test_tiny LlamaForCausalLM, one copy stays whole, the other gets
the TP plan over the two ranks (sequence parallel, loss parallel); one forward + backward of the
same tokens on each. Exits non-zero when the losses differ by more than 1e-5 relative or a
gradient by more than 1e-6 (fp32 rounding of the split matmuls and reductions is well below).
"""
import copy
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import loss_parallel
from transformers import LlamaForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_common as bc  # noqa: E402
import bench_multi_gpu as bm  # noqa: E402


def main():
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("tp",))
    m = bm.MODELS["test_tiny"]
    V, B, S = m["vocab"], 2, 64
    torch.manual_seed(0)
    ref = LlamaForCausalLM(bc.llama_config(m)).float()
    with torch.no_grad():
        for p in ref.parameters():
            if p.ndim >= 2:
                p.normal_(0.0, 0.02)
    tpm = copy.deepcopy(ref)
    bm.apply_torch_tp(tpm, mesh)
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(0, V, (B, S), generator=g)
    labels = torch.randint(0, V, (B, S), generator=g)

    loss_ref = F.cross_entropy(ref(input_ids=ids, use_cache=False).logits.reshape(-1, V),
                               labels.reshape(-1))
    loss_ref.backward()
    pos = torch.arange(S).expand(B, -1)
    with loss_parallel():
        logits = tpm(input_ids=ids, position_ids=pos, use_cache=False).logits
        loss_tp = F.cross_entropy(logits.reshape(-1, V), labels.reshape(-1)).full_tensor()
        loss_tp.backward()
    worst = 0.0
    for (name, a), b in zip(ref.named_parameters(), tpm.parameters()):
        gb = b.grad.full_tensor() if hasattr(b.grad, "full_tensor") else b.grad
        worst = max(worst, (a.grad - gb).abs().max().item())
    rel = abs(loss_ref.item() - loss_tp.item()) / abs(loss_ref.item())
    ok = rel <= 1e-5 and worst <= 1e-6
    if dist.get_rank() == 0:
        print(f"loss {loss_ref.item():.7f} unsharded, {loss_tp.item():.7f} TP (relative "
              f"difference {rel:.1e}); largest gradient difference {worst:.1e}: "
              f"{'ok' if ok else 'FAILED'}")
    dist.destroy_process_group()
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
