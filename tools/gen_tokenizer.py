#!/usr/bin/env python3
"""Generates the tokenizer fixtures and the tokenizer / token-shard fuzz seeds (commit the output).

    pip install tokenizers          # Hugging Face tokenizers (tested with 0.23)
    python3 tools/gen_tokenizer.py  # (re)writes every file below

Writes, relative to the repository root:
  tests/fixtures/tokenizer/tokenizer.json         byte-level BPE trained on tinyshakespeare with
                                                  llama3's pre-tokenizer regex: vocab 2048 (2043
                                                  merged tokens + 5 llama3-style special tokens),
                                                  post-processor ByteLevel + TemplateProcessing
                                                  (BOS first), as Meta's llama3 tokenizer.json
  tests/fixtures/tokenizer/tokenizer_config.json  bos/eos names, as transformers writes them
  tests/fixtures/tokenizer/gpt2_style.json        a small GPT-2 style tokenizer (ByteLevel with
                                                  add_prefix_space and its own regex, merges in
                                                  the legacy "a b" string form, added tokens with
                                                  lstrip/rstrip/single_word/normalized)
  tests/fixtures/tokenizer/tinyshakespeare.ids.u16le
                                                  HF's ids for the whole of tinyshakespeare.txt
                                                  (encode with add_special_tokens=True), uint16 LE
  tests/fixtures/tokenizer/cases.json             {"cases": [...]} — one record per check:
      name, tokenizer ("tokenizer.json", "gpt2_style.json", "dir:." for the fixture directory
      with its config, or "shared:tokenizer" for ../shared/data/tokenizer), optional "override"
      (dotted tokenizer.json paths → JSON values, applied before loading), "text", mode
      ("encode": HF Tokenizer.encode(text, add_special_tokens=post_process).ids; "document":
      torchtitan's HuggingFaceTokenizer.encode(text, add_bos=True, add_eos=True)), "ids", and
      "decoded" (HF decode(ids, skip_special_tokens=False) as UTF-8, when it round-trips).
  tests/fuzz/corpus/tokenizer_json/*              valid and malformed tokenizer.json seeds
  tests/fuzz/corpus/token_shard/*                 valid and malformed GTTOKENS shards, written
                                                  here with an independent (pure Python) xxh64

The torchtitan test tokenizer (../shared/data/tokenizer) is read with the same logic as
torchtitan's HuggingFaceTokenizer: tokenizer.json, then every special token named in
tokenizer_config.json added as a special AddedToken, BOS/EOS inserted by the wrapper.
"""
import copy
import json
import os
import struct
import sys

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors
from tokenizers import trainers

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.path.join(os.path.dirname(ROOT), "shared")
FIX = os.path.join(ROOT, "tests", "fixtures", "tokenizer")
FUZZ_TOK = os.path.join(ROOT, "tests", "fuzz", "corpus", "tokenizer_json")
FUZZ_SHARD = os.path.join(ROOT, "tests", "fuzz", "corpus", "token_shard")

# Meta's llama3 pre-tokenizer regex (tokenizer.json of Llama-3.x).
LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
    r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
SPECIALS = [
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
]

UNICODE_TEXTS = [
    "Café déjà vu, naïve façade — Ærøskøbing, Straße, İstanbul, ÀÉÎÕÜ.",
    "Emoji: 😀 👍🏽 👨‍👩‍👧‍👦 🇫🇷 ❤️ ✨🚀 (ok)",
    "中文：我爱自然语言处理。日本語のテキスト、カタカナ。한국어 문장입니다.",
    "العربية: مرحبا بالعالم. हिन्दी: नमस्ते दुनिया। ไทย: สวัสดี",
    "Whitespace:\ttab\r\nCRLF\u00a0nbsp\u3000ideographic\u2028ls\u0085nel\u180emvs  two  \n\n\n end",
    "Numbers 1234567 3.14159 ٣٤٥ ²³ ⅻ 0x1F and I'LL don't it’s WE'RE you've 'd",
    "Punctuation!!! ...??? «quoted» “curly” (parens) [brackets] {braces} --- ***",
    "Mixed: naïve中文😀abc123\u0301e\u0301 combining a\u0308",
]

