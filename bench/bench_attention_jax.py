"""cuDNN's fused attention through JAX (jax.nn.dot_product_attention, implementation="cudnn"),
bf16, causal, [b, s, heads, d] (sdpa layout 1) with native GQA, at the shapes of
bench_attention.c. Prints the forward time, the forward + backward time, their difference (the
backward), and whether two backward runs on the same inputs gave the same bits. cuDNN's
deterministic backward is the one XLA asks for under XLA_FLAGS=--xla_gpu_deterministic_ops=true:

    python3 bench/bench_attention_jax.py
    XLA_FLAGS=--xla_gpu_deterministic_ops=true python3 bench/bench_attention_jax.py
"""
import os
import time

import jax
import jax.numpy as jnp


def bench(b, hq, hkv, s, d, iters=20):
    kq, kk, kv, kg = jax.random.split(jax.random.PRNGKey(0), 4)
    q = jax.random.normal(kq, (b, s, hq, d), jnp.bfloat16)
    k = jax.random.normal(kk, (b, s, hkv, d), jnp.bfloat16)
    v = jax.random.normal(kv, (b, s, hkv, d), jnp.bfloat16)
    g = jax.random.normal(kg, (b, s, hq, d), jnp.bfloat16).astype(jnp.float32)

    def attention(q, k, v):
        return jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="cudnn")

    def loss(q, k, v):
        return jnp.sum(attention(q, k, v).astype(jnp.float32) * g)

    fwd = jax.jit(attention)
    fwd_bwd = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
    first, second = fwd_bwd(q, k, v), fwd_bwd(q, k, v)
    same = all(bool(jnp.array_equal(a, c)) for a, c in zip(first, second))

    def ms(f):
        for _ in range(3):
            jax.block_until_ready(f(q, k, v))
        t0 = time.perf_counter()
        for _ in range(iters):
            out = f(q, k, v)
        jax.block_until_ready(out)
        return (time.perf_counter() - t0) / iters * 1e3

    tf, tfb = ms(fwd), ms(fwd_bwd)
    print(f"jax cudnn b {b} hq {hq} hkv {hkv} s {s} d {d} causal: fwd {tf:.3f} ms, fwd+bwd "
          f"{tfb:.3f} ms (bwd {tfb - tf:.3f}), backward rerun bitwise: {'yes' if same else 'NO'}; "
          f"XLA_FLAGS={os.environ.get('XLA_FLAGS', '')}")


print("jax", jax.__version__, jax.devices()[0].device_kind)
bench(8, 32, 8, 2048, 64)
bench(8, 16, 16, 2048, 16)
bench(8, 32, 8, 2048, 128)
