#!/usr/bin/env python3
"""Generate the packed-document (block-causal) parity fixtures for graphtrain's llama3
(tests/fixtures/hf_llama3_docs/).

As tools/gen_hf_fixtures.py (same flavors, seed-42 weights from `graphtrain init`, transformers'
LlamaForCausalLM in fp32 on the CPU), but every row of the batch packs several documents:

    positions  i64 [b, s]   restart at 0 at each document start, count up by one inside it
                            (torchtitan's dataloader "positions")

transformers is given the same position_ids (RoPE) and an explicit 4-D additive mask
[b, 1, s, s]: 0 where key j is visible to query i (same document, j <= i), -inf elsewhere; the
documents are counted where positions restart at 0, as torchtitan's get_document_mask_mod does.
The fixture holds tokens, labels, positions, logits, loss, param.<fqn> and grad.<fqn>.

Cross-checks before writing: attn_implementation "eager" and "sdpa" with the 4-D mask agree, and
the forward with PyTorch FlexAttention and torchtitan's document mask_mod (a BlockMask, the
reference's own path) gives the same logits (when FlexAttention runs on this CPU; the metadata
says whether it did).

usage: tools/gen_hf_docs_fixtures.py path/to/graphtrain [--out DIR] [--flavors test_tiny,...]
"""
import argparse
import os
import subprocess
import sys
import tempfile

import torch
import torch.nn.functional as F
import transformers
from safetensors.torch import load_file
from transformers import LlamaForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_hf_fixtures import (BATCH, FLAVORS, SEED, hf_name, make_config,  # noqa: E402
                             max_diff, save_reproducible)

# Document lengths of each row (summing to the flavor's seq): single tokens, short documents, a
# document that is the whole row.
DOCS = {
    16: [[5, 1, 7, 3], [1, 1, 4, 10]],
    19: [[5, 1, 7, 6], [19]],
}


def positions_of(seq):
    rows = []
    for lengths in DOCS[seq]:
        assert sum(lengths) == seq, (lengths, seq)
        rows.append([p for n in lengths for p in range(n)])
    assert len(rows) == BATCH
    return torch.tensor(rows, dtype=torch.int64)


def document_ids(positions):
    """torchtitan's get_document_mask_mod: a document starts where positions == 0."""
    return torch.cumsum((positions == 0).int(), dim=1) - 1


def block_causal_mask(positions):
    """[b, 1, s, s] additive: 0 where visible (same document, key <= query), -inf elsewhere."""
    doc = document_ids(positions)
    s = positions.shape[1]
    causal = torch.tril(torch.ones(s, s, dtype=torch.bool))
    visible = (doc[:, :, None] == doc[:, None, :]) & causal[None]
    mask = torch.zeros(visible.shape, dtype=torch.float32)
    mask[~visible] = float("-inf")
    return mask[:, None]


def flex_block_mask(positions):
    """torchtitan's document mask_mod (and causal) as a FlexAttention BlockMask."""
    from torch.nn.attention.flex_attention import create_block_mask
    doc = document_ids(positions)
    b, s = positions.shape

    def mask_mod(bi, h, q, kv):
        return (doc[bi, q] == doc[bi, kv]) & (q >= kv)

    return create_block_mask(mask_mod, b, None, s, s, device="cpu")


def run_hf(fl, weights, tokens, labels, positions, attn, backward=True):
    torch.manual_seed(0)
    model = LlamaForCausalLM(make_config(fl, attn)).float().eval()
    model.load_state_dict({hf_name(k): v for k, v in weights.items()}, strict=True)
    mask = flex_block_mask(positions) if attn == "flex_attention" else block_causal_mask(positions)
    with torch.set_grad_enabled(backward):  # FlexAttention has no CPU backward
        logits = model(input_ids=tokens, position_ids=positions, attention_mask=mask).logits
    logits = logits.reshape(-1, fl["vocab"])
    loss = F.cross_entropy(logits, labels.reshape(-1), ignore_index=-100)
    grads = {}
    if backward:
        loss.backward()
        named = dict(model.named_parameters())
        for fqn in weights:
            g = named[hf_name(fqn)].grad
            assert g is not None, fqn
            grads[fqn] = g.detach().clone()
    return logits.detach().clone(), loss.detach().clone(), grads


