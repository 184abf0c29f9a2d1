#!/usr/bin/env python3
# Writes the seed inputs of the libFuzzer targets (tests/fuzz/corpus/<target>/seed_*) from the test
# fixtures, in each target's input format. Regression inputs (finding_*) are kept as they are.
import glob
import json
import os
import shutil
import struct

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
FIX = os.path.join(ROOT, "tests", "fixtures")
CORPUS = os.path.join(ROOT, "tests", "fuzz", "corpus")


def out(target, name, data):
    d = os.path.join(CORPUS, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "seed_" + name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def read(rel):
    with open(os.path.join(FIX, rel), "rb") as f:
        return f.read()


def safetensors(tensors, metadata=None):
    """tensors: [(name, dtype, shape, bytes)] -> a safetensors file."""
    header, blobs, off = {}, [], 0
    if metadata:
        header["__metadata__"] = metadata
    for name, dtype, shape, data in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(data)]}
        blobs.append(data)
        off += len(data)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + b"".join(blobs)


def read_safetensors(rel):
    b = read(rel)
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    return {k: (v["dtype"], v["shape"], b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]])
            for k, v in h.items() if k != "__metadata__"}


def fdp_string(s):
    """libFuzzer's FuzzedDataProvider::ConsumeRandomLengthString: '\\' doubled, '\\' + other ends it."""
    return s.replace(b"\\", b"\\\\") + b"\\;"


def main():
    # safetensors: small real files of each kind of content.
    out("fuzz_sentencepiece_model", "spm_model", read("tokenizers/spm_model/tokenizer.model"))
    out("fuzz_safetensors", "inputs", read("models/llama/inputs.safetensors"))
    out("fuzz_safetensors", "adapter", read("models/llama/adapter/adapter_model.safetensors"))
    out("fuzz_safetensors", "gguf_expected", read("gguf/tiny_qwen2.expected.safetensors"))
    # config.json of every family, dense and bitsandbytes.
    for p in sorted(glob.glob(os.path.join(FIX, "models", "*", "config.json")) +
                    glob.glob(os.path.join(FIX, "bnb", "models", "*", "config.json"))):
        fam = os.path.relpath(os.path.dirname(p), FIX).replace("/", "_")
        out("fuzz_config", fam, open(p, "rb").read())
        c = json.load(open(p))
        if "rope_parameters" in c:  # the transformers 4.x key form of the same config
            rp = c.pop("rope_parameters")
            c["rope_theta"] = rp.get("rope_theta", 10000.0)
            if rp.get("rope_type", "default") != "default":
                c["rope_scaling"] = rp
            out("fuzz_config", fam + "_4x", json.dumps(c, indent=2))
    # tokenizer.json of each kind.
    for name in ("llama3", "qwen2", "llama2", "gemma"):
        out("fuzz_tokenizer_load", name, read(f"tokenizers/{name}/tokenizer.json"))
    corpus = read("tokenizers/corpus.txt")
    for i, line in enumerate(corpus.split(b"\n")[:8]):
        out("fuzz_tokenizer_encode", f"line{i}", bytes([i]) + line)
    out("fuzz_tokenizer_encode", "specials", bytes([4]) + b"<|im_start|>user\nhi<|im_end|><s></s><0x41>\xff\xfe")
    # adapter_config.json of each family.
    for p in sorted(glob.glob(os.path.join(FIX, "models", "*", "adapter", "adapter_config.json"))):
        out("fuzz_adapter_config", os.path.basename(os.path.dirname(os.path.dirname(p))), open(p, "rb").read())
    # JSONL: the three shapes (sizes differ so each template/option combination gets a seed).
    cases = json.load(open(os.path.join(FIX, "chat", "cases.json")))
    out("fuzz_jsonl", "text", '{"text": "Hello world, this is a test."}\n\n{"text": "Second line", "id": 7}\n')
    out("fuzz_jsonl", "prompt_completion", '{"prompt": "Translate: cat", "completion": " chat"}\r\n')
    out("fuzz_jsonl", "messages", "".join(json.dumps({"messages": c["messages"]}) + "\n" for c in cases[:4]))
    out("fuzz_jsonl", "mixed", '{"text": "a"}\n{"prompt": "p", "completion": "c"}\n' +
        json.dumps({"messages": cases[0]["messages"]}) + "\n{\"foo\": 1}\n")
    # Chat template: name, generation prompt, tokenizer_config.json, config.json, then the messages.
    for i, c in enumerate(cases[:6]):
        tmpl = open(os.path.join(FIX, "chat", ["qwen2_5.jinja", "llama3_1.jinja", "gemma3.jinja"][i % 3])).read()
        data = fdp_string(c["template"].encode()) + fdp_string(json.dumps({"chat_template": tmpl}).encode())
        data += fdp_string(json.dumps({"model_type": "qwen2"}).encode())
        for m in c["messages"]:
            data += fdp_string(m["role"].encode()) + fdp_string(m["content"].encode())
        out("fuzz_chat_template", f"case{i}", data)
    # Training checkpoint: trainer_state.json then optimizer.safetensors.
    state = {"step": 7, "epoch": 0, "loader": {"epoch": 0, "cursor": 3, "offset": 0}, "mode": "lora"}
    optim = safetensors([("step", "I64", [], struct.pack("<q", 7)),
                         ("0.exp_avg", "F32", [2, 2], struct.pack("<4f", 0.1, 0.2, 0.3, 0.4)),
                         ("0.exp_avg_sq", "F32", [2, 2], struct.pack("<4f", 1, 2, 3, 4))])
    out("fuzz_train_checkpoint", "lora", fdp_string(json.dumps(state).encode()) + optim)
    # GGUF: the tiny models (metadata of every kind, tokenizer, f32/f16/quantised tensors).
    out("fuzz_gguf", "tiny_qwen2", read("gguf/tiny_qwen2.gguf"))
    out("fuzz_gguf", "tiny_llama", read("gguf/tiny_llama.gguf"))
    # bitsandbytes: the quantization_config (a whole config.json) and one 4-bit weight's tensors.
    out("fuzz_bnb", "config", read("bnb/models/llama/config.json"))
    st = read_safetensors("bnb/models/llama/model.safetensors")
    w = "model.layers.0.self_attn.k_proj.weight"
    keep = [k for k in sorted(st) if k == w or k.startswith(w + ".")]
    out("fuzz_bnb", "k_proj", safetensors([(k,) + st[k] for k in keep], {"format": "pt"}))


if __name__ == "__main__":
    main()
