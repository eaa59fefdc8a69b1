#!/usr/bin/env python3
"""Generate tests/fixtures/hf_pretrained/: a Hugging Face folder written by transformers' own
`save_pretrained`, for the last acceptance point of issue 41 item 1 (initial_load_in_hf reads a
folder that transformers wrote, not only one graphtrain exported).

The model is a LlamaForCausalLM with graphtrain's llama3 flavor test_tiny (config from
tools/gen_hf_fixtures.py: dim 64, 2 layers, 4 heads, vocab 256, ffn 192, llama3.1 rope scaling with
original context 256, untied output, rms eps 1e-5), fp32, random weights from SEED (norm weights
too, so that a norm loaded wrongly shows). `save_pretrained(max_shard_size=...)` shards it into
exactly 2 safetensors files plus model.safetensors.index.json (asserted).

The batch: BATCH rows of SEQ + 1 token ids (graphtrain's loader window: inputs are a row's first
SEQ ids, labels its last SEQ), written to batch.json with transformers' loss on them: the mean
cross-entropy over all BATCH * SEQ positions, taken from the logits in float64 (the model gets no
labels: it would shift them itself). tests/numerics/test_hf_pretrained_load.c writes the ids as a
GTTOKENS shard of exactly BATCH windows, trains one step from this folder with
--checkpoint.initial_load_in_hf and compares the step-1 loss of metrics.jsonl (1e-5 relative).

usage: tools/gen_hf_pretrained_fixture.py [--out tests/fixtures/hf_pretrained]
"""
import argparse
import glob
import json
import os
import sys

import torch
import torch.nn.functional as F
from transformers import LlamaForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_hf_fixtures import FLAVORS, make_config  # noqa: E402

SEED = 7
BATCH = 2
SEQ = 16
MAX_SHARD = "300KB"  # the model is ~560 kB in fp32: two shards


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "tests",
                                                  "fixtures", "hf_pretrained"))
    args = ap.parse_args()
    torch.manual_seed(SEED)
    cfg = make_config(FLAVORS["test_tiny"], "eager")
    model = LlamaForCausalLM(cfg).to(torch.float32).eval()
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            else:
                p.copy_(0.05 * torch.randn_like(p))
    os.makedirs(args.out, exist_ok=True)
    for old in glob.glob(os.path.join(args.out, "*")):
        os.remove(old)
    model.save_pretrained(args.out, max_shard_size=MAX_SHARD, safe_serialization=True)
    shards = sorted(glob.glob(os.path.join(args.out, "*.safetensors")))
    assert len(shards) == 2, shards
    assert os.path.exists(os.path.join(args.out, "model.safetensors.index.json"))
    # generation_config.json is not needed by graphtrain; keep the folder as transformers wrote it.

    gen = torch.Generator().manual_seed(SEED + 1)
    rows = torch.randint(0, cfg.vocab_size, (BATCH, SEQ + 1), generator=gen)
    inputs, labels = rows[:, :SEQ], rows[:, 1:]
    # reload from the folder: the loss is the saved model's
    back = LlamaForCausalLM.from_pretrained(args.out, torch_dtype=torch.float32).eval()
    back.config._attn_implementation = "eager"
    with torch.no_grad():
        logits = back(input_ids=inputs).logits.double()
    loss = F.cross_entropy(logits.reshape(-1, cfg.vocab_size), labels.reshape(-1)).item()
    with open(os.path.join(args.out, "batch.json"), "w") as f:
        json.dump({"batch": BATCH, "seq_len": SEQ, "tokens": rows.reshape(-1).tolist(),
                   "loss": loss}, f)
        f.write("\n")
    print(f"wrote {args.out}: {[os.path.basename(s) for s in shards]}, loss {loss!r}")


if __name__ == "__main__":
    main()
