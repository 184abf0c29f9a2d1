#!/usr/bin/env python3
"""Writes tests/fixtures/tokenizers/metaspace_cases.json: the `tokenizers` library's ids, offsets and
decodes for tests/fixtures/tokenizers/llama2/tokenizer.json with its Prepend/Replace normalizer
swapped for a Metaspace pre-tokenizer (what transformers' LlamaTokenizer writes), in each
prepend_scheme (always, first, never) with split true and false.

    pip install tokenizers && python3 tools/reference/make_metaspace_cases.py
"""
import json
import os

import tokenizers
from tokenizers import Tokenizer

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "fixtures", "tokenizers")

TEXTS = [
    "",
    " ",
    "Hello world",
    " Hello world",
    "  two  spaces  ",
    "line one\nline two\n\n",
    "<s>Hello</s> world <s>",
    " <s> x",
    "</s>",
    "def f(x):\n    return x * 2\n",
    "机器学习 😀 café",
    "a\u2581b \u2581c",
]


def main():
    with open(os.path.join(ROOT, "llama2", "tokenizer.json"), encoding="utf-8") as f:
        base = json.load(f)
    base["normalizer"] = None
    base["decoder"]["decoders"] = base["decoder"]["decoders"][:3]  # Replace, ByteFallback, Fuse
    variants = []
    for scheme in ("always", "first", "never"):
        for split in (True, False):
            pre = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": scheme, "split": split}
            tok = Tokenizer.from_str(json.dumps(dict(base, pre_tokenizer=pre)))
            cases = []
            for text in TEXTS:
                enc = tok.encode(text, add_special_tokens=False)
                b = [len(text[:i].encode("utf-8")) for i in range(len(text) + 1)]  # char -> byte offsets
                cases.append({"text": text, "ids": enc.ids, "offsets": [[b[s], b[e]] for s, e in enc.offsets],
                              "decode": tok.decode(enc.ids, skip_special_tokens=False)})
            variants.append({"pre_tokenizer": pre, "cases": cases})
    out = os.path.join(ROOT, "metaspace_cases.json")
    with open(out, "w", encoding="utf-8") as f:
        json.dump({"tokenizers_version": tokenizers.__version__, "variants": variants}, f, ensure_ascii=False,
                  separators=(",", ":"))
        f.write("\n")
    print("wrote", out, os.path.getsize(out), "bytes")


if __name__ == "__main__":
    main()
