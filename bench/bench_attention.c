/* bench_attention.c — forward and backward time of sdpa on the GPU (bf16 flash path, and the f32
 * tiled path for comparison) at the 1B shape: b 8, hq 32, hkv 8, s 2048, d 64, causal; bf16 shapes
 * in both layouts (0: [b, heads, s, d]; 1: [b, s, heads, d], the one the llama3 step uses).
 * TFLOP/s counts the causal half: forward 4 b h s^2 d / 2, backward 2.5x that. Built with cuDNN,
 * the d 64 and 128 shapes run twice: forward and backward on cuDNN, then on graphtrain's flash
 * kernels. Each bf16 shape then checks that 50 backwards on random inputs give the same bits.
 * Build against the library (see bench/README.md), run on a machine with a CUDA device. */
#include "graphtrain/gt_cuda.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Random q, k, v, dout in [-2, 2), the forward once, then the backward `runs` times: whether dq,
 * dk and dv keep their first run's bits (the timings above run on zeros, whose gradients are all
 * zero, so they cannot tell). */
static int check_bits(gt_cuda_stream *st, gt_kernel_call *f, gt_kernel_call *bw, int runs)
{
    gt_error err = {0};
    const gt_tensor *in[4] = {f->in[0], f->in[1], f->in[2], bw->in[5]};
    uint32_t seed = 12345;
    for (int i = 0; i < 4; i++) {
        size_t n = gt_tensor_nbytes(in[i]) / 2;
        uint16_t *h = malloc(2 * n);
        for (size_t j = 0; j < n; j++) {
            seed = seed * 1664525u + 1013904223u;
            h[j] = gt_f32_to_bf16(4.0f * (float)(seed >> 8) / 16777216.0f - 2.0f);
        }
        gt_cuda_memcpy_h2d(st, in[i]->data, h, 2 * n, &err);
        gt_cuda_stream_sync(st, &err);
        free(h);
    }
    size_t bytes[3], total = 0;
    for (int j = 0; j < 3; j++)
        total += bytes[j] = gt_tensor_nbytes(bw->out[j]);
    char *first = malloc(total), *now = malloc(total);
    int differ = -1;
    if (gt_cuda_run_kernel(f, st, &err) != GT_OK) goto done;
    for (int r = 0; r < runs && differ < 0; r++) {
        if (gt_cuda_run_kernel(bw, st, &err) != GT_OK) goto done;
        char *to = r == 0 ? first : now;
        for (int j = 0, at = 0; j < 3; at += (int)bytes[j], j++)
            gt_cuda_memcpy_d2h(st, to + at, bw->out[j]->data, bytes[j], &err);
        if (gt_cuda_stream_sync(st, &err) != GT_OK) goto done;
        if (r > 0 && memcmp(first, now, total) != 0) differ = r;
    }
    printf("  backward bits over %d runs on random inputs: %s", runs,
           differ < 0 ? "the same\n" : "DIFFER");
    if (differ >= 0) printf(" (run %d)\n", differ);
done:
    free(first);
    free(now);
    if (err.msg[0]) fprintf(stderr, "check: %s\n", err.msg);
    return err.msg[0] || differ >= 0;
}