SPECIAL_TEXTS = [
    "<|begin_of_text|>First Citizen:\nBefore we proceed<|end_of_text|>",
    "<|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|><|eot_id|>",
    "a<|begin_of_text|>b <|end_of_text|> c<|begin_of_tex<|end_of_text|",
    "<|end_of_text|><|end_header_id|><|end_of_text|>x",
]

GPT2_TEXTS = [
    "Hello world! The cat sat on the mat, 12345 times.",
    "  leading spaces and trailing   ",
    "<|endoftext|>first doc<|endoftext|> second doc",
    "a [MASK] b  [MASK]  c[MASK]d",
    "single<sw> word <sw> and <sw>x x<sw> <sw>",
    "héllo héllo-héllo",
    "Ġxy< is an added token",
]

SPLIT_VARIANTS = {
    "split_removed": {
        "type": "Sequence",
        "pretokenizers": [
            {"type": "Split", "pattern": {"String": " "}, "behavior": "Removed", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
             "use_regex": False},
        ],
    },
    "split_merged_prev": {
        "type": "Sequence",
        "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": r"[,.!? ]"}, "behavior": "MergedWithPrevious",
             "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
             "use_regex": False},
        ],
    },
    "split_merged_next": {
        "type": "Sequence",
        "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": r"\s"}, "behavior": "MergedWithNext",
             "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
             "use_regex": False},
        ],
    },
    "split_contiguous": {
        "type": "Sequence",
        "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": r"\p{L}"}, "behavior": "Contiguous",
             "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
             "use_regex": False},
        ],
    },
    "split_invert": {
        "type": "Sequence",
        "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": r"\p{L}+"}, "behavior": "Isolated",
             "invert": True},
            {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
             "use_regex": True},
        ],
    },
    "digits_individual": {
        "type": "Sequence",
        "pretokenizers": [
            {"type": "Digits", "individual_digits": True},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
             "use_regex": True},
        ],
    },
    "digits_contiguous": {
        "type": "Sequence",
        "pretokenizers": [
            {"type": "Digits", "individual_digits": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
             "use_regex": False},
        ],
    },
    "no_pre_tokenizer": None,
}


