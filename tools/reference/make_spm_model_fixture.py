#!/usr/bin/env python3
"""Writes tests/fixtures/tokenizers/spm_model/: a real SentencePiece BPE model (tokenizer.model, trained
by the sentencepiece library on corpus.txt with Llama 2's settings: byte fallback, split digits,
whitespace-only pieces, identity normalization, a dummy prefix; plus a control symbol <|end|> and a
user-defined symbol <think>), the tokenizer.json / tokenizer_config.json / chat_template.jinja that
transformers 5 writes for it (AutoTokenizer.from_pretrained + save_pretrained), and reference.json:
what convert_hf_to_gguf.py would write for it, computed independently of Loom.

    pip install sentencepiece protobuf "transformers>=5" gguf && python3 tools/reference/make_spm_model_fixture.py

tokenizer_config.json gets the added_tokens_decoder that transformers 4 wrote (and that the tokenizer
configs of Llama 2, Mistral, Gemma and Phi-3 on the Hub carry; transformers 5 no longer writes it),
built from tokenizer.json's added_tokens: llama.cpp's converter reads it.

reference.json:
  versions       the libraries used
  pieces         [piece, score, type] of every ModelProto piece, read with sentencepiece's own protobuf
  vocab_size     the model vocabulary the converter output below is padded to (more rows than pieces)
  llama_cpp      {"llama": ..., "phi3": ...}: {tokens, scores, types} as convert_hf_to_gguf.py's
                 TextModel._create_vocab_sentencepiece (LlamaModel, Gemma3Model with a tokenizer.model)
                 and Phi3MiniModel.set_vocab compute them, transcribed below with
                 SentencePieceProcessor in place of its calls (llama.cpp 2026-11, conversion/base.py and
                 conversion/phi.py)
  llama_hf_vocab {tokens, scores, types} from gguf-py's LlamaHfVocab (what the converter uses for a
                 Llama folder without tokenizer.model) on the same folder less tokenizer.model
"""
import json
import os
import shutil
import tempfile

import gguf
import sentencepiece as spm
import tokenizers
import transformers
from gguf.vocab import LlamaHfVocab
from sentencepiece import sentencepiece_model_pb2 as model_pb2
from transformers import AutoTokenizer

HERE = os.path.dirname(os.path.abspath(__file__))
TOK = os.path.join(HERE, "..", "..", "tests", "fixtures", "tokenizers")
OUT = os.path.join(TOK, "spm_model")
VOCAB_SIZE = 704  # the model's embedding rows: 4 more than the 700 pieces, as [PAD<id>] tokens

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

LLAMA2_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] == 'user' %}"
    "{{ bos_token + '[INST] ' + message['content'].strip() + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ ' ' + message['content'].strip() + ' ' + eos_token }}"
    "{% endif %}{% endfor %}"
)


def does_token_look_special(token_text):  # TextModel.does_token_look_special
    seems_special = token_text in ("<pad>", "<mask>", "<2mass>", "[@BOS@]")
    seems_special = seems_special or (token_text.startswith("<|") and token_text.endswith("|>"))
    seems_special = seems_special or (token_text.startswith("<｜") and token_text.endswith("｜>"))
    seems_special = seems_special or (token_text.startswith("<unused") and token_text.endswith(">"))
    return seems_special


def sentencepiece_base(dir_model, vocab_size):
    tokenizer = spm.SentencePieceProcessor()
    tokenizer.LoadFromFile(os.path.join(dir_model, "tokenizer.model"))
    tokens = [f"[PAD{i}]".encode("utf-8") for i in range(vocab_size)]
    scores = [-10000.0] * vocab_size
    toktypes = [UNUSED] * vocab_size
    for token_id in range(tokenizer.vocab_size()):
        if token_id >= vocab_size:
            break
        piece = tokenizer.IdToPiece(token_id)
        text = piece.encode("utf-8")
        score = tokenizer.GetScore(token_id)
        toktype = NORMAL
        if tokenizer.IsUnknown(token_id):
            toktype = UNKNOWN
        elif tokenizer.IsControl(token_id):
            toktype = CONTROL
        elif tokenizer.IsUnused(token_id):
            toktype = UNUSED
        elif tokenizer.IsByte(token_id):
            toktype = BYTE
        tokens[token_id] = text
        scores[token_id] = score
        toktypes[token_id] = toktype
    added_tokens_file = os.path.join(dir_model, "added_tokens.json")
    if os.path.isfile(added_tokens_file):
        with open(added_tokens_file, encoding="utf-8") as f:
            for key, token_id in json.load(f).items():
                if token_id < vocab_size:
                    tokens[token_id] = key.encode("utf-8")
                    scores[token_id] = -1000.0
                    toktypes[token_id] = USER_DEFINED
    return tokens, scores, toktypes


