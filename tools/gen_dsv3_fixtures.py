#!/usr/bin/env python3
"""Generate the independent DeepSeek-V3 references for graphtrain (issue 36): tests/fixtures/hf_dsv3/.

usage: python3 tools/gen_dsv3_fixtures.py [--out DIR] [--only NAME,...]
       (CPU only, fp32, ~15 s; needs torch, transformers >= 5 and safetensors. Nothing of graphtrain is
       run: the weights are drawn here, seeded, and stored in the fixtures, so the C test loads them.
       The output is byte-reproducible.)
       python3 tools/gen_dsv3_fixtures.py --torchtitan LIB   (optional cross-check of the written
       fixtures against torchtitan 0.3.0's own model code installed under LIB; see check_torchtitan)

Fixtures (one forward + backward each, batch 2 x seq 12 = 24 tokens, fp32, CPU):

  test_dsv3_tiny_sigmoid.safetensors   (a) Hugging Face DeepseekV3ForCausalLM. The test_dsv3_tiny shape
        with sigmoid scores (HF's only scoring): q_lora_rank 0 (wq), n_group 1 / topk_group 1 (no group
        limit), no route norm, route_scale 1, layer 0 dense (n_dense_layers 1), layer 1 MoE, mscale 0.7.
  test_dsv3_qlora.safetensors          (b) Hugging Face DeepseekV3ForCausalLM, 671B-like routing:
        q_lora_rank > 0 (wq_a, q_norm, wq_b), sigmoid, 4 expert groups of which 2 are kept, route_norm
        (norm_topk_prob) true, route_scale (routed_scaling_factor) 2.5, layer 0 dense, layers 1-2 MoE,
        mscale 1.0.
  test_dsv3_tiny.safetensors           (c) the naive plain-torch reference of this script (torchtitan's
        semantics), softmax scores (debugmodel / 16B): HF cannot express softmax routing. Same shape as (a).
  test_dsv3_qlora_force.safetensors    (d) the naive reference on the (b) shape with torchtitan's
        _debug_force_load_balance_routing (--debug.moe_force_load_balance): ids[t, j] = (t*K + j) mod E,
        weights gathered from the scores, then route norm and scale as usual.
  param_counts.json                    parameter counts of the debugmodel, 16B, 236B and 671B shapes
        computed here from the shapes (16B = 15,706,484,224 and 671B = 671,026,404,352 are asserted),
        and torchtitan's active count and MoE FLOP terms (get_moe_model_nparams_and_flops).
  hf_names.json                        the tensor names / shapes and config.json fields that
        DeepseekV3ForCausalLM.save_pretrained writes for the (a) and (b) configs (graphtrain's Hugging
        Face export must match them); --check-export DIR FIXTURE loads graphtrain's export of a
        fixture's weights in transformers and compares its logits with the fixture's.

The test shapes (TINY, QLORA below; every field is in metadata "config") are graphtrain's test flavors
with dim, vocab and the FFN sizes halved so that each file stays near 0.5 MB: dim 32, vocab 128, 4 heads,
qk_nope 16, qk_rope 8, v 16, kv_lora 32 (q_lora 16 in (b)), dense hidden 64, expert hidden 16, 8 experts,
1 shared, top-k 2 (a, c) / 3 (b). Every fixture uses YaRN RoPE as all torchtitan DSv3 flavors (theta 1e4,
factor 40, beta_fast 32, beta_slow 1, original length 4096, truncate): on qk_rope_head_dim 8 the ramp is
low 1, high 3, so pairs hit all three regimes (extrapolation, ramp, interpolation); interleaved pairs
(2j, 2j+1); RMSNorm eps 1e-5; a small positive expert bias (it only selects, never weighs).
Keys (names as in the llama3 fixtures):

    tokens  i64 [b, s]          labels  i64 [b, s] (labels[1, 3] = -100; loss = mean CE over the rest,
                                                    taken from the logits without shifting, as graphtrain)
    logits  f32 [b*s, V]        loss    f32 []
    param.<fqn>   f32           every parameter (fqns below)
    buffer.<fqn>  f32 [E]       layers.N.moe.expert_bias_E of every MoE layer
    grad.<fqn>    f32           d loss / d param, for every parameter
    routing.layers.N  i32 [T, K]  the routed expert ids of MoE layer N, T = b*s in (b, s) order, each row
                                  sorted ascending (order-free comparison)
    rope.inv_freq f32 [rope/2]  the YaRN inverse frequencies used (checked against HF's)
    metadata: config (json: every model field, torchtitan spelling, plus the softmax scale), flavor,
              reference ("hf" or "naive"), fqn_spec (json: these fqns -> the spec's shorter spelling),
              fqn_hf (json: -> HF checkpoint names), weight_seed, routing_margin, checks, versions.

The fqns are torchtitan 0.3.0's (the right-hand side of its deepseek_v3/state_dict_adapter.py):
tok_embeddings.weight, norm.weight, lm_head.weight; layers.N.{attention_norm,ffn_norm}.weight;
layers.N.attention.{wq | wq_a,q_norm,wq_b}.weight; layers.N.attention.{wkv_a,kv_norm,wkv_b,wo}.weight;
dense layers: layers.N.feed_forward.{w1,w2,w3}.weight; MoE layers: layers.N.moe.router.gate.weight [E, D],
layers.N.moe.routed_experts.inner_experts.{w1_EFD [E,F,D], w2_EDF [E,D,F], w3_EFD [E,F,D]},
layers.N.moe.shared_experts.{w1,w2,w3}.weight and the buffer layers.N.moe.expert_bias_E [E].
(/work/briefs/dsv3_spec.md abbreviates three of them: output.weight, moe.experts.w1/w2/w3,
moe.expert_bias; metadata fqn_spec maps them.) HF's per-expert keys mlp.experts.{j}.{gate,up,down}_proj
are stacked into w1/w3/w2 as the state_dict_adapter does (HF 5.x keeps them fused in memory:
gate_up_proj [E, 2F, D] = cat(w1, w3) along F, down_proj [E, D, F] = w2).

HF vs torchtitan differences bridged here (design notes §A): rms_norm_eps 1e-5 (HF default 1e-6), AND
HF builds q_a_layernorm / kv_a_layernorm with a hard-coded eps 1e-6 whatever rms_norm_eps says: the script
sets their variance_epsilon to 1e-5 after construction (torchtitan: every RMSNorm 1e-5); rope_interleave
true; YaRN mscale = mscale_all_dim so HF's attention_factor (cos/sin scale) is 1 and its softmax scale is
torchtitan's qk_head_dim^-0.5 * m^2; tie_word_embeddings false; expert bias positive (HF < 5.x masked
dropped groups with 0, torchtitan with -inf); experts_implementation "eager".

Checks the script makes (it stops on the first failure):
  - HF's YaRN inverse frequencies equal this script's (rtol 1e-6) and all three ramp regimes occur;
    HF's attention_factor is 1 and its softmax scale equals torchtitan's formula;
  - HF eager attention vs HF sdpa agree (<= 1e-5 absolute and of each tensor's max |value|);
  - the naive reference with sigmoid scores equals HF on (a) and (b): same routing ids, logits, loss and
    every gradient within 1e-5 absolute (and 1e-4 of each tensor's max);
  - the naive reference run in float64 agrees with its float32 run (same ids, <= 1e-5), for (c) too;
  - the expert bias (and the group limit in (b)) changes some routing decision, and the YaRN ramp has
    all three regimes, so the fixtures cover them;
  - every routing decision has a margin >= 1e-3 (k-th vs (k+1)-th choice score, and kept vs dropped group
    score) so that fp32 rounding in another implementation cannot flip it; the weights' seed is advanced
    until this holds;
  - each file reads back equal through safetensors' own reader and is < 1 MB;
  - parameter counts of 16B, 671B (and debugmodel 33,014,016) equal torchtitan's.
  - optional (--torchtitan LIB): torchtitan 0.3.0's DeepSeekV3Model loads each fixture's param./buffer.
    tensors under these names and reproduces logits, loss and every gradient (<= 1e-5; measured 1.2e-6
    to 2.8e-6 on 2026-12-06, the softmax fixture (c) included).
"""
import argparse
import json
import math
import os
import sys