def generate(binary, flavor, out_dir):
    fl = FLAVORS[flavor]
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "init.safetensors")
        subprocess.run([binary, "init", "--model.flavor", flavor, "--debug.seed", str(SEED),
                        "--out", path], check=True)
        weights = load_file(path)
    assert len(weights) == 3 + 9 * fl["layers"], sorted(weights)

    gen = torch.Generator().manual_seed(100 + fl["gen_seed"])
    tokens = torch.randint(0, fl["vocab"], (BATCH, fl["seq"]), generator=gen, dtype=torch.int64)
    labels = torch.randint(0, fl["vocab"], (BATCH, fl["seq"]), generator=gen, dtype=torch.int64)
    labels[0, 2] = -100
    positions = positions_of(fl["seq"])

    logits, loss, grads = run_hf(fl, weights, tokens, labels, positions, "eager")
    s_logits, s_loss, s_grads = run_hf(fl, weights, tokens, labels, positions, "sdpa")
    worst = max([max_diff(logits, s_logits), max_diff(loss, s_loss)] +
                [max_diff(grads[k], s_grads[k]) for k in grads])
    assert worst <= 2e-6, f"{flavor}: eager vs sdpa differ by {worst:.3g}"
    # the mask matters: plain causal attention over the packed row gives other logits
    c_model = LlamaForCausalLM(make_config(fl, "eager")).float().eval()
    c_model.load_state_dict({hf_name(k): v for k, v in weights.items()}, strict=True)
    causal = c_model(input_ids=tokens).logits.reshape(-1, fl["vocab"]).detach()
    assert max_diff(causal, logits) > 1e-3, f"{flavor}: the document mask changed nothing"

    flex = "not run"
    try:
        f_logits, _, _ = run_hf(fl, weights, tokens, labels, positions, "flex_attention",
                                backward=False)
        d = max_diff(f_logits, logits)
        assert d <= 1e-5, f"{flavor}: FlexAttention vs the 4-D mask differ by {d:.3g}"
        flex = f"{d:.3g}"
    except (RuntimeError, ValueError, ImportError, NotImplementedError) as e:
        print(f"{flavor}: FlexAttention did not run on this machine ({type(e).__name__}: "
              f"{str(e).splitlines()[0][:120]})")

    tensors = {"tokens": tokens, "labels": labels, "positions": positions, "logits": logits,
               "loss": loss.reshape(())}
    for fqn, w in weights.items():
        tensors["param." + fqn] = w.contiguous()
        tensors["grad." + fqn] = grads[fqn].contiguous()
    meta = {
        "flavor": flavor, "seed": str(SEED), "batch": str(BATCH), "seq": str(fl["seq"]),
        "documents": str(DOCS[fl["seq"]]), "transformers": transformers.__version__,
        "torch": torch.__version__, "attn_implementation": "eager, explicit 4-D block-causal mask",
        "eager_vs_sdpa_max_abs_diff": f"{worst:.3g}", "flex_attention_logits_max_abs_diff": flex,
        "generator": "tools/gen_hf_docs_fixtures.py",
    }
    os.makedirs(out_dir, exist_ok=True)
    dst = os.path.join(out_dir, f"{flavor}.safetensors")
    save_reproducible(dst, tensors, meta)
    back = load_file(dst)
    assert sorted(back) == sorted(tensors)
    assert all(torch.equal(back[k], tensors[k]) for k in tensors)
    print(f"{dst}: loss {loss.item():.6f}, eager vs sdpa {worst:.3g}, flex {flex}, "
          f"{os.path.getsize(dst)} bytes")


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("graphtrain", help="path to the graphtrain binary (its `init` subcommand)")
    ap.add_argument("--out", default=os.path.join(root, "tests", "fixtures", "hf_llama3_docs"))
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
