#!/usr/bin/env python3
# Makes tests/fixtures/tokenizers/<name>/{tokenizer.json,cases.json}: small tokenizers trained with the
# Hugging Face `tokenizers` library on corpus.txt, laid out like the real Llama 3, Qwen2, Llama 2 and
# Gemma tokenizer.json files, plus the library's own encodings of a broad set of strings.
# Usage: pip install tokenizers && python3 tools/reference/make_tokenizer_fixtures.py
import json
import os

import tokenizers
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "fixtures", "tokenizers")

LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")

CASES = [
    "",
    "Hello world",
    "Hello, world! How are you today?",
    "The quick brown fox jumps over the lazy dog.",
    "  leading spaces and trailing spaces   ",
    "a  b   c    d     e",
    "line one\nline two\n\nline four\n\n\n",
    "\n\n\nstarts with newlines",
    "windows\r\nline\r\nendings\r\n",
    "tabs\tand\t\tmore tabs\t",
    "def f(x):\n    return x * 2\n\n\tif x:\n\t\tpass\n",
    "int main() { return 0; }",
    "It's we're they've I'm you'll he'd IT'S WE'RE THEY'VE I'M YOU'LL HE'D 'S 'sup",
    "don't can't won't shouldn't",
    "1234567890 12 123 1234 12345 3.14159 1,000,000 2024-01-31",
    "MiXeD CaSe WoRdS and ALLCAPS and lowercase",
    "机器学习是人工智能的一个分支。",
    "こんにちは、世界！ 한국어 Привет мир Γειά σου",
    "café naïve résumé Zürich Ångström Łódź",
    "Emoji 😀🎉🚀 ❤️ 👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈!",
    "Rare bytes: \u0001\u0002\u007f ÿ ǅ ᚠ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 \U0001F9EC",
    "symbols ™©®°±×÷€£¥→←∑∫√∞",
    "email someone@example.com https://example.org/a?b=1&c=2#d",
    "   \n  \t \n",
    " ",
    "\u00a0non-breaking\u2003em space\u3000ideographic",
    "x" * 300,
    "supercalifragilistic and loomtokenizer words",
    "!!!???...,,,;;;:::",
    "naïve café",  # already NFC
]


def write_case_file(name, tok, extra_cases):
    cases = []
    for text in CASES + extra_cases:
        for add in (False, True):
            enc = tok.encode(text, add_special_tokens=add)
            b = [len(text[:i].encode("utf-8")) for i in range(len(text) + 1)]  # char -> byte offsets
            offsets = [[b[s], b[e]] for s, e in enc.offsets]
            cases.append({
                "text": text,
                "add_special_tokens": add,
                "ids": enc.ids,
                "tokens": enc.tokens,
                "offsets": offsets,
                "decode": tok.decode(enc.ids, skip_special_tokens=False),
                "decode_skip_special": tok.decode(enc.ids, skip_special_tokens=True),
            })
    d = os.path.join(ROOT, name)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8") as f:
        f.write(tok.to_str(pretty=True))
    with open(os.path.join(d, "cases.json"), "w", encoding="utf-8") as f:
        json.dump({"tokenizers_version": tokenizers.__version__, "cases": cases}, f, ensure_ascii=False, indent=0)


def corpus_lines():
    with open(os.path.join(ROOT, "corpus.txt"), encoding="utf-8", newline="") as f:
        text = f.read()
    return [text] * 3