def write(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    mode = "wb" if isinstance(data, bytes) else "w"
    with open(path, mode) as f:
        f.write(data)


def dump_json(obj):
    return json.dumps(obj, ensure_ascii=False, indent=1) + "\n"


def set_dotted(root, dotted, value):
    keys = dotted.split(".")
    node = root
    for k in keys[:-1]:
        node = node[k]
    node[keys[-1]] = value


def load_with_override(json_text, override):
    if not override:
        return Tokenizer.from_str(json_text)
    obj = json.loads(json_text)
    for k, v in override.items():
        set_dotted(obj, k, v)
    return Tokenizer.from_str(json.dumps(obj))


def decoded_field(tok, ids):
    """HF's decode as a string; None when the bytes are not valid UTF-8 (HF would replace them)."""
    text = tok.decode(ids, skip_special_tokens=False)
    return None if "\ufffd" in text else text


# ---------------------------------------------------------------- torchtitan's wrapper, in short


def torchtitan_tokenizer(directory, override=None):
    """tokenizer.json + tokenizer_config.json as torchtitan's HuggingFaceTokenizer reads them."""
    with open(os.path.join(directory, "tokenizer.json")) as f:
        tok = load_with_override(f.read(), override)
    cfg_path = os.path.join(directory, "tokenizer_config.json")
    cfg = json.load(open(cfg_path)) if os.path.exists(cfg_path) else {}

    def content(v):
        return v["content"] if isinstance(v, dict) else v

    added = []
    for key in ["bos_token", "eos_token", "pad_token", "unk_token", "sep_token", "cls_token",
                "mask_token"]:
        v = cfg.get(key)
        if v is None:
            continue
        if isinstance(v, dict):
            added.append(AddedToken(v["content"], single_word=v.get("single_word", False),
                                    lstrip=v.get("lstrip", False), rstrip=v.get("rstrip", False),
                                    normalized=v.get("normalized", True),
                                    special=v.get("special", True)))
        else:
            added.append(AddedToken(v, special=True))
    for _, v in cfg.get("added_tokens_decoder", {}).items():
        added.append(AddedToken(v["content"], single_word=v.get("single_word", False),
                                lstrip=v.get("lstrip", False), rstrip=v.get("rstrip", False),
                                normalized=v.get("normalized", True),
                                special=v.get("special", True)))
    if added:
        tok.add_special_tokens(added)
    bos = tok.token_to_id(content(cfg["bos_token"])) if cfg.get("bos_token") else None
    eos = tok.token_to_id(content(cfg["eos_token"])) if cfg.get("eos_token") else None
    empty = tok.encode("").ids
    hf_adds_bos = bos is not None and bos in empty
    hf_adds_eos = eos is not None and eos in empty

    def encode_document(text):
        ids = tok.encode(text).ids
        if not hf_adds_bos and bos is not None:
            ids.insert(0, bos)
        if not hf_adds_eos and eos is not None:
            ids.append(eos)
        return ids

    return tok, encode_document


# ---------------------------------------------------------------- tokenizers


def train_main(text):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=2048 - len(SPECIALS), min_frequency=2,
                                  show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([text], trainer)
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SPECIALS])
    bos = tok.token_to_id(SPECIALS[0])
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(
            single=f"{SPECIALS[0]} $A", pair=f"{SPECIALS[0]} $A {SPECIALS[0]} $B:1",
            special_tokens=[(SPECIALS[0], bos)]),
    ])
    assert tok.get_vocab_size() == 2048, tok.get_vocab_size()
    return tok


