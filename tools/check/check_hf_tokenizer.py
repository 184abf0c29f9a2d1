#!/usr/bin/env python3
"""Checks a Hugging Face folder's tokenizer files with transformers itself (independent of Loom).

    python3 tools/check/check_hf_tokenizer.py --model HF_DIR --reference tests/fixtures/gguf/spm_llama.reference.json

Loads the folder twice, with AutoTokenizer (the class tokenizer_config.json names; transformers 5's
LlamaTokenizer rebuilds its pipeline from the vocabulary and merges) and with
PreTrainedTokenizerFast (tokenizer.json exactly as written), and compares each with a reference
made by tools/reference/make_gguf_spm_reference.py (transformers loading the GGUF the folder was converted
from): the ids of every case, tok.decode with and without special tokens, the vocabulary size, and
the chat template rendered with add_generation_prompt. Exit 0 when everything matches; 1 with a
list of what does not.
"""
import argparse
import json
import sys

from transformers import AutoTokenizer, PreTrainedTokenizerFast


def check(tok, ref):
    failures = []
    if len(tok) != ref["vocab_size"]:
        failures.append(f"vocabulary size {len(tok)}, reference {ref['vocab_size']}")
    for c in ref["cases"]:
        ids = tok(c["text"], add_special_tokens=c["add_special_tokens"]).input_ids
        if ids != c["ids"]:
            failures.append(f"{c['text']!r} add_special_tokens={c['add_special_tokens']}: ids {ids}, reference {c['ids']}")
        for skip, key in ((False, "decode"), (True, "decode_skip_special")):
            got = tok.decode(c["ids"], skip_special_tokens=skip)
            if got != c[key]:
                failures.append(f"decode({c['ids']}, skip_special_tokens={skip}) = {got!r}, reference {c[key]!r}")
    for chat in ref["chats"]:
        text = tok.apply_chat_template(chat["messages"], tokenize=False, add_generation_prompt=True)
        if text != chat["text"]:
            failures.append(f"chat {chat['messages']}: {text!r}, reference {chat['text']!r}")
    return failures


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--reference", required=True)
    a = ap.parse_args()
    with open(a.reference, encoding="utf-8") as f:
        ref = json.load(f)
    bad = 0
    for cls in (AutoTokenizer, PreTrainedTokenizerFast):
        tok = cls.from_pretrained(a.model)
        failures = check(tok, ref)
        for line in failures:
            print("MISMATCH", type(tok).__name__, line)
        print(f"{a.model}: {cls.__name__} -> {type(tok).__name__}, {len(ref['cases'])} cases, "
              f"{len(ref['chats'])} chats, {len(failures)} mismatches")
        bad += len(failures)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
