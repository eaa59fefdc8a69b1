#!/usr/bin/env python3
"""Generate the Hugging Face parity fixtures for graphtrain's llama3 (tests/fixtures/hf_llama3/).

For each test flavor: `graphtrain init` writes the seed-42 weights; they are loaded, unchanged, into
transformers' LlamaForCausalLM (fp32, CPU); one forward + backward on random tokens gives the
reference logits, loss and gradients, written with the weights to <flavor>.safetensors:

    tokens  i64 [b, s]     labels  i64 [b, s] (one label is -100)
    logits  f32 [b*s, V]   loss    f32 []     (mean cross-entropy, ignore_index -100)
    param.<fqn>, grad.<fqn>                   (graphtrain's fqns, f32)

The model runs with attn_implementation "eager"; the script also runs "sdpa" and asserts both agree.
Labels are NOT given to the model (it would shift them); the loss is taken from the logits as
graphtrain does.

usage: tools/gen_hf_fixtures.py path/to/graphtrain [--out DIR] [--flavors test_tiny,...]
"""
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile

import torch
import torch.nn.functional as F
import transformers
from safetensors.torch import load_file
from transformers import LlamaConfig, LlamaForCausalLM

SEED = 42
BATCH = 2

# The test flavors of src/models/flavors.c (ffn hidden written out; the weights' shapes are checked
# against it). seq: the fixture's sequence length; gen_seed: the token generator's seed.
FLAVORS = {
    "test_tiny": dict(dim=64, layers=2, heads=4, kv_heads=4, vocab=256, ffn=192, seq=16,
                      gen_seed=1),
    "test_gqa": dict(dim=64, layers=2, heads=8, kv_heads=2, vocab=256, ffn=192, seq=16,
                     gen_seed=2),
    "test_odd": dict(dim=72, layers=2, heads=3, kv_heads=3, vocab=301, ffn=249, seq=19,
                     gen_seed=3),
}
# llama3.1 scaling as the real flavors, except the original context: 256 instead of 8192, so that
# the scaling changes the angles measurably within 16-19 positions (src/models/flavors.c).
ROPE = dict(theta=500000.0, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original=256)
NORM_EPS = 1e-5
MAX_POSITION = 131072  # llama3.1 context; unused by a 16-token forward


def hf_name(fqn):
    """graphtrain/torchtitan fqn -> transformers LlamaForCausalLM state_dict name."""
    parts = fqn.split(".")
    if fqn == "tok_embeddings.weight":
        return "model.embed_tokens.weight"
    if fqn == "norm.weight":
        return "model.norm.weight"
    if fqn == "output.weight":
        return "lm_head.weight"
    assert parts[0] == "layers", fqn
    layer, rest = parts[1], ".".join(parts[2:])
    table = {
        "attention.wq.weight": "self_attn.q_proj.weight",
        "attention.wk.weight": "self_attn.k_proj.weight",
        "attention.wv.weight": "self_attn.v_proj.weight",
        "attention.wo.weight": "self_attn.o_proj.weight",
        "attention_norm.weight": "input_layernorm.weight",
        "ffn_norm.weight": "post_attention_layernorm.weight",
        "feed_forward.w1.weight": "mlp.gate_proj.weight",
        "feed_forward.w2.weight": "mlp.down_proj.weight",
        "feed_forward.w3.weight": "mlp.up_proj.weight",
    }
    return f"model.layers.{layer}.{table[rest]}"