def train_gpt2_style(text):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=True)
    trainer = trainers.BpeTrainer(vocab_size=400, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([text[:60000]], trainer)
    tok.add_special_tokens([AddedToken("<|endoftext|>", special=True, normalized=False)])
    tok.add_tokens([
        AddedToken("[MASK]", lstrip=True, rstrip=True, normalized=False, special=False),
        AddedToken("<sw>", single_word=True, normalized=False),
        AddedToken("héllo", normalized=True),
        AddedToken("Ġxy<", normalized=False),
    ])
    obj = json.loads(tok.to_str())
    # The legacy merges form ("a b" strings) that older tokenizer.json files use.
    obj["model"]["merges"] = [" ".join(m) if isinstance(m, list) else m
                              for m in obj["model"]["merges"]]
    json_text = json.dumps(obj, ensure_ascii=False, indent=1) + "\n"
    reloaded = Tokenizer.from_str(json_text)
    probe = "Hello world! The cat sat on the mat."
    assert reloaded.encode(probe).ids == tok.encode(probe).ids
    return reloaded, json_text


# ---------------------------------------------------------------- cases


def make_cases(text, main_json, gpt2_json, shared_dir):
    cases = []
    main = Tokenizer.from_str(main_json)
    gpt2 = Tokenizer.from_str(gpt2_json)

    def enc_case(name, tok, tok_name, s, post, override=None):
        ids = tok.encode(s, add_special_tokens=post).ids
        c = {"name": name, "tokenizer": tok_name, "mode": "encode", "post_process": post,
             "text": s, "ids": ids}
        if override:
            c["override"] = override
        d = decoded_field(tok, ids)
        if d is not None:
            c["decoded"] = d
        cases.append(c)

    for i, s in enumerate(UNICODE_TEXTS):
        enc_case(f"main_unicode_{i}", main, "tokenizer.json", s, False)
        enc_case(f"gpt2_unicode_{i}", gpt2, "gpt2_style.json", s, True)
    for i, s in enumerate(SPECIAL_TEXTS):
        enc_case(f"main_special_{i}", main, "tokenizer.json", s, True)
    enc_case("main_empty", main, "tokenizer.json", "", True)
    enc_case("main_empty_nopost", main, "tokenizer.json", "", False)
    enc_case("main_excerpt", main, "tokenizer.json", text[5000:9000], False)
    for i, s in enumerate(GPT2_TEXTS):
        enc_case(f"gpt2_{i}", gpt2, "gpt2_style.json", s, True)
    for name, pre in SPLIT_VARIANTS.items():
        tok = load_with_override(gpt2_json, {"pre_tokenizer": pre})
        for i, s in enumerate([GPT2_TEXTS[0], UNICODE_TEXTS[5], UNICODE_TEXTS[4],
                               "  a  b!!, c.d?  "]):
            enc_case(f"gpt2_{name}_{i}", tok, "gpt2_style.json", s, True,
                     {"pre_tokenizer": pre})
    tok = load_with_override(gpt2_json, {"model.ignore_merges": True})
    for i, s in enumerate(GPT2_TEXTS[:2] + UNICODE_TEXTS[:1]):
        enc_case(f"gpt2_ignore_merges_{i}", tok, "gpt2_style.json", s, True,
                 {"model.ignore_merges": True})

    # The fixture directory read as torchtitan reads a tokenizer directory.
    _, encode_doc = torchtitan_tokenizer(FIX)
    for i, s in enumerate([text[:2000], SPECIAL_TEXTS[1], ""]):
        cases.append({"name": f"main_document_{i}", "tokenizer": "dir:.", "mode": "document",
                      "text": s, "ids": encode_doc(s)})

    # torchtitan's test tokenizer (no merges; spaces/newlines map to byte-level characters that
    # are not in its vocab, so HF drops them — we must drop them too).
    if os.path.isdir(shared_dir):
        tt_tok, tt_doc = torchtitan_tokenizer(shared_dir)
        for i, s in enumerate([text[:4000], text[100000:103000], SPECIAL_TEXTS[1],
                               "<|begin_of_text|><|im_start|>user\nhi<|im_end|>[PAD]</think>",
                               UNICODE_TEXTS[0]]):
            ids = tt_doc(s)
            c = {"name": f"torchtitan_document_{i}", "tokenizer": "shared:tokenizer",
                 "mode": "document", "text": s, "ids": ids}
            d = decoded_field(tt_tok, ids)
            if d is not None:
                c["decoded"] = d
            cases.append(c)
        for fuse in (False, True):
            ov = {"model.unk_token": "[PAD]", "model.fuse_unk": fuse}
            tok, doc = torchtitan_tokenizer(shared_dir, ov)
            s = text[:300] + " x   spaced   out\n\n\n"
            cases.append({"name": f"torchtitan_unk_fuse{int(fuse)}", "tokenizer":
                          "shared:tokenizer", "mode": "document", "override": ov, "text": s,
                          "ids": doc(s)})
    else:
        print("warning: %s not found; torchtitan cases skipped" % shared_dir, file=sys.stderr)
    return cases


# ---------------------------------------------------------------- fuzz seeds


def tokenizer_fuzz_seeds(gpt2_json):
    tiny = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": 7, "content": "<s>", "single_word": False, "lstrip": False,
                          "rstrip": False, "normalized": False, "special": True}],
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": r"\p{L}+|\s+|."}, "behavior": "Isolated",
             "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
             "use_regex": False}]},
        "post_processor": {"type": "TemplateProcessing",
                           "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                                      {"Sequence": {"id": "A", "type_id": 0}}],
                           "pair": [{"Sequence": {"id": "A", "type_id": 0}},
                                    {"Sequence": {"id": "B", "type_id": 1}}],
                           "special_tokens": {"<s>": {"id": "<s>", "ids": [7],
                                                      "tokens": ["<s>"]}}},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                    "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": {"a": 0, "b": 1, "ab": 2, "Ġ": 3, "c": 4, "abc": 5, "Ġab": 6},
                  "merges": ["a b", "ab c", "Ġ ab"]},
    }
    seeds = {"gpt2_style.json": gpt2_json, "tiny.json": json.dumps(tiny)}

    def variant(name, path, value, delete=False):
        obj = copy.deepcopy(tiny)
        keys = path.split(".")
        node = obj
        for k in keys[:-1]:
            node = node[int(k)] if isinstance(node, list) else node[k]
        last = int(keys[-1]) if isinstance(node, list) else keys[-1]
        if delete:
            del node[last]
        else:
            node[last] = value
        seeds[name] = json.dumps(obj)

    variant("bad_model_type.json", "model.type", "WordPiece")
    variant("no_model.json", "model", None, delete=True)
    variant("vocab_not_object.json", "model.vocab", [1, 2])
    variant("vocab_negative_id.json", "model.vocab", {"a": -1})
    variant("vocab_dup_id.json", "model.vocab", {"a": 0, "b": 0})
    variant("vocab_huge_id.json", "model.vocab", {"a": 4000000000})
    variant("merge_unknown.json", "model.merges", [["a", "zz"]])
    variant("merge_result_missing.json", "model.merges", [["b", "a"]])
    variant("merge_bad_string.json", "model.merges", ["a b c"])
    variant("merge_bad_type.json", "model.merges", [7])
    variant("bad_regex.json", "pre_tokenizer.pretokenizers.0.pattern", {"Regex": "(unclosed"})
    variant("bad_behavior.json", "pre_tokenizer.pretokenizers.0.behavior", "Sideways")
    variant("bad_pretok.json", "pre_tokenizer", {"type": "Whitespace"})
    variant("normalizer.json", "normalizer", {"type": "NFC"})
    variant("added_no_content.json", "added_tokens.0.content", None, delete=True)
    variant("added_bad_id.json", "added_tokens.0.id", "seven")
    variant("added_id_clash.json", "added_tokens.0.id", 0)
    variant("template_unknown.json", "post_processor.single.0.SpecialToken.id", "<x>")
    variant("template_bad_id.json", "post_processor.special_tokens.<s>.ids", [99999])
    variant("decoder_bad.json", "decoder", {"type": "WordPiece"})
    variant("dropout.json", "model.dropout", 0.5)
    variant("unk_missing.json", "model.unk_token", "<unk>")
    variant("truncation.json", "truncation", {"max_length": 4})
    def pre(name, p):
        seeds[name] = json.dumps(dict(tiny, pre_tokenizer=p))

    for behavior in ("Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"):
        for invert in (False, True):
            pre(f"split_{behavior}_{int(invert)}.json", {"type": "Sequence", "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": r"\s|b"}, "behavior": behavior,
                 "invert": invert},
                {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                 "use_regex": False}]})
    pre("split_string.json", {"type": "Split", "pattern": {"String": "a"},
                              "behavior": "Isolated", "invert": False})
    pre("split_empty_match.json", {"type": "Split", "pattern": {"Regex": "x*"},
                                   "behavior": "Isolated", "invert": False})
    pre("bytelevel_regex.json", {"type": "ByteLevel", "add_prefix_space": True,
                                 "trim_offsets": True, "use_regex": True})
    pre("digits.json", {"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": True},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
         "use_regex": False}]})
    nested = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
              "use_regex": False}
    for _ in range(12):
        nested = {"type": "Sequence", "pretokenizers": [nested]}
    pre("nested_too_deep.json", nested)
    variant("unk_fuse.json", "model.unk_token", "c")
    obj = json.loads(seeds["unk_fuse.json"])
    obj["model"]["fuse_unk"] = True
    seeds["unk_fuse.json"] = json.dumps(obj)
    variant("ignore_merges.json", "model.ignore_merges", True)
    variant("merges_pairs.json", "model.merges", [["a", "b"], ["ab", "c"], ["Ġ", "ab"]])
    variant("merges_mixed.json", "model.merges", [["a", "b"], "ab c"])
    variant("added_flags.json", "added_tokens", [
        {"id": 7, "content": "<s>", "lstrip": True, "rstrip": True, "special": True,
         "normalized": False, "single_word": False},
        {"id": 2, "content": "ab", "single_word": True, "normalized": True, "special": False,
         "lstrip": False, "rstrip": False},
        {"id": 8, "content": "é", "lstrip": True, "normalized": True, "special": False,
         "single_word": True, "rstrip": True}])
    obj = copy.deepcopy(tiny)
    obj["model"]["vocab"]["\u0000"] = 7
    obj["model"]["vocab"]["a\u0000b"] = 8
    obj["added_tokens"][0]["id"] = 9
    obj["post_processor"]["special_tokens"]["<s>"]["ids"] = [9]
    seeds["nul_tokens.json"] = json.dumps(obj)
    variant("added_id_not_next.json", "added_tokens.0.id", 12)
    seeds["not_json.json"] = "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0,"
    seeds["empty.json"] = ""
    seeds["array.json"] = "[1, 2, 3]"
    seeds["catastrophic_regex.json"] = json.dumps(dict(tiny, pre_tokenizer={
        "type": "Split", "pattern": {"Regex": "(a+)+$"}, "behavior": "Isolated",
        "invert": False}))
    return seeds