import torch
import torch.nn.functional as F
import transformers
from safetensors.torch import load_file

BATCH, SEQ = 2, 12
NORM_EPS = 1e-5
# All torchtitan DSv3 flavors (tt: models/deepseek_v3/__init__.py).
ROPE = dict(theta=10000.0, factor=40.0, beta_fast=32.0, beta_slow=1.0, original_seq_len=4096)
MARGIN = 1e-3  # minimum routing margin (see the checks above)

# Test configs (torchtitan spelling). The C flavors test_dsv3_tiny / test_dsv3_qlora must use these
# shapes (metadata "config" carries them all).
TINY = dict(
    dim=32, n_layers=2, n_dense_layers=1, vocab_size=128, n_heads=4, q_lora_rank=0, kv_lora_rank=32,
    qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, dense_hidden=64, moe_hidden=16,
    num_experts=8, num_shared_experts=1, top_k=2, score_func="softmax", num_expert_groups=None,
    num_limited_groups=None, route_norm=False, route_scale=1.0, mscale=0.70)
QLORA = dict(
    dim=32, n_layers=3, n_dense_layers=1, vocab_size=128, n_heads=4, q_lora_rank=16, kv_lora_rank=32,
    qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, dense_hidden=64, moe_hidden=16,
    num_experts=8, num_shared_experts=1, top_k=3, score_func="sigmoid", num_expert_groups=4,
    num_limited_groups=2, route_norm=True, route_scale=2.5, mscale=1.0)

FIXTURES = {
    # name: (config, reference, first weight seed)
    "test_dsv3_tiny_sigmoid": (dict(TINY, score_func="sigmoid"), "hf", 1000),
    "test_dsv3_qlora": (QLORA, "hf", 2000),
    "test_dsv3_tiny": (TINY, "naive", 3000),
    # --debug.moe_force_load_balance on the test_dsv3_qlora shape (C: that flavor with the option)
    "test_dsv3_qlora_force": (dict(QLORA, force_load_balance=True), "naive", 4000),
}


# ----------------------------------------------------------------------------------------------
# Shapes and fqns


def is_moe(cfg, layer):
    return layer >= cfg["n_dense_layers"]


