#!/usr/bin/env python3
"""`loom export` of a model whose tokenizer.json is SentencePiece-style, checked with gguf-py and
transformers, independently of Loom:

- tokens: value for value what gguf-py's LlamaHfVocab (the converter's route for a Llama folder
  without tokenizer.model) lists from the same tokenizer.json, the rest "[PAD<id>]" UNUSED (5);
- token types: LlamaHfVocab's for every id that is not an added token; an added token is CONTROL (3)
  when tokenizer.json marks it special (or it looks special), else USER_DEFINED (4), as the converter
  types added tokens from tokenizer_config.json's added_tokens_decoder (LlamaHfVocab instead calls
  special only the named bos/eos/unk/... tokens; the ids where the two differ are printed);
- scores: LlamaHfVocab writes the placeholder -1000 for every token (asserted, so that a gguf-py that
  computes real scores is noticed); Loom's must order merges as tokenizer.json does: transformers'
  generate_merges(vocab, scores) - the merges transformers builds from a GGUF's scores - encodes
  corpus.txt and the fixture's cases to tokenizer.json's ids.

    python3 tools/check/check_gguf_spm_export.py --gguf OUT.gguf --model DIR [--texts FILE...]
"""
import argparse
import json
import pathlib
import sys

import gguf
from gguf.vocab import LlamaHfVocab
from tokenizers import Tokenizer
from transformers.tokenization_utils_base import generate_merges

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6


def field_strings(reader, key):
    f = reader.get_field(key)
    return [bytes(f.parts[i]).decode("utf-8") for i in f.data]


def field_values(reader, key):
    f = reader.get_field(key)
    return [f.parts[i].tolist()[0] for i in f.data]


def looks_special(t):  # convert_hf_to_gguf.py's TextModel.does_token_look_special
    return (t in ("<pad>", "<mask>", "<2mass>", "[@BOS@]") or (t.startswith("<|") and t.endswith("|>"))
            or (t.startswith("<｜") and t.endswith("｜>")) or (t.startswith("<unused") and t.endswith(">")))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--model", required=True, help="the exported folder (tokenizer.json, no tokenizer.model)")
    ap.add_argument("--texts", nargs="*", default=[], help="files of texts: corpus.txt, cases.json")
    a = ap.parse_args()
    model = pathlib.Path(a.model)
    reader = gguf.GGUFReader(a.gguf)
    tokens = field_strings(reader, "tokenizer.ggml.tokens")
    scores = field_values(reader, "tokenizer.ggml.scores")
    types = field_values(reader, "tokenizer.ggml.token_type")
    assert bytes(reader.get_field("tokenizer.ggml.model").parts[-1]).decode() == "llama"
    assert reader.get_field("tokenizer.ggml.merges") is None

    hf = LlamaHfVocab(model)
    hf_tokens, hf_scores, hf_types = zip(*hf.all_tokens())
    hf_tokens = [t.decode("utf-8") for t in hf_tokens]
    assert tokens[:len(hf_tokens)] == hf_tokens, "tokens differ from LlamaHfVocab's"
    for i in range(len(hf_tokens), len(tokens)):
        assert tokens[i] == f"[PAD{i}]" and types[i] == UNUSED, (i, tokens[i], types[i])
    assert set(hf_scores) == {-1000.0}, "LlamaHfVocab computes scores now: compare them"

    tj = json.loads((model / "tokenizer.json").read_text(encoding="utf-8"))
    added = {a_["id"]: a_ for a_ in tj["added_tokens"]}
    differ = []
    for i, (t, want) in enumerate(zip(hf_tokens, hf_types)):
        if i in added:
            expect = CONTROL if added[i].get("special") or looks_special(t) else USER_DEFINED
            assert types[i] == expect, (i, t, types[i], expect)
            if types[i] != int(want):
                differ.append(f"{i} {t!r}: {types[i]} (LlamaHfVocab {int(want)})")
        else:
            assert types[i] == int(want), (i, t, types[i], int(want))

    vocab = tj["model"]["vocab"]
    merges = generate_merges(vocab, {t: scores[i] for t, i in vocab.items()})
    source = Tokenizer.from_file(str(model / "tokenizer.json"))
    tj["model"]["merges"] = [list(m) for m in merges]
    from_scores = Tokenizer.from_str(json.dumps(tj))
    texts = []
    for path in a.texts:
        text = pathlib.Path(path).read_text(encoding="utf-8")
        texts += [c["text"] for c in json.loads(text)["cases"]] if path.endswith(".json") else [text] + text.split("\n")
    n = 0
    for text in texts:
        want = source.encode(text, add_special_tokens=False).ids
        assert from_scores.encode(text, add_special_tokens=False).ids == want, f"the scores' merges encode {text!r} otherwise"
        n += len(want)
    print(f"{a.gguf}: {len(hf_tokens)} of {len(tokens)} tokens as LlamaHfVocab lists them; {len(texts)} texts ({n} tokens) encode as "
          f"tokenizer.json with the merges of Loom's scores; added-token types that differ from LlamaHfVocab's: "
          f"{', '.join(differ) or 'none'}")


if __name__ == "__main__":
    sys.exit(main())
