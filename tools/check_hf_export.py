#!/usr/bin/env python3
"""Check graphtrain's Hugging Face export against transformers and write its fixtures
(tests/fixtures/hf_export/).

For each flavor (test_gqa, test_odd): `graphtrain init` writes the seed-42 weights; a small C driver
(compiled here from the source tree) exports them with gt_export_hf_llama3_opts three times: f32
in one file, bf16, and f32 cut into several shards (model.safetensors.index.json). Each directory
is loaded with transformers.AutoModelForCausalLM.from_pretrained, and the script asserts:

  - no missing, unexpected or mismatched weights; every loaded weight equals graphtrain's (f32)
    or its bf16 rounding (bf16), bitwise;
  - the config as transformers understood it: sizes, eps, llama3.1-scaled RoPE frequencies
    (checked against the formula in gen_hf_fixtures.llama3_inv_freq), untied embeddings, dtype;
  - the logits on a fixed token batch equal those of a model built directly from
    gen_hf_fixtures.make_config (the parity fixtures' known-good config) — so the exported
    config.json means the same model;
  - the sharded export gives bitwise the same logits as the single file.

The fixture <flavor>.safetensors stores the tokens and transformers' logits for the f32 and the
bf16 export (computed in f32 on the CPU); tests/unit/test_export_hf.c recomputes graphtrain's
logits with the eager executor and requires agreement within 1e-5.

usage: tools/check_hf_export.py [path/to/graphtrain] [--out DIR] [--flavors test_gqa,test_odd]
       (without a binary, graphtrain is built with CMake into build-hf-export/)
"""
import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile

import torch
import transformers
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, LlamaForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_hf_fixtures as hf  # noqa: E402  (name mapping, flavors, config, reproducible writer)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SEED = 42
BATCH = 2
SHARD_BYTES = 200_000  # forces 4-6 shards for the test flavors

# Reads graphtrain's init file, exports it. argv: flavor init.safetensors dir f32|bf16 shard_bytes
DRIVER = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "graphtrain/gt_export.h"
#include "graphtrain/gt_safetensors.h"

