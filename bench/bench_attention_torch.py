"""PyTorch's F.scaled_dot_product_attention (flash backend), bf16, causal, at the shapes of
bench_attention.c; same FLOP count (causal half: fwd 4 b h s^2 d / 2, bwd 2.5x)."""
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def bench(b, hq, hkv, s, d, iters=20):
    q = torch.randn(b, hq, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(b, hkv, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(b, hkv, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    g = torch.randn(b, hq, s, d, device="cuda", dtype=torch.bfloat16)

    def fwd():
        # flash has no native GQA here: repeat kv (as torchtitan does); the repeat is cheap
        kk = k.repeat_interleave(hq // hkv, dim=1)
        vv = v.repeat_interleave(hq // hkv, dim=1)
        return F.scaled_dot_product_attention(q, kk, vv, is_causal=True)

    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        for _ in range(3):
            fwd().backward(g)
        torch.cuda.synchronize()
        e = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
        tf = tb = 0.0
        for _ in range(iters):
            e[0].record()
            o = fwd()
            e[1].record()
            o.backward(g)
            e[2].record()
            torch.cuda.synchronize()
            tf += e[0].elapsed_time(e[1])
            tb += e[1].elapsed_time(e[2])
    tf /= iters
    tb /= iters
    flop = 4.0 * b * hq * s * s * d / 2.0
    print(f"torch flash b {b} hq {hq} hkv {hkv} s {s} d {d} causal: fwd {tf:.3f} ms "
          f"{flop / tf * 1e-9:.1f} TFLOP/s, bwd {tb:.3f} ms {2.5 * flop / tb * 1e-9:.1f} TFLOP/s, "
          f"fwd+bwd {tf + tb:.3f} ms {3.5 * flop / (tf + tb) * 1e-9:.1f} TFLOP/s")


print(torch.__version__, torch.cuda.get_device_name())
bench(8, 32, 8, 2048, 64)
bench(8, 16, 16, 2048, 16)
bench(8, 32, 8, 2048, 128)