def param_shapes(cfg):
    """Every parameter of the model, fqn -> shape, in model order (spec fqns)."""
    D, V, H = cfg["dim"], cfg["vocab_size"], cfg["n_heads"]
    qk = cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"]
    E, Fm = cfg["num_experts"], cfg["moe_hidden"]
    shapes = {"tok_embeddings.weight": (V, D)}
    for n in range(cfg["n_layers"]):
        p = f"layers.{n}."
        shapes[p + "attention_norm.weight"] = (D,)
        if cfg["q_lora_rank"] == 0:
            shapes[p + "attention.wq.weight"] = (H * qk, D)
        else:
            shapes[p + "attention.wq_a.weight"] = (cfg["q_lora_rank"], D)
            shapes[p + "attention.q_norm.weight"] = (cfg["q_lora_rank"],)
            shapes[p + "attention.wq_b.weight"] = (H * qk, cfg["q_lora_rank"])
        shapes[p + "attention.wkv_a.weight"] = (cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"], D)
        shapes[p + "attention.kv_norm.weight"] = (cfg["kv_lora_rank"],)
        shapes[p + "attention.wkv_b.weight"] = (
            H * (cfg["qk_nope_head_dim"] + cfg["v_head_dim"]), cfg["kv_lora_rank"])
        shapes[p + "attention.wo.weight"] = (D, H * cfg["v_head_dim"])
        shapes[p + "ffn_norm.weight"] = (D,)
        if not is_moe(cfg, n):
            Fd = cfg["dense_hidden"]
            shapes[p + "feed_forward.w1.weight"] = (Fd, D)
            shapes[p + "feed_forward.w2.weight"] = (D, Fd)
            shapes[p + "feed_forward.w3.weight"] = (Fd, D)
        else:
            Fs = Fm * cfg["num_shared_experts"]
            shapes[p + "moe.router.gate.weight"] = (E, D)
            shapes[p + EXPERTS + "w1_EFD"] = (E, Fm, D)
            shapes[p + EXPERTS + "w2_EDF"] = (E, D, Fm)
            shapes[p + EXPERTS + "w3_EFD"] = (E, Fm, D)
            if cfg["num_shared_experts"] > 0:
                shapes[p + "moe.shared_experts.w1.weight"] = (Fs, D)
                shapes[p + "moe.shared_experts.w2.weight"] = (D, Fs)
                shapes[p + "moe.shared_experts.w3.weight"] = (Fs, D)
    shapes["norm.weight"] = (D,)
    shapes["lm_head.weight"] = (V, D)
    return shapes


EXPERTS = "moe.routed_experts.inner_experts."


def buffer_fqns(cfg):
    return [f"layers.{n}.moe.expert_bias_E" for n in range(cfg["n_layers"]) if is_moe(cfg, n)]


def spec_name(fqn):
    """torchtitan fqn -> the shorter spelling of /work/briefs/dsv3_spec.md (metadata fqn_spec)."""
    if fqn == "lm_head.weight":
        return "output.weight"
    for theirs, ours in ((EXPERTS + "w1_EFD", "moe.experts.w1"), (EXPERTS + "w2_EDF", "moe.experts.w2"),
                         (EXPERTS + "w3_EFD", "moe.experts.w3"), ("moe.expert_bias_E", "moe.expert_bias")):
        if fqn.endswith(theirs):
            return fqn[: -len(theirs)] + ours
    return fqn


HF_LAYER = {
    "attention_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attention.wq.weight": "self_attn.q_proj.weight",
    "attention.wq_a.weight": "self_attn.q_a_proj.weight",
    "attention.q_norm.weight": "self_attn.q_a_layernorm.weight",
    "attention.wq_b.weight": "self_attn.q_b_proj.weight",
    "attention.wkv_a.weight": "self_attn.kv_a_proj_with_mqa.weight",
    "attention.kv_norm.weight": "self_attn.kv_a_layernorm.weight",
    "attention.wkv_b.weight": "self_attn.kv_b_proj.weight",
    "attention.wo.weight": "self_attn.o_proj.weight",
    "feed_forward.w1.weight": "mlp.gate_proj.weight",
    "feed_forward.w2.weight": "mlp.down_proj.weight",
    "feed_forward.w3.weight": "mlp.up_proj.weight",
    "moe.router.gate.weight": "mlp.gate.weight",
    "moe.expert_bias_E": "mlp.gate.e_score_correction_bias",
    "moe.shared_experts.w1.weight": "mlp.shared_experts.gate_proj.weight",
    "moe.shared_experts.w2.weight": "mlp.shared_experts.down_proj.weight",
    "moe.shared_experts.w3.weight": "mlp.shared_experts.up_proj.weight",
    # checkpoint keys per expert j; in memory HF 5.x fuses them (see to_hf_state)
    EXPERTS + "w1_EFD": "mlp.experts.{j}.gate_proj.weight",
    EXPERTS + "w2_EDF": "mlp.experts.{j}.down_proj.weight",
    EXPERTS + "w3_EFD": "mlp.experts.{j}.up_proj.weight",
}


def hf_checkpoint_name(fqn):
    top = {"tok_embeddings.weight": "model.embed_tokens.weight", "norm.weight": "model.norm.weight",
           "lm_head.weight": "lm_head.weight"}
    if fqn in top:
        return top[fqn]
    parts = fqn.split(".")
    return f"model.layers.{parts[1]}." + HF_LAYER[".".join(parts[2:])]


def to_hf_state(cfg, params, buffers):
    """Our tensors -> DeepseekV3ForCausalLM's in-memory state_dict (transformers 5.x: experts fused as
    gate_up_proj [E, 2F, D] = cat(w1, w3) along F, down_proj [E, D, F] = w2)."""
    state = {}
    for fqn, t in list(params.items()) + list(buffers.items()):
        if EXPERTS in fqn:
            continue
        state[hf_checkpoint_name(fqn)] = t
    for n in range(cfg["n_layers"]):
        if is_moe(cfg, n):
            p = f"layers.{n}." + EXPERTS
            state[f"model.layers.{n}.mlp.experts.gate_up_proj"] = torch.cat(
                [params[p + "w1_EFD"], params[p + "w3_EFD"]], dim=1)
            state[f"model.layers.{n}.mlp.experts.down_proj"] = params[p + "w2_EDF"]
    return state


def from_hf_grads(cfg, model, fqns):
    named = dict(model.named_parameters())
    grads = {}
    Fm = cfg["moe_hidden"]
    for fqn in fqns:
        if EXPERTS in fqn:
            n = fqn.split(".")[1]
            w = fqn.rsplit(".", 1)[1][:2]
            if w == "w2":
                g = named[f"model.layers.{n}.mlp.experts.down_proj"].grad
            else:
                gu = named[f"model.layers.{n}.mlp.experts.gate_up_proj"].grad
                g = gu[:, :Fm] if w == "w1" else gu[:, Fm:]
        else:
            g = named[hf_checkpoint_name(fqn)].grad
        assert g is not None, fqn
        grads[fqn] = g.detach().clone().contiguous()
    return grads


# ----------------------------------------------------------------------------------------------
# Weights


def make_weights(cfg, seed):
    """Seeded weights scaled so activations and router scores are O(1) (torchtitan's std 0.02 would
    make every sigmoid score ~0.5 and routing margins tiny); norms 1 + noise so their gradients and
    scales matter; expert bias small and positive."""
    g = torch.Generator().manual_seed(seed)
    params = {}
    for fqn, shape in param_shapes(cfg).items():
        if fqn == "tok_embeddings.weight":
            t = torch.randn(shape, generator=g)
        elif len(shape) == 1:  # RMSNorm weights
            t = 1.0 + 0.1 * torch.randn(shape, generator=g)
        else:
            fan_in = shape[-1]
            gain = 2.0 if fqn.endswith("router.gate.weight") else 1.0
            t = torch.randn(shape, generator=g) * (gain / math.sqrt(fan_in))
        params[fqn] = t.float().contiguous()
    buffers = {b: (0.1 * torch.rand(cfg["num_experts"], generator=g)).float()
               for b in buffer_fqns(cfg)}
    return params, buffers


def make_batch(cfg, seed):
    g = torch.Generator().manual_seed(seed)
    V = cfg["vocab_size"]
    tokens = torch.randint(0, V, (BATCH, SEQ), generator=g, dtype=torch.int64)
    labels = torch.randint(0, V, (BATCH, SEQ), generator=g, dtype=torch.int64)
    labels[1, 3] = -100
    return tokens, labels


# ----------------------------------------------------------------------------------------------
# The naive reference (plain torch, written from torchtitan's semantics; autograd gives gradients)


def yarn_mscale(cfg):
    """m = 0.1 * mscale * ln(factor) + 1 (only with YaRN and factor > 1; every DSv3 flavor has both)."""
    if ROPE["factor"] <= 1.0:
        return 1.0
    return 0.1 * cfg["mscale"] * math.log(ROPE["factor"]) + 1.0


def softmax_scale(cfg):
    qk = cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"]
    return qk ** -0.5 * yarn_mscale(cfg) ** 2


def yarn_inv_freq(d):
    """YaRN inverse frequencies with truncated (floor/ceil) correction range, float64, and the set of
    ramp regimes that occur."""
    theta, orig = ROPE["theta"], ROPE["original_seq_len"]

    def corr(rotations):
        return d * math.log(orig / (2 * math.pi * rotations)) / (2 * math.log(theta))

    low = max(math.floor(corr(ROPE["beta_fast"])), 0)
    high = min(math.ceil(corr(ROPE["beta_slow"])), d - 1)
    if low == high:
        high += 0.001
    out, regimes = [], set()
    for j in range(d // 2):
        base = theta ** (-2.0 * j / d)
        ramp = min(max((j - low) / (high - low), 0.0), 1.0)
        regimes.add("extrapolate" if ramp == 0 else "interpolate" if ramp == 1 else "ramp")
        out.append(base / ROPE["factor"] * ramp + base * (1 - ramp))
    return torch.tensor(out, dtype=torch.float64), regimes


def rms_norm(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + NORM_EPS) * w


def rope_interleaved(x, cos, sin):
    """x [b, s, h, d]: pairs (2j, 2j+1) rotated by angle pos * inv_j; output keeps the interleaved layout."""
    xe, xo = x[..., 0::2], x[..., 1::2]
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    return torch.stack([xe * c - xo * s, xe * s + xo * c], dim=-1).flatten(-2)


def swiglu(x, w1, w2, w3):
    return (F.silu(x @ w1.T) * (x @ w3.T)) @ w2.T


def route(cfg, x, gate, bias):
    """x [T, D] -> ids [T, K] (descending choice score), weights [T, K], and the decision margins."""
    logits = x @ gate.T
    if cfg["score_func"] == "sigmoid":
        scores = torch.sigmoid(logits)
    else:
        scores = torch.softmax(logits, dim=-1)
    choice = scores + bias
    margins = []
    E, K = cfg["num_experts"], cfg["top_k"]
    G = cfg["num_expert_groups"]
    if G is not None and G > 1:
        L = cfg["num_limited_groups"]
        grouped = choice.view(-1, G, E // G)
        gscore = grouped.topk(2, dim=-1).values.sum(-1)  # [T, G]
        gsorted = gscore.sort(dim=-1, descending=True).values
        margins.append((gsorted[:, L - 1] - gsorted[:, L]).min().item())
        keep = torch.zeros_like(gscore, dtype=torch.bool)
        keep.scatter_(1, gscore.topk(L, dim=-1).indices, True)
        choice = grouped.masked_fill(~keep[..., None], float("-inf")).view(-1, E)
    top = choice.topk(K + 1, dim=-1)
    margins.append((top.values[:, K - 1] - top.values[:, K]).min().item())
    ids = top.indices[:, :K]
    if cfg.get("force_load_balance"):
        # torchtitan's _debug_force_load_balance_routing: round robin, no decision to make
        ids = torch.arange(ids.numel(), dtype=torch.int64).reshape(ids.shape) % E
        margins = [float("inf")]
    w = scores.gather(1, ids)
    if cfg["route_norm"]:
        w = w / (w.sum(-1, keepdim=True) + 1e-20)
    w = w * cfg["route_scale"]
    return ids, w, min(margins)


def moe(cfg, x, P, p, bias):
    """torchtitan's MoE: route, stable sort of the flattened ids by expert (rows in (expert, token, k)
    order), per-expert SwiGLU on the gathered rows, weight in f32, scatter-add back, plus shared experts.
    (torchtitan casts the experts to bf16 even in fp32 runs; graphtrain and this reference do not.)"""
    T, D = x.shape
    K = cfg["top_k"]
    ids, w, margin = route(cfg, x, P[p + "router.gate.weight"], bias)
    flat = ids.flatten()
    order = torch.argsort(flat, stable=True)
    token = order // K
    rows = x[token]
    x_ = "routed_experts.inner_experts."
    w1, w2, w3 = P[p + x_ + "w1_EFD"], P[p + x_ + "w2_EDF"], P[p + x_ + "w3_EFD"]
    counts = torch.bincount(flat, minlength=cfg["num_experts"]).tolist()
    outs, start = [], 0
    for e, c in enumerate(counts):
        r = rows[start:start + c]
        outs.append((F.silu(r @ w1[e].T) * (r @ w3[e].T)) @ w2[e].T)
        start += c
    y = torch.cat(outs, dim=0) * w.flatten()[order][:, None]
    routed = torch.zeros_like(x).index_add(0, token, y)
    if cfg["num_shared_experts"] > 0:
        routed = routed + swiglu(x, P[p + "shared_experts.w1.weight"], P[p + "shared_experts.w2.weight"],
                                 P[p + "shared_experts.w3.weight"])
    return routed, ids, margin


def attention(cfg, x, P, p, cos, sin):
    b, s, _ = x.shape
    H = cfg["n_heads"]
    dn, dr, dv = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
    if cfg["q_lora_rank"] == 0:
        q = x @ P[p + "wq.weight"].T
    else:
        q = rms_norm(x @ P[p + "wq_a.weight"].T, P[p + "q_norm.weight"]) @ P[p + "wq_b.weight"].T
    q = q.view(b, s, H, dn + dr)
    q_nope, q_pe = q.split([dn, dr], dim=-1)
    kv = x @ P[p + "wkv_a.weight"].T
    kv, k_pe = kv.split([cfg["kv_lora_rank"], dr], dim=-1)
    q_pe = rope_interleaved(q_pe, cos, sin)
    k_pe = rope_interleaved(k_pe.unsqueeze(2), cos, sin)  # [b, s, 1, dr]
    q = torch.cat([q_nope, q_pe], dim=-1)
    kv = (rms_norm(kv, P[p + "kv_norm.weight"]) @ P[p + "wkv_b.weight"].T).view(b, s, H, dn + dv)
    k_nope, v = kv.split([dn, dv], dim=-1)
    k = torch.cat([k_nope, k_pe.expand(b, s, H, dr)], dim=-1)
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # [b, H, s, .]
    att = (q @ k.transpose(-1, -2)) * softmax_scale(cfg)
    mask = torch.ones(s, s, dtype=torch.bool).triu(1)
    att = torch.softmax(att.masked_fill(mask, float("-inf")), dim=-1)
    out = (att @ v).transpose(1, 2).reshape(b, s, H * dv)
    return out @ P[p + "wo.weight"].T


def naive_forward(cfg, P, B, tokens):
    """Returns logits [b*s, V], routing ids per MoE layer [T, K], the smallest routing margin."""
    b, s = tokens.shape
    dtype = P["tok_embeddings.weight"].dtype
    inv, _ = yarn_inv_freq(cfg["qk_rope_head_dim"])
    ang = torch.arange(s, dtype=torch.float64)[:, None] * inv[None, :]
    cos, sin = ang.cos().to(dtype), ang.sin().to(dtype)
    h = P["tok_embeddings.weight"][tokens]
    routing, margin = {}, float("inf")
    for n in range(cfg["n_layers"]):
        p = f"layers.{n}."
        h = h + attention(cfg, rms_norm(h, P[p + "attention_norm.weight"]), P, p + "attention.", cos, sin)
        x = rms_norm(h, P[p + "ffn_norm.weight"])
        if is_moe(cfg, n):
            y, ids, m = moe(cfg, x.reshape(b * s, -1), P, p + "moe.", B[p + "moe.expert_bias_E"])
            h = h + y.view(b, s, -1)
            routing[n] = ids
            margin = min(margin, m)
        else:
            h = h + swiglu(x, P[p + "feed_forward.w1.weight"], P[p + "feed_forward.w2.weight"],
                           P[p + "feed_forward.w3.weight"])
    logits = rms_norm(h, P["norm.weight"]) @ P["lm_head.weight"].T
    return logits.reshape(b * s, -1), routing, margin


def run_naive(cfg, params, buffers, tokens, labels, dtype):
    P = {k: v.to(dtype).clone().requires_grad_(True) for k, v in params.items()}
    B = {k: v.to(dtype) for k, v in buffers.items()}
    logits, routing, margin = naive_forward(cfg, P, B, tokens)
    loss = F.cross_entropy(logits, labels.reshape(-1), ignore_index=-100)
    loss.backward()
    grads = {k: P[k].grad.detach().float().contiguous() for k in params}
    return dict(logits=logits.detach().float(), loss=loss.detach().float(), grads=grads,
                routing=sorted_routing(routing), margin=margin)


def sorted_routing(routing):
    return {n: ids.sort(dim=-1).values.to(torch.int32).contiguous() for n, ids in routing.items()}


# ----------------------------------------------------------------------------------------------
# Hugging Face


def hf_config(cfg, attn):
    from transformers import DeepseekV3Config
    assert cfg["score_func"] == "sigmoid", "HF DeepseekV3 routes with sigmoid only"
    m = cfg["mscale"]
    hc = DeepseekV3Config(
        vocab_size=cfg["vocab_size"], hidden_size=cfg["dim"], intermediate_size=cfg["dense_hidden"],
        moe_intermediate_size=cfg["moe_hidden"], num_hidden_layers=cfg["n_layers"],
        num_attention_heads=cfg["n_heads"], num_key_value_heads=cfg["n_heads"],
        n_shared_experts=cfg["num_shared_experts"], n_routed_experts=cfg["num_experts"],
        routed_scaling_factor=cfg["route_scale"], kv_lora_rank=cfg["kv_lora_rank"],
        q_lora_rank=cfg["q_lora_rank"] or None, qk_rope_head_dim=cfg["qk_rope_head_dim"],
        v_head_dim=cfg["v_head_dim"], qk_nope_head_dim=cfg["qk_nope_head_dim"],
        n_group=cfg["num_expert_groups"] or 1, topk_group=cfg["num_limited_groups"] or 1,
        num_experts_per_tok=cfg["top_k"], first_k_dense_replace=cfg["n_dense_layers"],
        norm_topk_prob=cfg["route_norm"], hidden_act="silu",
        max_position_embeddings=int(ROPE["original_seq_len"] * ROPE["factor"]),
        rms_norm_eps=NORM_EPS, tie_word_embeddings=False, attention_bias=False, attention_dropout=0.0,
        rope_interleave=True,
        rope_parameters=dict(rope_type="yarn", rope_theta=ROPE["theta"], factor=ROPE["factor"],
                             original_max_position_embeddings=ROPE["original_seq_len"],
                             beta_fast=ROPE["beta_fast"], beta_slow=ROPE["beta_slow"], mscale=m,
                             mscale_all_dim=m, truncate=True),
        experts_implementation="eager")
    hc._attn_implementation = attn
    return hc


def run_hf(cfg, params, buffers, tokens, labels, attn):
    from transformers import DeepseekV3ForCausalLM
    torch.manual_seed(0)  # the constructor's init is overwritten by load_state_dict
    model = DeepseekV3ForCausalLM(hf_config(cfg, attn)).float().eval()
    # HF builds these two norms with its default eps 1e-6 whatever rms_norm_eps says; torchtitan: 1e-5.
    for layer in model.model.layers:
        for norm in (layer.self_attn.kv_a_layernorm, layer.self_attn.q_a_layernorm):
            if norm is not None:
                norm.variance_epsilon = NORM_EPS
    missing, unexpected = model.load_state_dict(to_hf_state(cfg, params, buffers), strict=True)
    assert not missing and not unexpected

    rot = model.model.rotary_emb
    ref, regimes = yarn_inv_freq(cfg["qk_rope_head_dim"])
    assert torch.allclose(rot.inv_freq.double(), ref, rtol=1e-6, atol=0), (rot.inv_freq, ref)
    assert regimes == {"extrapolate", "ramp", "interpolate"}, regimes
    assert rot.attention_scaling == 1.0, rot.attention_scaling
    attn0 = model.model.layers[0].self_attn
    assert abs(attn0.scaling - softmax_scale(cfg)) <= 1e-12 * softmax_scale(cfg), attn0.scaling

    routing = {}

    def hook(n):
        def fn(_mod, _inp, out):
            routing[n] = out[2].detach().clone()
        return fn

    handles = [model.model.layers[n].mlp.gate.register_forward_hook(hook(n))
               for n in range(cfg["n_layers"]) if is_moe(cfg, n)]
    logits = model(input_ids=tokens).logits.reshape(-1, cfg["vocab_size"])
    for h in handles:
        h.remove()
    loss = F.cross_entropy(logits, labels.reshape(-1), ignore_index=-100)
    loss.backward()
    return dict(logits=logits.detach().clone(), loss=loss.detach().clone(),
                grads=from_hf_grads(cfg, model, params), routing=sorted_routing(routing))


# ----------------------------------------------------------------------------------------------
# Comparison and output


def compare(a, b, what, tol, rel):
    """Max abs difference of logits, loss and every gradient (each also within rel of its max |b|);
    routing ids must be equal."""
    assert a["routing"].keys() == b["routing"].keys(), what
    for n in a["routing"]:
        assert torch.equal(a["routing"][n], b["routing"][n]), f"{what}: routing of layer {n} differs"
    worst = 0.0
    pairs = [("logits", a["logits"], b["logits"]), ("loss", a["loss"], b["loss"])]
    pairs += [("grad." + k, a["grads"][k], b["grads"][k]) for k in b["grads"]]
    for name, x, y in pairs:
        d = (x.double() - y.double()).abs().max().item()
        scale = y.double().abs().max().item()
        assert d <= tol and d <= rel * max(scale, 1e-30), \
            f"{what}: {name} differs by {d:.3g} (max |ref| {scale:.3g})"
        worst = max(worst, d)
    return worst


def save_reproducible(path, tensors, metadata):
    """safetensors file whose bytes depend only on its content (as tools/gen_hf_fixtures.py)."""
    dtypes = {torch.float32: "F32", torch.int64: "I64", torch.int32: "I32"}
    header, blobs, offset = {"__metadata__": dict(sorted(metadata.items()))}, [], 0
    for name in sorted(tensors):
        t = tensors[name].detach().contiguous()
        data = t.numpy().tobytes()
        header[name] = {"dtype": dtypes[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(len(text).to_bytes(8, "little"))
        f.write(text)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)


def generate(name, out_dir, write=True):
    """Builds fixture `name` with all its checks; write=False only checks (the naive reference's
    validation against HF)."""
    cfg, reference, seed = FIXTURES[name]
    tokens, labels = make_batch(cfg, seed)
    # Advance the weights' seed until every routing decision has a margin (deterministic).
    for attempt in range(50):
        params, buffers = make_weights(cfg, seed + attempt)
        r32 = run_naive(cfg, params, buffers, tokens, labels, torch.float32)
        if r32["margin"] >= MARGIN:
            break
    else:
        sys.exit(f"{name}: no weight seed with routing margin >= {MARGIN}")
    wseed = seed + attempt
    checks = []

    _, regimes = yarn_inv_freq(cfg["qk_rope_head_dim"])
    assert regimes == {"extrapolate", "ramp", "interpolate"}, regimes
    # Coverage: the expert bias, and the group limit where configured, change some routing decision
    # (with the bias zeroed / groups off, the routing of some token of some MoE layer differs).
    variants = [("expert bias", cfg, {k: torch.zeros_like(v) for k, v in buffers.items()})]
    if cfg.get("force_load_balance"):
        # the round robin ignores scores, bias and groups; every expert gets T·K/E rows
        variants = []
        for n, ids in r32["routing"].items():
            per = torch.bincount(ids.flatten(), minlength=cfg["num_experts"])
            assert (per == ids.numel() // cfg["num_experts"]).all(), per
        checks.append("forced round-robin routing: every expert gets T*K/E rows")
    if cfg["num_expert_groups"] and variants:
        variants.append(("group limit", dict(cfg, num_expert_groups=None), buffers))
    for what, vcfg, vbuf in variants:
        with torch.no_grad():
            _, vr, _ = naive_forward(vcfg, params, vbuf, tokens)
        changed = sum(int((sorted_routing(vr)[n] != r32["routing"][n]).any(-1).sum()) for n in vr)
        assert changed > 0, f"{name}: the {what} changes no routing decision"
        checks.append(f"{what} changes the routing of {changed} token-layers")

    r64 = run_naive(cfg, params, buffers, tokens, labels, torch.float64)
    d = compare(r32, r64, f"{name} naive fp32 vs fp64", 1e-5, 1e-4)
    checks.append(f"naive fp32 vs fp64 max abs diff {d:.3g}, same routing")

    if reference == "hf":
        ref = run_hf(cfg, params, buffers, tokens, labels, "eager")
        sd = run_hf(cfg, params, buffers, tokens, labels, "sdpa")
        d = compare(sd, ref, f"{name} HF eager vs sdpa", 1e-5, 1e-5)
        checks.append(f"HF eager vs sdpa max abs diff {d:.3g}")
        d = compare(r32, ref, f"{name} naive (sigmoid) vs HF", 1e-5, 1e-4)
        checks.append(f"naive (sigmoid) vs HF max abs diff {d:.3g}, same routing")
    else:
        ref = r32

    if not write:
        print(f"{name}: checked ({'; '.join(checks)})")
        return
    inv, _ = yarn_inv_freq(cfg["qk_rope_head_dim"])
    tensors = {"tokens": tokens, "labels": labels, "logits": ref["logits"].contiguous(),
               "loss": ref["loss"].reshape(()), "rope.inv_freq": inv.float()}
    for fqn, w in params.items():
        tensors["param." + fqn] = w
        tensors["grad." + fqn] = ref["grads"][fqn]
    for fqn, b in buffers.items():
        tensors["buffer." + fqn] = b
    for n, ids in ref["routing"].items():
        tensors[f"routing.layers.{n}"] = ids
    full_cfg = dict(cfg, rope_theta=ROPE["theta"], rope_factor=ROPE["factor"],
                    beta_fast=ROPE["beta_fast"], beta_slow=ROPE["beta_slow"],
                    original_seq_len=ROPE["original_seq_len"], rope_scaling="yarn", rope_truncate=True,
                    rope_interleaved=True, norm_eps=NORM_EPS, softmax_scale=softmax_scale(cfg),
                    yarn_m=yarn_mscale(cfg), load_balance_coeff=1e-3, tied_output=False)
    fqns = list(params) + list(buffers)
    meta = {
        "flavor": name, "reference": reference, "config": json.dumps(full_cfg, sort_keys=True),
        "batch": str(BATCH), "seq": str(SEQ), "weight_seed": str(wseed),
        "routing_margin": f"{r32['margin']:.3g}",
        "fqn_spec": json.dumps({k: spec_name(k) for k in fqns}, sort_keys=True),
        "fqn_hf": json.dumps({k: hf_checkpoint_name(k) for k in fqns}, sort_keys=True),
        "checks": "; ".join(checks), "transformers": transformers.__version__,
        "torch": torch.__version__, "generator": "tools/gen_dsv3_fixtures.py",
    }
    os.makedirs(out_dir, exist_ok=True)
    dst = os.path.join(out_dir, f"{name}.safetensors")
    save_reproducible(dst, tensors, meta)
    back = load_file(dst)
    assert sorted(back) == sorted(tensors)
    assert all(torch.equal(back[k], tensors[k]) for k in tensors)
    size = os.path.getsize(dst)
    assert size < 1 << 20, f"{dst}: {size} bytes"
    print(f"{dst}: {reference}, {len(params)} params ({sum(p.numel() for p in params.values())} "
          f"values), loss {ref['loss'].item():.6f}, routing margin {r32['margin']:.3g}, {size} bytes")
    for c in checks:
        print("   ", c)


# ----------------------------------------------------------------------------------------------
# Parameter counts of the real shapes (tt: models/deepseek_v3/__init__.py)

REAL = {
    "debugmodel": dict(dim=256, n_layers=6, n_dense_layers=1, vocab_size=2048, n_heads=16, q_lora_rank=0,
                       kv_lora_rank=512, dense_hidden=1024, moe_hidden=256, num_experts=8,
                       num_shared_experts=2),
    "16B": dict(dim=2048, n_layers=27, n_dense_layers=1, vocab_size=102400, n_heads=16, q_lora_rank=0,
                kv_lora_rank=512, dense_hidden=10944, moe_hidden=1408, num_experts=64,
                num_shared_experts=2),
    "236B": dict(dim=5120, n_layers=60, n_dense_layers=1, vocab_size=102400, n_heads=128,
                 q_lora_rank=1536, kv_lora_rank=512, dense_hidden=12288, moe_hidden=1536,
                 num_experts=160, num_shared_experts=2),
    "671B": dict(dim=7168, n_layers=61, n_dense_layers=3, vocab_size=129280, n_heads=128,
                 q_lora_rank=1536, kv_lora_rank=512, dense_hidden=18432, moe_hidden=2048,
                 num_experts=256, num_shared_experts=1),
}
EXPECTED = {"debugmodel": 33_014_016, "16B": 15_706_484_224, "671B": 671_026_404_352}
# router top_k of each shape (tt: models/deepseek_v3/__init__.py, router_top_k)
TOP_K = {"debugmodel": 3, "16B": 6, "236B": 6, "671B": 8}


def active_params(total, parts, shape_cfg, top_k):
    """torchtitan's get_moe_model_nparams_and_flops (models/utils.py): dense + router + shared experts
    + (all routed experts) * top_k // num_experts; and, for its FLOP count, that minus the embedding
    (untied) and the attention term per token and position, 6 * n_layers * n_heads * (qk + v head dims)."""
    moe_layers = shape_cfg["n_layers"] - shape_cfg["n_dense_layers"]
    experts = moe_layers * parts["routed_experts_per_layer"]
    active = total - experts + experts * top_k // shape_cfg["num_experts"]
    attention = 6 * shape_cfg["n_layers"] * shape_cfg["n_heads"] * (128 + 64 + 128)
    return dict(active=active, active_for_matmul=active - parts["embedding"],
                attention_flops_per_position=attention)


def count_params(shape_cfg):
    """Counts from the formulas, independently of param_shapes (embedding + output untied, no MTP,
    expert_bias is a buffer and not counted)."""
    c = dict(shape_cfg, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128)
    D, V, H, L = c["dim"], c["vocab_size"], c["n_heads"], c["n_layers"]
    qk, qr, kvr = 128 + 64, c["q_lora_rank"], c["kv_lora_rank"]
    q = D * H * qk if qr == 0 else D * qr + qr + qr * H * qk
    mla = q + D * (kvr + 64) + kvr + kvr * H * (128 + 128) + H * 128 * D
    dense = 3 * D * c["dense_hidden"]
    gate = c["num_experts"] * D
    experts = c["num_experts"] * 3 * D * c["moe_hidden"]
    shared = 3 * D * c["moe_hidden"] * c["num_shared_experts"]
    moe = gate + experts + shared
    nd = c["n_dense_layers"]
    total = 2 * V * D + L * (mla + 2 * D) + nd * dense + (L - nd) * moe + D
    parts = dict(embedding=V * D, output=V * D, mla_per_layer=mla, norms_per_layer=2 * D,
                 dense_ffn_per_layer=dense, moe_per_layer=moe, router_gate_per_layer=gate,
                 routed_experts_per_layer=experts, shared_experts_per_layer=shared, final_norm=D)
    # the same count from the per-tensor shapes, as a cross-check of both
    by_shapes = sum(math.prod(s) for s in param_shapes(c).values())
    assert by_shapes == total, (by_shapes, total)
    return total, parts


def write_param_counts(out_dir):
    result = {}
    for flavor, shape_cfg in REAL.items():
        total, parts = count_params(shape_cfg)
        ok = EXPECTED.get(flavor)
        if ok is not None:
            assert total == ok, f"{flavor}: {total:,} != expected {ok:,}"
        print(f"params {flavor}: {total:,}" + (" (expected, ok)" if ok else " (no reference value)"))
        act = active_params(total, parts, shape_cfg, TOP_K[flavor])
        print(f"active {flavor}: {act['active']:,}")
        result[flavor] = dict(total=total, **parts, **act, top_k=TOP_K[flavor], shape=shape_cfg)
    os.makedirs(out_dir, exist_ok=True)
    dst = os.path.join(out_dir, "param_counts.json")
    with open(dst, "w") as f:
        json.dump(result, f, indent=1, sort_keys=True)
        f.write("\n")
    print(f"{dst}")


# ----------------------------------------------------------------------------------------------
# Hugging Face export: what transformers' save_pretrained writes, and a check of graphtrain's export

HF_CONFIG_KEYS = [
    "architectures", "model_type", "vocab_size", "hidden_size", "intermediate_size",
    "moe_intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
    "n_shared_experts", "n_routed_experts", "routed_scaling_factor", "kv_lora_rank", "q_lora_rank",
    "qk_rope_head_dim", "qk_nope_head_dim", "qk_head_dim", "head_dim", "v_head_dim", "n_group",
    "topk_group", "num_experts_per_tok", "first_k_dense_replace", "norm_topk_prob", "hidden_act",
    "rms_norm_eps", "tie_word_embeddings", "attention_bias", "rope_interleave", "rope_parameters",
    "max_position_embeddings"]


def write_hf_names(out_dir):
    """hf_names.json: per HF fixture config, the tensor names and shapes and the config.json fields
    (HF_CONFIG_KEYS) that DeepseekV3ForCausalLM.save_pretrained writes; graphtrain's export must
    write the same names, shapes and values."""
    import tempfile
    from safetensors import safe_open
    from transformers import DeepseekV3ForCausalLM
    result = {}
    for name in ("test_dsv3_tiny_sigmoid", "test_dsv3_qlora"):
        cfg = FIXTURES[name][0]
        torch.manual_seed(0)
        model = DeepseekV3ForCausalLM(hf_config(cfg, "eager"))
        with tempfile.TemporaryDirectory() as d:
            model.save_pretrained(d)
            with safe_open(os.path.join(d, "model.safetensors"), "pt") as f:
                tensors = {k: list(f.get_slice(k).get_shape()) for k in sorted(f.keys())}
            with open(os.path.join(d, "config.json")) as f:
                config = json.load(f)
        result[name] = dict(tensors=tensors, config={k: config[k] for k in HF_CONFIG_KEYS})
        print(f"hf_names {name}: {len(tensors)} tensors")
    dst = os.path.join(out_dir, "hf_names.json")
    with open(dst, "w") as f:
        json.dump(result, f, indent=1, sort_keys=True)
        f.write("\n")
    print(dst)


def check_export(export_dir, fixture):
    """Loads a directory graphtrain exported from fixture's weights (tests/numerics/
    test_dsv3_hf_export.c keeps one with GT_KEEP_EXPORT=DIR) with DeepseekV3ForCausalLM.from_pretrained
    and compares its logits and loss on the fixture's batch with the fixture's (<= 1e-5)."""
    from transformers import DeepseekV3ForCausalLM
    ref = load_file(fixture)
    model = DeepseekV3ForCausalLM.from_pretrained(export_dir, dtype=torch.float32).eval()
    for layer in model.model.layers:  # HF's hard-coded 1e-6 (see the header)
        for norm in (layer.self_attn.kv_a_layernorm, layer.self_attn.q_a_layernorm):
            if norm is not None:
                norm.variance_epsilon = NORM_EPS
    with torch.no_grad():
        logits = model(input_ids=ref["tokens"]).logits.reshape(ref["logits"].shape)
    loss = F.cross_entropy(logits, ref["labels"].reshape(-1), ignore_index=-100)
    d = (logits - ref["logits"]).abs().max().item()
    print(f"{export_dir}: transformers {transformers.__version__} loads it; logits max abs diff "
          f"{d:.3g}, loss {loss.item():.6f} vs the fixture's {ref['loss'].item():.6f}")
    assert d <= 1e-5 and abs(loss.item() - ref["loss"].item()) <= 1e-5


# ----------------------------------------------------------------------------------------------
# Optional: torchtitan's own model code on the written fixtures


def check_torchtitan(out_dir, lib):
    """Loads each fixture's param./buffer. tensors by name (strict) into torchtitan 0.3.0's DeepSeekV3Model
    (installed under `lib` with `pip install --no-deps --target LIB torchtitan==0.3.0 tyro
    spmd_types==0.2.3 einops docstring_parser typeguard shtab`), with the experts kept in fp32 (its
    .bfloat16() casts made no-ops) and the inner FlexAttention swapped for causal SDPA at the model's
    own scale (no CPU backward for Flex), and compares logits, loss and every gradient (<= 1e-5)."""
    sys.path.insert(0, lib)
    from safetensors import safe_open
    from torchtitan.models.common import ComplexRoPE, Embedding, Linear, RMSNorm
    from torchtitan.models.deepseek_v3 import (_LINEAR_INIT, _NORM_INIT, _depth_experts_init,
                                               _depth_init, build_mla_moe_layers)
    from torchtitan.models.deepseek_v3.model import DeepSeekV3Model

    class CausalSDPA(torch.nn.Module):
        def forward(self, q, k, v, *, attention_masks=None, scale=None, **_):
            q, k, v = (t.transpose(1, 2) for t in (q, k, v))
            return F.scaled_dot_product_attention(q, k, v, scale=scale, is_causal=True).transpose(1, 2)

    for name in FIXTURES:
        path = os.path.join(out_dir, f"{name}.safetensors")
        f = safe_open(path, "pt")
        c = json.loads(f.metadata()["config"])
        layers = build_mla_moe_layers(
            n_layers=c["n_layers"], n_dense_layers=c["n_dense_layers"], dim=c["dim"],
            n_heads=c["n_heads"], q_lora_rank=c["q_lora_rank"], kv_lora_rank=c["kv_lora_rank"],
            qk_nope_head_dim=c["qk_nope_head_dim"], qk_rope_head_dim=c["qk_rope_head_dim"],
            v_head_dim=c["v_head_dim"], mscale=c["mscale"], dense_hidden_dim=c["dense_hidden"],
            moe_hidden_dim=c["moe_hidden"], num_experts=c["num_experts"],
            num_shared_experts=c["num_shared_experts"], router_top_k=c["top_k"],
            router_score_func=c["score_func"], router_num_expert_groups=c["num_expert_groups"],
            router_num_limited_groups=c["num_limited_groups"], router_route_scale=c["route_scale"],
            router_route_norm=c["route_norm"], attn_backend="flex", moe_comm_backend="standard",
            non_blocking_capacity_factor=None, linear_init=_LINEAR_INIT, norm_init=_NORM_INIT,
            depth_init=_depth_init, depth_experts_init=_depth_experts_init,
            rope=ComplexRoPE.Config(dim=c["qk_rope_head_dim"], max_seq_len=4 * c["original_seq_len"],
                                    theta=c["rope_theta"], scaling="yarn", rope_factor=c["rope_factor"],
                                    beta_fast=c["beta_fast"], beta_slow=c["beta_slow"],
                                    original_seq_len=c["original_seq_len"]))
        D, V = c["dim"], c["vocab_size"]
        model = DeepSeekV3Model.Config(
            vocab_size=V, dim=D, tok_embeddings=Embedding.Config(num_embeddings=V, embedding_dim=D),
            norm=RMSNorm.Config(normalized_shape=D), lm_head=Linear.Config(in_features=D, out_features=V),
            layers=layers, mtp_layers=[]).build()
        for layer in model.layers.values():
            layer.attention.inner_attention = CausalSDPA()
        state = {k.split(".", 1)[1]: f.get_tensor(k) for k in f.keys()
                 if k.startswith(("param.", "buffer."))}
        missing, unexpected = model.load_state_dict(state, strict=False)
        missing = [m for m in missing if "tokens_per_expert" not in m and "rope.cache" not in m]
        assert not missing and not unexpected, (missing, unexpected)
        tokens, labels = f.get_tensor("tokens"), f.get_tensor("labels")
        to_bf16 = torch.Tensor.bfloat16
        torch.Tensor.bfloat16 = lambda self, *a, **k: self  # fp32 experts, as graphtrain's fp32 runs
        try:
            logits = model(tokens).reshape(-1, V)
        finally:
            torch.Tensor.bfloat16 = to_bf16
        loss = F.cross_entropy(logits, labels.reshape(-1), ignore_index=-100)
        loss.backward()
        worst = max((logits - f.get_tensor("logits")).abs().max().item(),
                    (loss - f.get_tensor("loss")).abs().item())
        for n, prm in model.named_parameters():
            worst = max(worst, (prm.grad - f.get_tensor("grad." + n)).abs().max().item())
        assert worst <= 1e-5, f"{path}: torchtitan differs by {worst:.3g}"
        print(f"{path}: torchtitan 0.3.0 model code agrees, max abs diff {worst:.3g}")


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(root, "tests", "fixtures", "hf_dsv3"))
    ap.add_argument("--only", default=",".join(list(FIXTURES) + ["param_counts", "hf_names"]))
    ap.add_argument("--check-export", nargs=2, metavar=("DIR", "FIXTURE"),
                    help="only check that transformers loads graphtrain's export DIR of FIXTURE's "
                    "weights and reproduces its logits (see check_export)")
    ap.add_argument("--torchtitan", metavar="LIB", help="only check the fixtures in --out against "
                    "torchtitan 0.3.0 installed under LIB (see check_torchtitan)")
    args = ap.parse_args()
    torch.use_deterministic_algorithms(True)
    torch.set_default_dtype(torch.float32)
    torch.set_num_threads(1)  # the same bits on any machine's thread count
    if args.torchtitan:
        check_torchtitan(args.out, args.torchtitan)
        return
    if args.check_export:
        check_export(*args.check_export)
        return
    names = args.only.split(",")
    for name in names:
        if name not in ("param_counts", "hf_names") and name not in FIXTURES:
            sys.exit(f"unknown fixture {name!r} (known: {', '.join(FIXTURES)}, param_counts, "
                     "hf_names)")
    hf = [n for n in FIXTURES if FIXTURES[n][1] == "hf"]
    if any(n in FIXTURES and FIXTURES[n][1] == "naive" for n in names):
        # The naive reference must first match HF (sigmoid configs) before it writes a fixture alone.
        for n in hf:
            generate(n, args.out, write=n in names)
    else:
        for n in hf:
            if n in names:
                generate(n, args.out)
    for name in names:
        if name in FIXTURES and FIXTURES[name][1] == "naive":
            generate(name, args.out)
    if "param_counts" in names:
        write_param_counts(args.out)
    if "hf_names" in names:
        write_hf_names(args.out)


if __name__ == "__main__":
    main()
