# torchtitan 0.3.0's own llama3 under torch.compile with FlexAttention and its packed-document
# mask (causal within each document, get_attention_masks from per-document positions), on one
# GPU: the peer of graphtrain's --model.attn_mask_type block_causal (issue 43). fp32 parameters,
# bf16 autocast, fused AdamW, clipping; random tokens; document lengths drawn uniformly from
# [LO, HI] (seeded) and packed into each row, positions restarting at 0 at each document, a new
# draw every step as a loader gives. Prints ms/step, tokens/s, MFU (torchtitan's FLOP count, 989
# TFLOP/s peak), peak memory, and the mean document length.
#
# Usage: python3 peer_llama3_docs.py FLAVOR BATCH SEQ eager|compile [LO HI] [causal]
# "causal" drops the document mask (the plain causal FlexAttention step, for the same comparison
# on the peer's side). Needs the torchtitan 0.3.0 wheels as .whl/torchtitan_deepseek_v3.py says
# (pip install --no-deps --target DIR, PYTHONPATH=DIR).
import sys, time, torch, torch.nn.functional as F
import torch.distributed.fsdp as _fsdp  # torchtitan 0.3.0 imports names newer than some torch
for _n in ("DataParallelMeshDims",):
    if not hasattr(_fsdp, _n): setattr(_fsdp, _n, type(_n, (), {}))
from torchtitan.models.llama3 import model_registry
import inspect, torchtitan.models.common.decoder as _dec
from torch.nn.attention.flex_attention import create_block_mask as _cbm
if "separate_full_blocks" not in inspect.signature(_cbm).parameters:
    # torch before the option: it always keeps full blocks apart, what the option's True asks
    _orig = _dec.create_attention_mask
    _dec.create_attention_mask = lambda *a, separate_full_blocks=True, **k: _orig(*a, **k)

flavor, B, S, mode = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
lo, hi = (int(sys.argv[5]), int(sys.argv[6])) if len(sys.argv) > 6 else (2, 1022)
causal_only = "causal" in sys.argv[7:]
cfg = model_registry(flavor).model
torch.manual_seed(0)
with torch.device("cuda"):
    m = cfg.build()
m.init_states()
nparams, fpt = cfg.get_nparams_and_flops(m, S)
opt = torch.optim.AdamW(m.parameters(), lr=1e-4, fused=True)
fwd = torch.compile(m) if mode == "compile" else m
gen = torch.Generator().manual_seed(1)
doc_lens = []


def positions():
    rows = []
    for _ in range(B):
        p, n = [], 0
        while n < S:
            L = min(int(torch.randint(lo, hi + 1, (1,), generator=gen)), S - n)
            p.extend(range(L)); n += L; doc_lens.append(L)
        rows.append(p)
    return torch.tensor(rows, dtype=torch.int64, device="cuda")


def step():
    x = torch.randint(0, cfg.vocab_size, (B, S), device="cuda")
    y = torch.randint(0, cfg.vocab_size, (B * S,), device="cuda")
    pos = positions()
    if causal_only:
        pos = torch.arange(S, device="cuda").expand(B, S).contiguous()
    masks = m.get_attention_masks(pos)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out = fwd(x, pos, masks)
    loss = F.cross_entropy(out.float().flatten(0, 1), y)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
    opt.step(); opt.zero_grad(set_to_none=True)
    return loss


t0 = time.time()
for _ in range(3): step()
torch.cuda.synchronize(); warm = time.time() - t0
torch.cuda.reset_peak_memory_stats()
n = 10; t0 = time.time()
for _ in range(n): l = step()
torch.cuda.synchronize(); dt = (time.time() - t0) / n
tps = B * S / dt
print(f"llama3 {flavor} {mode} {'causal' if causal_only else f'docs U[{lo},{hi}] mean {sum(doc_lens)/len(doc_lens):.0f}'}: "
      f"params {nparams:,} step {dt*1e3:.1f} ms tokens/s {tps:,.0f} MFU {100*tps*fpt/989e12:.1f}% "
      f"peak_mem {torch.cuda.max_memory_allocated()/2**30:.1f} GiB warmup {warm:.0f} s "
      f"loss {l.item():.3f}", flush=True)