int main(int argc, char **argv)
{
    if (argc != 6) {
        fprintf(stderr, "usage: driver FLAVOR INIT DIR f32|bf16 SHARD_BYTES\n");
        return 2;
    }
    gt_error err = {0};
    gt_llama3_config cfg;
    gt_model m = {0};
    gt_safetensors st;
    gt_graph *g = gt_graph_new();
    if (gt_llama3_flavor(argv[1], &cfg, &err) || gt_llama3_build(g, &cfg, &m, &err) ||
        gt_safetensors_open(argv[2], &st, &err)) { fprintf(stderr, "%s\n", err.msg); return 1; }
    gt_tensor *params = calloc((size_t)m.n_params, sizeof *params);
    for (int k = 0; k < m.n_params; k++)
        if (gt_safetensors_get(&st, m.params[k].fqn, &params[k], &err)) {
            fprintf(stderr, "%s\n", err.msg); return 1;
        }
    gt_export_hf_options o = {strcmp(argv[4], "bf16") == 0 ? GT_BF16 : GT_F32,
                              strtoull(argv[5], NULL, 10), -1, -1};
    if (gt_export_hf_llama3_opts(&cfg, &m, params, argv[3], &o, &err)) {
        fprintf(stderr, "%s\n", err.msg); return 1;
    }
    for (int k = 0; k < m.n_params; k++) gt_tensor_free(&params[k]);
    free(params);
    gt_safetensors_close(&st);
    gt_model_free(&m);
    gt_graph_free(g);
    return 0;
}
"""


def build_graphtrain():
    build = os.path.join(ROOT, "build-hf-export")
    subprocess.run(["cmake", "-S", ROOT, "-B", build, "-DCMAKE_BUILD_TYPE=Release"], check=True)
    subprocess.run(["cmake", "--build", build, "--target", "graphtrain", "-j2"], check=True)
    return os.path.join(build, "graphtrain")


def build_driver(tmp, cc):
    src = os.path.join(tmp, "export_driver.c")
    with open(src, "w") as f:
        f.write(DRIVER)
    sources = [s for d in ("core", "ir", "models")
               for s in sorted(glob.glob(f"{ROOT}/src/{d}/*.c"))]
    exe = os.path.join(tmp, "export_driver")
    subprocess.run([cc, "-std=gnu11", "-O2", f"-I{ROOT}/include", f"-I{ROOT}/src", *sources, src,
                    "-o", exe, "-ljansson", "-lxxhash", "-lm"], check=True)
    return exe


def load_export(path, fl, weights, dtype):
    # transformers 5 spells the load dtype `dtype`, 4.x `torch_dtype`.
    key = "dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype"
    model, info = AutoModelForCausalLM.from_pretrained(
        path, attn_implementation="eager", output_loading_info=True, **{key: torch.float32})
    model.eval()
    assert isinstance(model, LlamaForCausalLM), type(model)
    for key in ("missing_keys", "unexpected_keys", "mismatched_keys"):
        assert not info.get(key), (path, key, info[key])

    c = model.config
    hd = fl["dim"] // fl["heads"]
    assert (c.hidden_size, c.intermediate_size, c.num_hidden_layers, c.num_attention_heads,
            c.num_key_value_heads, c.head_dim, c.vocab_size) == (
                fl["dim"], fl["ffn"], fl["layers"], fl["heads"], fl["kv_heads"], hd, fl["vocab"])
    assert c.rms_norm_eps == hf.NORM_EPS and not c.tie_word_embeddings
    with open(os.path.join(path, "config.json")) as f:
        assert json.load(f)["torch_dtype"] == {"f32": "float32", "bf16": "bfloat16"}[dtype]
    ref, regimes = hf.llama3_inv_freq(hd)
    inv = model.model.rotary_emb.inv_freq.double()
    assert torch.allclose(inv, ref, rtol=1e-6, atol=0), (inv, ref)
    assert regimes == {"high", "medium", "low"}, regimes

    state = model.state_dict()
    for fqn, w in weights.items():
        want = w if dtype == "f32" else w.to(torch.bfloat16).float()
        assert torch.equal(state[hf.hf_name(fqn)], want), (path, fqn)
    return model


def check_flavor(graphtrain, driver, flavor, tmp):
    fl = hf.FLAVORS[flavor]
    init = os.path.join(tmp, f"{flavor}.init.safetensors")
    subprocess.run([graphtrain, "init", "--model.flavor", flavor, "--debug.seed", str(SEED),
                    "--out", init], check=True)
    weights = load_file(init)

    gen = torch.Generator().manual_seed(100 + fl["gen_seed"])
    tokens = torch.randint(0, fl["vocab"], (BATCH, fl["seq"]), generator=gen, dtype=torch.int64)

    logits = {}
    for variant, dtype, shard in (("f32", "f32", 0), ("bf16", "bf16", 0),
                                  ("sharded", "f32", SHARD_BYTES)):
        out = os.path.join(tmp, f"{flavor}.{variant}")
        subprocess.run([driver, flavor, init, out, dtype, str(shard)], check=True)
        files = sorted(os.listdir(out))
        if variant == "sharded":
            assert "model.safetensors.index.json" in files and len(files) >= 4, files
        else:
            assert files == ["config.json", "model.safetensors"], files
        model = load_export(out, fl, weights, dtype)
        with torch.no_grad():
            logits[variant] = model(input_ids=tokens).logits.reshape(-1, fl["vocab"]).clone()

    # The known-good model: the parity fixtures' explicit config, weights loaded directly.
    ref = LlamaForCausalLM(hf.make_config(fl, "eager")).float().eval()
    ref.load_state_dict({hf.hf_name(k): v for k, v in weights.items()}, strict=True)
    with torch.no_grad():
        ref_logits = ref(input_ids=tokens).logits.reshape(-1, fl["vocab"])
    diff = (logits["f32"] - ref_logits).abs().max().item()
    assert diff <= 1e-6, f"{flavor}: export vs direct config differ by {diff:.3g}"
    assert torch.equal(logits["sharded"], logits["f32"]), f"{flavor}: sharded export differs"
    bf16_shift = (logits["bf16"] - logits["f32"]).abs().max().item()
    assert bf16_shift > 0, f"{flavor}: bf16 export gave the f32 logits (no rounding?)"
    return tokens, logits, diff, bf16_shift


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("graphtrain", nargs="?", help="path to the graphtrain binary (`init`)")
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "fixtures", "hf_export"))
    ap.add_argument("--flavors", default="test_gqa,test_odd")
    ap.add_argument("--cc", default=os.environ.get("CC", "cc"))
    args = ap.parse_args()

    torch.use_deterministic_algorithms(True)
    torch.set_default_dtype(torch.float32)
    graphtrain = args.graphtrain or build_graphtrain()
    tmp = tempfile.mkdtemp(prefix="hf_export_")
    try:
        driver = build_driver(tmp, args.cc)
        os.makedirs(args.out, exist_ok=True)
        for flavor in args.flavors.split(","):
            if flavor not in hf.FLAVORS:
                sys.exit(f"unknown flavor {flavor!r} (known: {', '.join(hf.FLAVORS)})")
            tokens, logits, diff, shift = check_flavor(graphtrain, driver, flavor, tmp)
            meta = {"flavor": flavor, "seed": str(SEED), "batch": str(BATCH),
                    "seq": str(tokens.shape[1]), "transformers": transformers.__version__,
                    "torch": torch.__version__, "attn_implementation": "eager",
                    "generator": "tools/check_hf_export.py"}
            dst = os.path.join(args.out, f"{flavor}.safetensors")
            hf.save_reproducible(dst, {"tokens": tokens, "logits_f32": logits["f32"],
                                       "logits_bf16": logits["bf16"]}, meta)
            print(f"{dst}: export == direct config within {diff:.3g}, sharded == single, "
                  f"bf16 moves logits by {shift:.3g}, {os.path.getsize(dst)} bytes")
    finally:
        shutil.rmtree(tmp)


if __name__ == "__main__":
    main()