MASK64 = (1 << 64) - 1
P1, P2, P3, P4, P5 = (0x9E3779B185EBCA87, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9,
                      0x85EBCA77C2B2AE63, 0x27D4EB2F165667C5)


def _rotl(x, r):
    return ((x << r) | (x >> (64 - r))) & MASK64


def _round(acc, lane):
    acc = (acc + lane * P2) & MASK64
    return (_rotl(acc, 31) * P1) & MASK64


def _merge(acc, val):
    acc ^= _round(0, val)
    return (acc * P1 + P4) & MASK64


def xxh64(data, seed=0):
    """XXH64 from its specification (independent of the C library the reader uses)."""
    n, i = len(data), 0
    if n >= 32:
        v = [(seed + P1 + P2) & MASK64, (seed + P2) & MASK64, seed, (seed - P1) & MASK64]
        while i + 32 <= n:
            for k in range(4):
                v[k] = _round(v[k], struct.unpack_from("<Q", data, i + 8 * k)[0])
            i += 32
        h = (_rotl(v[0], 1) + _rotl(v[1], 7) + _rotl(v[2], 12) + _rotl(v[3], 18)) & MASK64
        for k in range(4):
            h = _merge(h, v[k])
    else:
        h = (seed + P5) & MASK64
    h = (h + n) & MASK64
    while i + 8 <= n:
        h ^= _round(0, struct.unpack_from("<Q", data, i)[0])
        h = (_rotl(h, 27) * P1 + P4) & MASK64
        i += 8
    if i + 4 <= n:
        h ^= (struct.unpack_from("<I", data, i)[0] * P1) & MASK64
        h = (_rotl(h, 23) * P2 + P3) & MASK64
        i += 4
    while i < n:
        h ^= (data[i] * P5) & MASK64
        h = (_rotl(h, 11) * P1) & MASK64
        i += 1
    h ^= h >> 33
    h = (h * P2) & MASK64
    h ^= h >> 29
    h = (h * P3) & MASK64
    h ^= h >> 32
    return h