static int bench(gt_cuda_stream *st, gt_dtype dt, int64_t b, int64_t hq, int64_t hkv, int64_t s,
                 int64_t d, int iters, int layout)
{
    gt_error err = {0};
    const int64_t ls[3] = {b, hq, s};
    int64_t qs[4] = {b, hq, s, d}, ks[4] = {b, hkv, s, d};
    if (layout) qs[1] = s, qs[2] = hq, ks[1] = s, ks[2] = hkv;
    gt_tensor q, k, v, o, lse, g, dq, dk, dv;
    if (gt_cuda_tensor_alloc(&q, dt, 4, qs, &err) || gt_cuda_tensor_alloc(&k, dt, 4, ks, &err) ||
        gt_cuda_tensor_alloc(&v, dt, 4, ks, &err) || gt_cuda_tensor_alloc(&o, dt, 4, qs, &err) ||
        gt_cuda_tensor_alloc(&lse, GT_F32, 3, ls, &err) ||
        gt_cuda_tensor_alloc(&g, dt, 4, qs, &err) || gt_cuda_tensor_alloc(&dq, dt, 4, qs, &err) ||
        gt_cuda_tensor_alloc(&dk, dt, 4, ks, &err) || gt_cuda_tensor_alloc(&dv, dt, 4, ks, &err)) {
        fprintf(stderr, "alloc: %s\n", err.msg);
        return 1;
    }
    /* inputs: zeros are a valid (uniform attention) input; timing does not depend on values */
    gt_tensor *all[] = {&q, &k, &v, &g};
    for (int i = 0; i < 4; i++) {
        size_t n = gt_tensor_nbytes(all[i]);
        void *h = calloc(1, n);
        gt_cuda_memcpy_h2d(st, all[i]->data, h, n, &err);
        gt_cuda_stream_sync(st, &err);
        free(h);
    }
    int64_t ia[2] = {1, layout}; /* causal, layout */
    double fa[1] = {1.0 / sqrt((double)d)};
    gt_kernel_call f = {
        .op = GT_OP_SDPA, .i = ia, .f = fa, .ni = 2, .nf = 1, .n_in = 3, .n_out = 2};
    f.in[0] = &q, f.in[1] = &k, f.in[2] = &v, f.out[0] = &o, f.out[1] = &lse;
    gt_kernel_call bw = {
        .op = GT_OP_SDPA_BACKWARD, .i = ia, .f = fa, .ni = 2, .nf = 1, .n_in = 6, .n_out = 3};
    bw.in[0] = &q, bw.in[1] = &k, bw.in[2] = &v, bw.in[3] = &o, bw.in[4] = &lse, bw.in[5] = &g;
    bw.out[0] = &dq, bw.out[1] = &dk, bw.out[2] = &dv;
    double t[2];
    for (int pass = 0; pass < 2; pass++) {
        gt_kernel_call *c = pass == 0 ? &f : &bw;
        for (int i = 0; i < 2; i++)
            gt_cuda_run_kernel(c, st, &err);
        gt_cuda_stream_sync(st, &err);
        double t0 = now_s();
        for (int i = 0; i < iters; i++)
            if (gt_cuda_run_kernel(c, st, &err) != GT_OK) {
                fprintf(stderr, "run: %s\n", err.msg);
                return 1;
            }
        if (gt_cuda_stream_sync(st, &err) != GT_OK) {
            fprintf(stderr, "sync: %s\n", err.msg);
            return 1;
        }
        t[pass] = (now_s() - t0) / iters;
    }
    double flop = 4.0 * (double)(b * hq) * (double)s * (double)s * (double)d / 2.0;
    printf("sdpa %s layout %d b %lld hq %lld hkv %lld s %lld d %lld causal: fwd %.3f ms %.1f "
           "TFLOP/s, bwd %.3f ms %.1f TFLOP/s, fwd+bwd %.3f ms %.1f TFLOP/s\n",
           dt == GT_BF16 ? "bf16" : "f32", layout, (long long)b, (long long)hq, (long long)hkv,
           (long long)s, (long long)d, 1e3 * t[0], flop / t[0] * 1e-12, 1e3 * t[1],
           2.5 * flop / t[1] * 1e-12, 1e3 * (t[0] + t[1]), 3.5 * flop / (t[0] + t[1]) * 1e-12);
    if (dt == GT_BF16 && check_bits(st, &f, &bw, 50) != 0) return 1;
    gt_tensor *fr[] = {&q, &k, &v, &o, &lse, &g, &dq, &dk, &dv};
    for (int i = 0; i < 9; i++)
        gt_cuda_tensor_free(fr[i]);
    return 0;
}

/* With an argument "1b" or "debugmodel", only that bf16 shape (e.g. to compare builds of the
 * kernels). */
int main(int argc, char **argv)
{
    const char *only = argc > 1 ? argv[1] : "";
    gt_error err = {0};
    gt_cuda_stream *st;
    if (gt_cuda_device_count() == 0 || gt_cuda_init(0, NULL, &err) != GT_OK ||
        gt_cuda_stream_create(&st, &err) != GT_OK) {
        fprintf(stderr, "no CUDA device: %s\n", err.msg);
        return 1;
    }
    int rc = 0;
    /* built with cuDNN: the bf16 sdpa of d 64 and 128 on cuDNN, then on graphtrain's kernels */
    for (int cudnn = gt_cuda_have_cudnn(); cudnn >= 0; cudnn--) {
        gt_cuda_stream_set_cudnn(st, cudnn);
        printf("sdpa of d 64 and 128 on %s\n", cudnn ? "cuDNN" : "graphtrain's flash kernels");
        for (int layout = 0; layout < 2; layout++) {
            if (strcmp(only, "debugmodel") != 0)
                rc |= bench(st, GT_BF16, 8, 32, 8, 2048, 64, 20, layout);
            if (strcmp(only, "1b") != 0 && cudnn == 0) /* debugmodel heads: never cuDNN */
                rc |= bench(st, GT_BF16, 8, 16, 16, 2048, 16, 20, layout);
            if (!*only) rc |= bench(st, GT_BF16, 8, 32, 8, 2048, 128, 10, layout);
        }
    }
    if (!*only) rc |= bench(st, GT_F32, 8, 32, 8, 2048, 64, 2, 0);
    gt_cuda_stream_destroy(st);
    return rc;
}
