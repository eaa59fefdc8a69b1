# torch._grouped_mm at DeepSeek-V3 16B's routed-expert shapes, the peer of graphtrain's grouped
# GEMMs (cuda_moe_wgmma.cu; their times come from bench_gpu.py --kernel-times-only on 16B_4layers,
# whose CUPTI table lists gt_k_gm_wgmma / gt_k_gmdw_wgmma per launch).
# Usage: python3 bench/bench_grouped_mm_torch.py [TOKENS] [TOPK] [EXPERTS] [DIM] [HIDDEN]
# Rows are split over the experts as evenly as integers allow (torchtitan at init routes close
# to that); bf16 in, bf16 out, f32 accumulation; median of 50 timed calls after 10 warm-up.
import sys, torch
T, K, E, D, F = ([int(a) for a in sys.argv[1:6]] + [8192, 6, 64, 2048, 1408][len(sys.argv) - 1:])[:5]
R = T * K
sizes = [R // E + (1 if e < R % E else 0) for e in range(E)]
offs = torch.tensor(sizes, device="cuda", dtype=torch.int32).cumsum(0).to(torch.int32)
x = torch.randn(R, D, device="cuda", dtype=torch.bfloat16)
h = torch.randn(R, F, device="cuda", dtype=torch.bfloat16)
w13 = torch.randn(E, F, D, device="cuda", dtype=torch.bfloat16)  # w1_EFD: x w^T
w2 = torch.randn(E, D, F, device="cuda", dtype=torch.bfloat16)   # w2_EDF: h w^T


def timed(fn):
    for _ in range(10):
        fn()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(50)]
    for a, b in ev:
        a.record(); fn(); b.record()
    torch.cuda.synchronize()
    t = sorted(a.elapsed_time(b) for a, b in ev)
    return t[len(t) // 2]


cases = {
    "fwd x[R,D] w1[e]^T -> [R,F]": (lambda: torch._grouped_mm(x, w13.transpose(-2, -1), offs=offs), R * D * F),
    "fwd h[R,F] w2[e]^T -> [R,D]": (lambda: torch._grouped_mm(h, w2.transpose(-2, -1), offs=offs), R * D * F),
    "dx dh[R,F] w1[e] -> [R,D]": (lambda: torch._grouped_mm(h, w13, offs=offs), R * D * F),
    "dw1 dh^T x -> [E,F,D]": (lambda: torch._grouped_mm(h.t(), x, offs=offs), R * D * F),
}
print(f"torch {torch.__version__} {torch.cuda.get_device_name()}: T {T} K {K} E {E} D {D} F {F}")
for name, (fn, macs) in cases.items():
    ms = timed(fn)
    print(f"{name:32s} {ms:8.3f} ms  {2 * macs / ms / 1e9:7.1f} TFLOP/s")