def shard_bytes(ids, vocab, width, version=1, magic=b"GTTOKENS", count=None, checksum=None,
                dtype=None):
    """The GTTOKENS format (include/graphtrain/gt_data.h): 64-byte header, then the payload."""
    payload = b"".join(struct.pack("<H" if width == 2 else "<I", t) for t in ids)
    if dtype is None:
        dtype = width
    if count is None:
        count = len(ids)
    if checksum is None:
        checksum = xxh64(payload)
    head = struct.pack("<8sIIQIIQ", magic, version, dtype, count, vocab, 0, checksum)
    head += b"\0" * (56 - len(head))
    head += struct.pack("<Q", xxh64(head))
    return head + payload


def shard_fuzz_seeds():
    ids = [(i * 7919) % 1000 for i in range(300)]
    good16 = shard_bytes(ids, 1000, 2)
    good32 = shard_bytes([i * 70001 for i in range(50)], 4000000, 4)
    seeds = {
        "good_u16.bin": good16,
        "good_u32.bin": good32,
        "empty_payload.bin": shard_bytes([], 10, 2),
        "truncated_header.bin": good16[:40],
        "truncated_payload.bin": good16[:-3],
        "bad_magic.bin": shard_bytes(ids, 1000, 2, magic=b"GTTOKENX"),
        "bad_version.bin": shard_bytes(ids, 1000, 2, version=9),
        "bad_dtype.bin": shard_bytes(ids, 1000, 2, dtype=3),
        "count_mismatch.bin": shard_bytes(ids, 1000, 2, count=301),
        "checksum_mismatch.bin": shard_bytes(ids, 1000, 2, checksum=12345),
        "id_out_of_vocab.bin": shard_bytes(ids, 500, 2),
        "trailing_bytes.bin": good16 + b"\0\0",
        "empty.bin": b"",
    }
    flipped = bytearray(good16)
    flipped[100] ^= 1
    seeds["payload_bitflip.bin"] = bytes(flipped)
    flipped = bytearray(good16)
    flipped[20] ^= 1
    seeds["header_bitflip.bin"] = bytes(flipped)
    return seeds


