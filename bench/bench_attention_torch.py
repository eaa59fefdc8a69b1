"""PyTorch's F.scaled_dot_product_attention, bf16, causal, at the shapes of bench_attention.c;
same FLOP count (causal half: fwd 4 b h s^2 d / 2, bwd 2.5x). Backends: flash (default), cudnn,
efficient (python3 bench/bench_attention_torch.py flash,cudnn). Each backend's backward runs twice
on the same inputs and reports whether its gradients came out bitwise equal."""
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

BACKENDS = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION}


def bench(name, b, hq, hkv, s, d, iters=20):
    torch.manual_seed(0)
    q = torch.randn(b, hq, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(b, hkv, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(b, hkv, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    g = torch.randn(b, hq, s, d, device="cuda", dtype=torch.bfloat16)

    def fwd():
        # no native GQA in every backend: repeat kv (as torchtitan does); the repeat is cheap
        kk = k.repeat_interleave(hq // hkv, dim=1)
        vv = v.repeat_interleave(hq // hkv, dim=1)
        return F.scaled_dot_product_attention(q, kk, vv, is_causal=True)

    def grads():
        q.grad = k.grad = v.grad = None
        fwd().backward(g)
        return [t.grad.clone() for t in (q, k, v)]

    try:
        with sdpa_kernel(BACKENDS[name]):
            first = grads()
            same = all(torch.equal(a, b2) for a, b2 in zip(first, grads()))
            for _ in range(2):
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
    except RuntimeError as ex:
        print(f"torch {name} b {b} hq {hq} hkv {hkv} s {s} d {d}: not run ({str(ex)[:120]})")
        return
    tf /= iters
    tb /= iters
    flop = 4.0 * b * hq * s * s * d / 2.0
    print(f"torch {name} b {b} hq {hq} hkv {hkv} s {s} d {d} causal: fwd {tf:.3f} ms "
          f"{flop / tf * 1e-9:.1f} TFLOP/s, bwd {tb:.3f} ms {2.5 * flop / tb * 1e-9:.1f} TFLOP/s, "
          f"fwd+bwd {tf + tb:.3f} ms {3.5 * flop / (tf + tb) * 1e-9:.1f} TFLOP/s, "
          f"backward rerun bitwise: {'yes' if same else 'NO'}")


print(torch.__version__, torch.cuda.get_device_name(), "cudnn", torch.backends.cudnn.version())
for backend in (sys.argv[1] if len(sys.argv) > 1 else "flash").split(","):
    bench(backend, 8, 32, 8, 2048, 64)
    bench(backend, 8, 16, 16, 2048, 16)
    bench(backend, 8, 32, 8, 2048, 128)
