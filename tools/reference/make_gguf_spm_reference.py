#!/usr/bin/env python3
"""Writes tests/fixtures/gguf/spm_*: small GGUF files with a SentencePiece-style tokenizer
(tokenizer.ggml.model "llama": tokens, scores, token types, no merges) and the ids transformers
gives when it builds its tokenizer from that GGUF (AutoTokenizer.from_pretrained(dir, gguf_file=...)),
an implementation independent of Loom.

    pip install "transformers>=5" gguf tokenizers numpy torch && python3 tools/reference/make_gguf_spm_reference.py

(transformers' GGUF reader imports torch. transformers 4.x builds these tokenizers differently: a
Prepend normalizer instead of Metaspace, Gemma merges ordered by score, no Phi-3 normalizer; the
committed references are 5.24.0's, as each reference.json records.)

spm_llama.gguf    architecture llama: tests/fixtures/tokenizers/llama2's vocabulary with
                  SentencePiece BPE scores (-id for normal pieces, 0 for the rest), byte tokens
                  <0xXX> of type 6, <unk> unknown, <s> </s> control, a user-defined <think> and an
                  unused <unused0>, the Llama 2 chat template; a 1-layer llama with tied f16
                  embeddings so that `loom convert` has a model to write.
spm_gemma.gguf    architecture gemma2 (transformers reads no Gemma 1 GGUF config) with a 1-layer model:
                  tests/fixtures/tokenizers/gemma's vocabulary,
                  whitespace-run pieces stored as real spaces (as Gemma GGUFs store them) and scores
                  that do not follow the merge order (transformers orders Gemma's merges by position),
                  the Gemma chat template, add_space_prefix false.
spm_phi3.gguf     architecture phi3, tokenizer only: the llama2 vocabulary plus Phi-3's <|user|>,
                  <|assistant|>, <|system|>, <|end|> control tokens and its chat template
                  (transformers gives Phi-3 a Prepend/Replace normalizer instead of Metaspace).
spm_<name>.reference.json  the cases: text, add_special_tokens, transformers' ids, tok.decode(ids)
                  and decode(skip_special_tokens=True); the rendered chat templates; the library
                  versions; and transformers' own tokenizer.json with model.vocab left out and
                  model.merges replaced by their count and the first and last 40.
"""
import json
import os

import gguf
import numpy as np
import tokenizers
import transformers
from gguf import GGMLQuantizationType as T
from transformers import AutoTokenizer

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "..", "tests", "fixtures", "gguf")
TOK = os.path.join(HERE, "..", "..", "tests", "fixtures", "tokenizers")
rng = np.random.default_rng(20261202)

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

LLAMA2_TEMPLATE = (
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
    "{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}"
    "{% set system_message = false %}{% endif %}{% for message in loop_messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if loop.index0 == 0 and system_message != false %}"
    "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
    "{% else %}{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}"
    "{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}"
    "{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}"
)
GEMMA_TEMPLATE = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
    "{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}"
    "{% endif %}{{ '<start_of_turn>' + role + '\\n' + message['content'] | trim + '<end_of_turn>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{'<start_of_turn>model\\n'}}{% endif %}"
)

TEXTS = [
    "",
    "Hello world",
    " Hello world",
    "  two leading spaces",
    "trailing spaces   ",
    "a  b   c    d     e",
    "line one\nline two\n\nline four\n\n\n",
    "\n\nstarts with newlines",
    "tabs\tand\t\tmore\r\nwindows",
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "int main() { return 0; }  // done",
    "1234567890 12 123 3.14159 1,000,000 2024-01-31",
    "机器学习是人工智能的一个分支。",
    "日本語のテキストと中文混合, 한국어 Привет",
    "Emoji 😀🎉🚀 ❤️ 👍🏽 👨‍👩‍👧‍👦!",
    "café naïve résumé Zürich",
    "Rare bytes: \u0001\u007f ÿ 𝔘𝔫𝔦 \U0001F9EC",
    "   \n  \t \n",
    " ",
    "x" * 40,
]
PHI3_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] == 'system' %}"
    "{{'<|system|>\n' + message['content'] + '<|end|>\n'}}{% elif message['role'] == 'user' %}"
    "{{'<|user|>\n' + message['content'] + '<|end|>\n'}}{% elif message['role'] == 'assistant' %}"
    "{{'<|assistant|>\n' + message['content'] + '<|end|>\n'}}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% else %}{{ eos_token }}{% endif %}"
)

CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello! How can I help?"},
     {"role": "user", "content": "Name three colours."}],
]


def sentencepiece_vocab(name):
    with open(os.path.join(TOK, name, "tokenizer.json"), encoding="utf-8") as f:
        j = json.load(f)
    vocab = j["model"]["vocab"]
    tokens = [None] * len(vocab)
    for t, i in vocab.items():
        tokens[i] = t
    return tokens, {a["content"] for a in j["added_tokens"]}


def token_type(token, specials, unk):
    if token == unk:
        return UNKNOWN
    if token in specials:
        return CONTROL
    if len(token) == 6 and token.startswith("<0x") and token.endswith(">"):
        return BYTE
    return NORMAL


def tiny_llama_tensors(w, vocab):
    hidden, n_head, ff = 8, 2, 16
    normal = lambda *s: rng.normal(0, 0.5, size=s).astype(np.float32)  # noqa: E731
    w.add_tensor("token_embd.weight", normal(vocab, hidden).astype(np.float16))
    w.add_tensor("blk.0.attn_norm.weight", 1 + 0.1 * normal(hidden))
    for n in ("attn_q", "attn_k", "attn_v", "attn_output"):
        w.add_tensor(f"blk.0.{n}.weight", normal(hidden, hidden).astype(np.float16))
    w.add_tensor("blk.0.ffn_norm.weight", 1 + 0.1 * normal(hidden))
    w.add_tensor("blk.0.ffn_gate.weight", normal(ff, hidden).astype(np.float16))
    w.add_tensor("blk.0.ffn_up.weight", normal(ff, hidden).astype(np.float16))
    w.add_tensor("blk.0.ffn_down.weight", normal(hidden, ff).astype(np.float16))
    w.add_tensor("output_norm.weight", 1 + 0.1 * normal(hidden))
    return hidden, n_head, ff


def add_spm_tokenizer(w, tokens, scores, types, bos, eos, unk, pad, add_bos, pre="default"):
    """The tokenizer.ggml.* keys every fixture writes, in one order (pre=None leaves the key out)."""
    w.add_vocab_size(len(tokens))
    w.add_tokenizer_model("llama")
    if pre is not None:
        w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(bos)
    w.add_eos_token_id(eos)
    w.add_unk_token_id(unk)
    w.add_pad_token_id(pad)
    w.add_add_bos_token(add_bos)
    w.add_add_eos_token(False)