def check_xxh64():
    """Cross-checks the Python xxh64 against libxxhash when it is installed."""
    import ctypes
    import ctypes.util
    name = ctypes.util.find_library("xxhash")
    if not name:
        return
    lib = ctypes.CDLL(name)
    lib.XXH64.restype = ctypes.c_uint64
    lib.XXH64.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_uint64]
    for n in (0, 1, 3, 4, 7, 8, 31, 32, 33, 100, 1000):
        data = bytes((i * 37 + 11) & 255 for i in range(n))
        for seed in (0, 1, 2**64 - 1):
            assert lib.XXH64(data, n, seed) == xxh64(data, seed), (n, seed)


def main():
    check_xxh64()
    text_path = os.path.join(SHARED, "data", "tinyshakespeare.txt")
    with open(text_path, encoding="utf-8") as f:
        text = f.read()

    main_tok = train_main(text)
    main_json = main_tok.to_str(pretty=True) + "\n"
    write(os.path.join(FIX, "tokenizer.json"), main_json)
    write(os.path.join(FIX, "tokenizer_config.json"), dump_json({
        "bos_token": SPECIALS[0], "eos_token": SPECIALS[1], "tokenizer_class":
        "PreTrainedTokenizerFast", "model_max_length": 131072}))

    ids = main_tok.encode(text).ids
    assert max(ids) < 65536
    write(os.path.join(FIX, "tinyshakespeare.ids.u16le"),
          b"".join(struct.pack("<H", i) for i in ids))
    assert main_tok.decode(ids, skip_special_tokens=True) == text

    gpt2_tok, gpt2_json = train_gpt2_style(text)
    write(os.path.join(FIX, "gpt2_style.json"), gpt2_json)

    cases = make_cases(text, main_json, gpt2_json, os.path.join(SHARED, "data", "tokenizer"))
    write(os.path.join(FIX, "cases.json"), dump_json({"cases": cases}))

    for name, data in tokenizer_fuzz_seeds(gpt2_json).items():
        write(os.path.join(FUZZ_TOK, name), data)
    for name, data in shard_fuzz_seeds().items():
        write(os.path.join(FUZZ_SHARD, name), data)
    print("wrote %d ids for tinyshakespeare, %d cases" % (len(ids), len(cases)))


if __name__ == "__main__":
    main()