def llama_cpp_llama(dir_model, vocab_size):  # TextModel._create_vocab_sentencepiece
    tokens, scores, toktypes = sentencepiece_base(dir_model, vocab_size)
    with open(os.path.join(dir_model, "tokenizer_config.json"), encoding="utf-8") as f:
        added_tokens_decoder = json.load(f).get("added_tokens_decoder", {})
    for token_id, token_data in added_tokens_decoder.items():
        token_id = int(token_id)
        token = token_data["content"]
        if token_id >= vocab_size:
            continue
        if token_data.get("special") or does_token_look_special(token):
            toktypes[token_id] = CONTROL
        else:
            token = token.replace("\u2581", " ")  # pre-normalize user-defined spaces
            toktypes[token_id] = USER_DEFINED
        scores[token_id] = -1000.0
        tokens[token_id] = token.encode("utf-8")
    return tokens, scores, toktypes


def llama_cpp_phi3(dir_model, vocab_size):  # Phi3MiniModel.set_vocab
    tokens, scores, toktypes = sentencepiece_base(dir_model, vocab_size)
    with open(os.path.join(dir_model, "tokenizer_config.json"), encoding="utf-8") as f:
        added_tokens_decoder = json.load(f).get("added_tokens_decoder", {})
    with open(os.path.join(dir_model, "tokenizer.json"), encoding="utf-8") as f:
        added_tokens = json.load(f).get("added_tokens", [])
    entries = [(int(k), v) for k, v in added_tokens_decoder.items()] + [(int(a["id"]), a) for a in added_tokens]
    for token_id, data in entries:
        tokens[token_id] = data["content"].encode("utf-8")
        scores[token_id] = -1000.0
        toktypes[token_id] = CONTROL if data.get("special") else USER_DEFINED
    return tokens, scores, toktypes


def as_json(vocab):
    tokens, scores, toktypes = vocab
    return {"tokens": [t.decode("utf-8") if isinstance(t, bytes) else t for t in tokens],
            "scores": [float(s) for s in scores], "types": [int(t) for t in toktypes]}


def main():
    with open(os.path.join(TOK, "corpus.txt"), encoding="utf-8") as f:
        lines = [line for line in f.read().split("\n") if line.strip()] * 3
    os.makedirs(OUT, exist_ok=True)
    prefix = os.path.join(tempfile.mkdtemp(), "m")
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_prefix=prefix, model_type="bpe", vocab_size=700, hard_vocab_limit=False,
        byte_fallback=True, split_digits=True, allow_whitespace_only_pieces=True, normalization_rule_name="identity",
        remove_extra_whitespaces=False, add_dummy_prefix=True, unk_id=0, bos_id=1, eos_id=2, pad_id=-1,
        control_symbols=["<|end|>"], user_defined_symbols=["<think>"], character_coverage=0.995, num_threads=1,
        minloglevel=2)
    src = tempfile.mkdtemp()
    shutil.copy(prefix + ".model", os.path.join(src, "tokenizer.model"))
    with open(os.path.join(src, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump({"tokenizer_class": "LlamaTokenizer", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
                   "add_bos_token": True, "add_eos_token": False, "legacy": True}, f)
    tok = AutoTokenizer.from_pretrained(src)
    tok.chat_template = LLAMA2_TEMPLATE
    for name in os.listdir(OUT):
        os.remove(os.path.join(OUT, name))
    tok.save_pretrained(OUT)
    shutil.copy(prefix + ".model", os.path.join(OUT, "tokenizer.model"))
    with open(os.path.join(OUT, "tokenizer.json"), encoding="utf-8") as f:
        added = json.load(f)["added_tokens"]
    config_path = os.path.join(OUT, "tokenizer_config.json")
    with open(config_path, encoding="utf-8") as f:
        config = json.load(f)
    config["added_tokens_decoder"] = {
        str(a["id"]): {k: a[k] for k in ("content", "lstrip", "normalized", "rstrip", "single_word", "special")}
        for a in added}
    with open(config_path, "w", encoding="utf-8") as f:
        json.dump(config, f, ensure_ascii=False, indent=2)

    proto = model_pb2.ModelProto()
    with open(os.path.join(OUT, "tokenizer.model"), "rb") as f:
        proto.ParseFromString(f.read())
    no_model = tempfile.mkdtemp()
    for name in os.listdir(OUT):
        if name != "tokenizer.model":
            shutil.copy(os.path.join(OUT, name), no_model)
    hf = LlamaHfVocab(__import__("pathlib").Path(no_model))
    hf_tokens, hf_scores, hf_types = zip(*hf.all_tokens())
    reference = {
        "versions": {"sentencepiece": spm.__version__, "transformers": transformers.__version__,
                     "tokenizers": tokenizers.__version__, "gguf": getattr(gguf, "__version__", "?")},
        "pieces": [[p.piece, p.score, p.type] for p in proto.pieces],
        "model_type": proto.trainer_spec.model_type,
        "vocab_size": VOCAB_SIZE,
        "llama_cpp": {"llama": as_json(llama_cpp_llama(OUT, VOCAB_SIZE)), "phi3": as_json(llama_cpp_phi3(OUT, VOCAB_SIZE))},
        "llama_hf_vocab": as_json((hf_tokens, hf_scores, hf_types)),
    }
    with open(os.path.join(OUT, "reference.json"), "w", encoding="utf-8") as f:
        json.dump(reference, f, ensure_ascii=False)


if __name__ == "__main__":
    main()