def write_llama():
    tokens, specials = sentencepiece_vocab("llama2")
    tokens += ["<think>", "<unused0>"]
    types = [token_type(t, specials, "<unk>") for t in tokens]
    types[-2:] = [USER_DEFINED, UNUSED]
    scores = [float(-i) if ty == NORMAL else 0.0 for i, ty in enumerate(types)]
    path = os.path.join(OUT, "spm_llama.gguf")
    w = gguf.GGUFWriter(path, "llama")
    w.add_name("spm-llama")
    w.add_context_length(256)
    w.add_block_count(1)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    add_spm_tokenizer(w, tokens, scores, types, bos=1, eos=2, unk=0, pad=0, add_bos=True)
    w.add_chat_template(LLAMA2_TEMPLATE)
    hidden, n_head, ff = tiny_llama_tensors(w, len(tokens))
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head)
    w.add_rope_dimension_count(hidden // n_head)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path, ["<s>Hello</s> world <s>", "[INST] hi [/INST]", "<think>x</think> <unused0>"]


def write_gemma():
    tokens, specials = sentencepiece_vocab("gemma")
    specials |= {"<mask>"}
    types = [token_type(t, specials, "<unk>") for t in tokens]
    # Whitespace runs as real spaces, as Gemma GGUFs spell them.
    tokens = [" " * len(t) if len(t) >= 2 and set(t) == {"\u2581"} else t for t in tokens]
    # Scores that do not follow the merge order: transformers orders Gemma's merges by position.
    scores = [float(rng.integers(-5000, 0)) if ty == NORMAL else 0.0 for ty in types]
    path = os.path.join(OUT, "spm_gemma.gguf")
    w = gguf.GGUFWriter(path, "gemma2")
    w.add_name("spm-gemma")
    w.add_context_length(512)
    w.add_embedding_length(8)
    w.add_block_count(1)
    w.add_feed_forward_length(16)
    w.add_head_count(2)
    w.add_head_count_kv(1)
    w.add_key_length(4)
    w.add_value_length(4)
    w.add_layer_norm_rms_eps(1e-6)
    add_spm_tokenizer(w, tokens, scores, types, bos=2, eos=1, unk=3, pad=0, add_bos=True, pre=None)
    w.add_add_space_prefix(False)
    w.add_chat_template(GEMMA_TEMPLATE)
    normal = lambda *s: rng.normal(0, 0.5, size=s).astype(np.float32)  # noqa: E731
    w.add_tensor("token_embd.weight", normal(len(tokens), 8).astype(np.float16))
    for n in ("attn_norm", "post_attention_norm", "ffn_norm", "post_ffw_norm"):
        w.add_tensor(f"blk.0.{n}.weight", 1 + 0.1 * normal(8))
    for n, rows, cols in (("attn_q", 8, 8), ("attn_k", 4, 8), ("attn_v", 4, 8), ("attn_output", 8, 8),
                          ("ffn_gate", 16, 8), ("ffn_up", 16, 8), ("ffn_down", 8, 16)):
        w.add_tensor(f"blk.0.{n}.weight", normal(rows, cols).astype(np.float16))
    w.add_tensor("output_norm.weight", 1 + 0.1 * normal(8))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path, ["<start_of_turn>user\nhi<end_of_turn>\n", "<bos>x<eos>"]


def write_phi3():
    tokens, specials = sentencepiece_vocab("llama2")
    turn = ["<|assistant|>", "<|end|>", "<|system|>", "<|user|>"]
    tokens += turn
    specials |= set(turn)
    types = [token_type(t, specials, "<unk>") for t in tokens]
    scores = [float(-i) if ty == NORMAL else 0.0 for i, ty in enumerate(types)]
    path = os.path.join(OUT, "spm_phi3.gguf")
    w = gguf.GGUFWriter(path, "phi3")
    w.add_name("spm-phi3")
    w.add_context_length(4096)
    w.add_embedding_length(8)
    w.add_block_count(1)
    w.add_feed_forward_length(16)
    w.add_head_count(2)
    w.add_head_count_kv(2)
    w.add_rope_dimension_count(4)
    w.add_layer_norm_rms_eps(1e-5)
    end = tokens.index("<|end|>")
    add_spm_tokenizer(w, tokens, scores, types, bos=1, eos=end, unk=0, pad=end, add_bos=False)
    w.add_chat_template(PHI3_TEMPLATE)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path, ["<|user|>\n hi<|end|>\n<|assistant|>", "<s> x</s>"]


def reference(path, extra):
    folder, name = os.path.split(os.path.abspath(path))
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    cases = []
    for text in TEXTS + extra:
        for add in (False, True):
            ids = tok(text, add_special_tokens=add).input_ids
            cases.append({"text": text, "add_special_tokens": add, "ids": ids, "decode": tok.decode(ids),
                          "decode_skip_special": tok.decode(ids, skip_special_tokens=True)})
    chats = []
    for c in CHATS:
        text = tok.apply_chat_template(c, tokenize=False, add_generation_prompt=True)
        chats.append({"messages": c, "text": text, "ids": tok(text, add_special_tokens=False).input_ids})
    tj = json.loads(tok.backend_tokenizer.to_str())
    merges = tj["model"].pop("merges")
    del tj["model"]["vocab"]
    tj["model"]["merges_count"] = len(merges)
    tj["model"]["merges_head"] = merges[:40]
    tj["model"]["merges_tail"] = merges[-40:]
    record = {
        "versions": {"transformers": transformers.__version__, "tokenizers": tokenizers.__version__,
                     "gguf": getattr(gguf, "__version__", "?")},
        "vocab_size": len(tok),
        "special_tokens": {k: str(v) for k, v in tok.special_tokens_map.items()},
        "add_bos_token": tok.add_bos_token,
        "add_eos_token": tok.add_eos_token,
        "tokenizer_json": tj,
        "cases": cases,
        "chats": chats,
    }
    out = path.replace(".gguf", ".reference.json")
    with open(out, "w", encoding="utf-8") as f:
        json.dump(record, f, indent=None, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")
    print("wrote", path, os.path.getsize(path), "bytes;", out, os.path.getsize(out), "bytes;",
          len(merges), "merges")


def main():
    for path, extra in (write_llama(), write_gemma(), write_phi3()):
        reference(path, extra)


if __name__ == "__main__":
    main()