def byte_level(name, pattern, specials, bos, normalizer, ignore_merges, string_merges):
    tok = Tokenizer(models.BPE())
    if normalizer is not None:
        tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1200, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus_lines(), trainer)
    tok.add_special_tokens(specials)
    j = json.loads(tok.to_str())
    model = j["model"]
    model["ignore_merges"] = ignore_merges
    # Vocab-only words (no merge path to them) show what ignore_merges changes.
    for w in ["Ġsupercalifragilistic", "Ġloomtokenizer"]:
        model["vocab"][w] = max(model["vocab"].values()) + 1
    # Keep added tokens after the vocab as in Llama 3 (ids 128000+).
    base = max(model["vocab"].values()) + 1
    for i, t in enumerate(j["added_tokens"]):
        t["id"] = base + i
    if string_merges:  # Llama 3's file writes merges as "a b"; newer files as ["a", "b"].
        model["merges"] = [" ".join(m) if isinstance(m, list) else m for m in model["merges"]]
    post = [{"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True}]
    if bos:
        bos_id = next(t["id"] for t in j["added_tokens"] if t["content"] == bos)
        post.append({
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": bos, "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {bos: {"id": bos, "ids": [bos_id], "tokens": [bos]}},
        })
        j["post_processor"] = {"type": "Sequence", "processors": post}
    else:
        j["post_processor"] = post[0]
    j["decoder"] = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}
    return Tokenizer.from_str(json.dumps(j, ensure_ascii=False))


def sentencepiece(name, prepend, specials, bos, strip, split_words):
    norm = [normalizers.Replace(" ", "▁")]
    if prepend:
        norm.insert(0, normalizers.Prepend("▁"))
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Sequence(norm) if len(norm) > 1 else norm[0]
    if split_words:  # like SentencePiece's training: "▁" only starts pieces (the file has no pre-tokenizer)
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="never", split=True)
    # limit_alphabet leaves rare characters (CJK, emoji) out so they fall back to <0xNN> bytes.
    trainer = trainers.BpeTrainer(vocab_size=1500, min_frequency=2, show_progress=False, limit_alphabet=120,
                                  special_tokens=specials)
    tok.train_from_iterator(corpus_lines(), trainer)
    j = json.loads(tok.to_str())
    model = j["model"]
    trained = sorted(model["vocab"].items(), key=lambda kv: kv[1])
    vocab = {}
    for s in specials:
        vocab[s] = len(vocab)
    for b in range(256):
        vocab["<0x%02X>" % b] = len(vocab)
    for t, _ in trained:
        if t not in vocab:
            vocab[t] = len(vocab)
    model["vocab"] = vocab
    for t in j["added_tokens"]:
        t["id"] = vocab[t["content"]]
        t["normalized"] = False
    j["pre_tokenizer"] = None
    dec = [{"type": "Replace", "pattern": {"String": "▁"}, "content": " "}, {"type": "ByteFallback"}, {"type": "Fuse"}]
    if strip:
        dec.append({"type": "Strip", "content": " ", "start": 1, "stop": 0})
    j["decoder"] = {"type": "Sequence", "decoders": dec}
    j["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                 {"SpecialToken": {"id": bos, "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {bos: {"id": bos, "ids": [vocab[bos]], "tokens": [bos]}},
    }
    return Tokenizer.from_str(json.dumps(j, ensure_ascii=False))


def main():
    llama3_specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                       "<|eot_id|>"]
    llama3 = byte_level("llama3", LLAMA3_PATTERN, llama3_specials, "<|begin_of_text|>", None, True, True)
    write_case_file("llama3", llama3, [
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi there!<|eot_id|>",
        "text<|eot_id|>more<|end_of_text|>",
        "<|eot_id|",  # partial special: plain text
    ])
    qwen_specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    qwen2 = byte_level("qwen2", QWEN2_PATTERN, qwen_specials, None, normalizers.NFC(), False, False)
    write_case_file("qwen2", qwen2, [
        "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\n2+2=?<|im_end|>\n",
        "<|endoftext|><|endoftext|>",
    ])
    llama2 = sentencepiece("llama2", True, ["<unk>", "<s>", "</s>"], "<s>", True, True)
    write_case_file("llama2", llama2, ["<s>Hello</s> world <s>", "[INST] hi [/INST]"])
    gemma_specials = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]
    gemma = sentencepiece("gemma", False, gemma_specials, "<bos>", False, False)
    write_case_file("gemma", gemma, [
        "<start_of_turn>user\nHello<end_of_turn>\n<start_of_turn>model\nHi!<end_of_turn>\n",
        "<bos><eos>",
    ])


if __name__ == "__main__":
    main()