def llama3_inv_freq(head_dim):
    """The llama3.1 scaled inverse frequencies, computed here in float64 from the formula, to check
    that transformers really applied the scaling (and that every regime occurs)."""
    lo_wave = ROPE["original"] / ROPE["low_freq_factor"]
    hi_wave = ROPE["original"] / ROPE["high_freq_factor"]
    out, regimes = [], set()
    for j in range(head_dim // 2):
        f = ROPE["theta"] ** (-2.0 * j / head_dim)
        wave = 2 * math.pi / f
        if wave < hi_wave:
            regimes.add("high")
        elif wave > lo_wave:
            f /= ROPE["factor"]
            regimes.add("low")
        else:
            s = (ROPE["original"] / wave - ROPE["low_freq_factor"]) / (
                ROPE["high_freq_factor"] - ROPE["low_freq_factor"])
            f = (1 - s) * f / ROPE["factor"] + s * f
            regimes.add("medium")
        out.append(f)
    return torch.tensor(out, dtype=torch.float64), regimes


def make_config(fl, attn):
    head_dim = fl["dim"] // fl["heads"]
    common = dict(
        hidden_size=fl["dim"], intermediate_size=fl["ffn"], num_hidden_layers=fl["layers"],
        num_attention_heads=fl["heads"], num_key_value_heads=fl["kv_heads"],
        vocab_size=fl["vocab"], rms_norm_eps=NORM_EPS, max_position_embeddings=MAX_POSITION,
        tie_word_embeddings=False, attention_bias=False, mlp_bias=False, head_dim=head_dim,
        hidden_act="silu", attention_dropout=0.0)
    scaling = {"rope_type": "llama3", "factor": ROPE["factor"],
               "low_freq_factor": ROPE["low_freq_factor"],
               "high_freq_factor": ROPE["high_freq_factor"],
               "original_max_position_embeddings": ROPE["original"]}
    # transformers 5 takes rope_parameters (theta inside); 4.x took rope_theta + rope_scaling.
    # Either way run_hf checks the resulting frequencies against llama3_inv_freq.
    if int(transformers.__version__.split(".")[0]) >= 5:
        cfg = LlamaConfig(**common, rope_parameters=dict(scaling, rope_theta=ROPE["theta"]))
    else:  # transformers 4.x spelling
        cfg = LlamaConfig(**common, rope_theta=ROPE["theta"], rope_scaling=scaling)
    cfg._attn_implementation = attn
    return cfg


def run_hf(fl, weights, tokens, labels, attn):
    torch.manual_seed(0)  # the constructor's own init is overwritten by load_state_dict
    model = LlamaForCausalLM(make_config(fl, attn)).float().eval()
    state = {hf_name(k): v for k, v in weights.items()}
    model.load_state_dict(state, strict=True)

    # The rope frequencies transformers uses must be the llama3.1-scaled ones.
    ref, regimes = llama3_inv_freq(fl["dim"] // fl["heads"])
    inv = model.model.rotary_emb.inv_freq.double()
    assert torch.allclose(inv, ref, rtol=1e-6, atol=0), (inv, ref)
    assert regimes == {"high", "medium", "low"}, regimes

    logits = model(input_ids=tokens).logits
    V = fl["vocab"]
    logits = logits.reshape(-1, V)
    loss = F.cross_entropy(logits, labels.reshape(-1), ignore_index=-100)
    loss.backward()
    grads = {}
    named = dict(model.named_parameters())
    for fqn in weights:
        g = named[hf_name(fqn)].grad
        assert g is not None, fqn
        grads[fqn] = g.detach().clone()
    return logits.detach().clone(), loss.detach().clone(), grads


def save_reproducible(path, tensors, metadata):
    """Writes a safetensors file whose bytes depend only on its content: tensors in name order,
    header keys sorted (safetensors' own writer orders the metadata at random), header padded with
    spaces to a multiple of 8 as the format requires."""
    dtypes = {torch.float32: "F32", torch.int64: "I64"}
    header, blobs, offset = {"__metadata__": dict(sorted(metadata.items()))}, [], 0
    for name in sorted(tensors):
        t = tensors[name].detach().contiguous()
        data = t.numpy().tobytes()  # little-endian on every machine this runs on
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


def max_diff(a, b):
    return (a - b).abs().max().item()


def generate(binary, flavor, out_dir):
    fl = FLAVORS[flavor]
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "init.safetensors")
        subprocess.run([binary, "init", "--model.flavor", flavor, "--debug.seed", str(SEED),
                        "--out", path], check=True)
        weights = load_file(path)

    D, V, Fh = fl["dim"], fl["vocab"], fl["ffn"]
    hd = D // fl["heads"]
    assert weights["tok_embeddings.weight"].shape == (V, D)
    assert weights["output.weight"].shape == (V, D)
    assert weights["layers.0.attention.wk.weight"].shape == (fl["kv_heads"] * hd, D)
    assert weights["layers.0.feed_forward.w1.weight"].shape == (Fh, D)
    assert len(weights) == 3 + 9 * fl["layers"], sorted(weights)
    assert all(w.dtype == torch.float32 for w in weights.values())

    gen = torch.Generator().manual_seed(fl["gen_seed"])
    tokens = torch.randint(0, V, (BATCH, fl["seq"]), generator=gen, dtype=torch.int64)
    labels = torch.randint(0, V, (BATCH, fl["seq"]), generator=gen, dtype=torch.int64)
    labels[1, 3] = -100

    logits, loss, grads = run_hf(fl, weights, tokens, labels, "eager")
    s_logits, s_loss, s_grads = run_hf(fl, weights, tokens, labels, "sdpa")
    worst = max([max_diff(logits, s_logits), max_diff(loss, s_loss)] +
                [max_diff(grads[k], s_grads[k]) for k in grads])
    assert worst <= 2e-6, f"{flavor}: eager vs sdpa differ by {worst:.3g}"

    tensors = {"tokens": tokens, "labels": labels, "logits": logits, "loss": loss.reshape(())}
    for fqn, w in weights.items():
        tensors["param." + fqn] = w.contiguous()
        tensors["grad." + fqn] = grads[fqn].contiguous()
    meta = {
        "flavor": flavor, "seed": str(SEED), "batch": str(BATCH), "seq": str(fl["seq"]),
        "transformers": transformers.__version__, "torch": torch.__version__,
        "attn_implementation": "eager", "eager_vs_sdpa_max_abs_diff": f"{worst:.3g}",
        "generator": "tools/gen_hf_fixtures.py",
    }
    os.makedirs(out_dir, exist_ok=True)
    dst = os.path.join(out_dir, f"{flavor}.safetensors")
    save_reproducible(dst, tensors, meta)
    back = load_file(dst)  # the reference reader agrees with what was meant
    assert sorted(back) == sorted(tensors)
    assert all(torch.equal(back[k], tensors[k]) for k in tensors)
    print(f"{dst}: loss {loss.item():.6f}, eager vs sdpa max abs diff {worst:.3g}, "
          f"{os.path.getsize(dst)} bytes")


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("graphtrain", help="path to the graphtrain binary (its `init` subcommand)")
    ap.add_argument("--out", default=os.path.join(root, "tests", "fixtures", "hf_llama3"))
    ap.add_argument("--flavors", default=",".join(FLAVORS))
    args = ap.parse_args()

    torch.use_deterministic_algorithms(True)
    torch.set_default_dtype(torch.float32)
    for flavor in args.flavors.split(","):
        if flavor not in FLAVORS:
            sys.exit(f"unknown flavor {flavor!r} (known: {', '.join(FLAVORS)})")
        generate(args.graphtrain, flavor, args.out)


if __name__ == "__main__":
    main()
