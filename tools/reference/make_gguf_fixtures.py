#!/usr/bin/env python3
"""Writes tests/fixtures/gguf/: dequantisation fixtures made by the `gguf` package (gguf.quants) and
small GGUF files written by gguf.GGUFWriter, with the Hugging Face tensors they stand for.

    pip install gguf numpy && python3 tools/reference/make_gguf_fixtures.py

quant/<TYPE>.blocks + quant/<TYPE>.f32   raw blocks and gguf.quants.dequantize of them (little-endian f32);
                                         types gguf-py quantises get half their blocks from
                                         gguf.quants.quantize, every type gets random blocks with
                                         finite f16 scales
quant/Q8_0_quantize.{input.f32,blocks}   f32 input and gguf.quants.quantize(input, Q8_0)
quant/f16_round.{input.f32,bits}         f32 values and numpy's astype(float16) bits
tiny_llama.gguf (+ .expected.safetensors) 3-layer llama, tied, one tensor type per projection, gpt2
                                         tokenizer metadata and test keys of every GGUF value type
tiny_qwen2.gguf (+ .expected.safetensors) 1-layer qwen2, q/k/v biases, untied output
The .expected files hold, per Hugging Face tensor name, `<name>:head` (first 4 rows, f32),
`<name>:rowsum` (f64 row sums of the f32 values) for matrices, and `<name>` in full for vectors.
"""
import json
import os
import struct

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize, quantize

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "fixtures", "gguf")
rng = np.random.default_rng(20261201)

# Byte offsets of the f16 scale fields in each block (the rest of a random block is left random).
SCALE_FIELDS = {T.Q8_0: [0], T.Q4_0: [0], T.Q4_1: [0, 2], T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208]}
QUANTISABLE = {T.Q8_0, T.Q4_0, T.Q4_1}  # gguf-py quantises these (bit-exact with ggml's reference)


def random_blocks(qtype, n_blocks):
    block_elems, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
    b = rng.integers(0, 256, size=(n_blocks, block_bytes), dtype=np.uint8)
    for off in SCALE_FIELDS[qtype]:
        scales = (rng.normal(0, 0.02, size=n_blocks)).astype(np.float16)
        scales[0] = 0  # a zero scale
        if n_blocks > 1:
            scales[1] = np.float16(3e-6)  # a subnormal half
        b[:, off:off + 2] = scales.view(np.uint8).reshape(n_blocks, 2)
    return b


def finite_halves(n):
    bits = rng.integers(0, 1 << 16, size=n, dtype=np.uint32).astype(np.uint16)
    bits[(bits & 0x7C00) == 0x7C00] &= 0x3FFF  # no inf/NaN from the random part
    bits[:6] = [0x0000, 0x8000, 0x0001, 0x83FF, 0x7C00, 0xFBFF]  # +-0, subnormals, inf, -max
    return bits.view(np.float16)


def write_quant_fixtures():
    d = os.path.join(OUT, "quant")
    os.makedirs(d, exist_ok=True)
    for qtype in [T.F32, T.F16, T.BF16, T.Q8_0, T.Q4_0, T.Q4_1, T.Q4_K, T.Q5_K, T.Q6_K]:
        if qtype == T.F32:
            raw = rng.normal(0, 1, size=512).astype(np.float32).view(np.uint8)
        elif qtype == T.F16:
            raw = finite_halves(512).view(np.uint8)
        elif qtype == T.BF16:
            bits = rng.integers(0, 1 << 16, size=512, dtype=np.uint32).astype(np.uint16)
            bits[(bits & 0x7F80) == 0x7F80] &= 0xBFFF  # no NaN/inf
            raw = bits.view(np.uint8)
        else:
            block_elems, _ = gguf.GGML_QUANT_SIZES[qtype]
            n_blocks = 8 if block_elems == 256 else 32
            raw = random_blocks(qtype, n_blocks)
            if qtype in QUANTISABLE:
                x = rng.normal(0, 1, size=(4, n_blocks * block_elems // 4)).astype(np.float32)
                x[0, :block_elems] = 0  # an all-zero block
                raw = np.concatenate([raw.reshape(-1), quantize(x, qtype).reshape(-1)])
            raw = raw.reshape(-1)
        f = np.asarray(dequantize(raw.reshape(1, -1), qtype), dtype=np.float32).reshape(-1)
        name = qtype.name
        raw.tofile(os.path.join(d, f"{name}.blocks"))
        f.astype("<f4").tofile(os.path.join(d, f"{name}.f32"))
    x = rng.normal(0, 1, size=(8, 64)).astype(np.float32)
    x[0, :32] = 0
    x[1, :32] = np.linspace(-2.5, 2.5, 32) * 127 / 2.5 / 60  # values on .5 boundaries after scaling
    x.astype("<f4").tofile(os.path.join(d, "Q8_0_quantize.input.f32"))
    quantize(x, T.Q8_0).tofile(os.path.join(d, "Q8_0_quantize.blocks"))
    v = np.concatenate([rng.normal(0, 1, 256), rng.normal(0, 1e-5, 128), rng.normal(0, 3e4, 64),
                        [0.0, -0.0, 65504.0, 65519.0, 65520.0, 1e9, 2.0**-24, 2.0**-25, 2.0**-25 * 1.0001,
                         2.0**-14, 1.0 + 2.0**-11, 1.0 + 3 * 2.0**-11, 6e-8]]).astype(np.float32)
    v.astype("<f4").tofile(os.path.join(d, "f16_round.input.f32"))
    with np.errstate(over="ignore"):  # 65520 and 1e9 round to inf, as intended
        v.astype(np.float16).view("<u2").tofile(os.path.join(d, "f16_round.bits"))


def permute(w, n_head, n_head_kv):
    """convert_hf_to_gguf.py LlamaModel.permute: HF q/k rows -> llama.cpp's RoPE row order."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def unpermute(w, n_head):
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_safetensors(path, tensors):
    header, blobs, off = {}, [], 0
    for name, a in tensors.items():
        a = np.ascontiguousarray(a)
        dt = {np.dtype("float32"): "F32", np.dtype("float64"): "F64"}[a.dtype]
        b = a.astype(a.dtype.newbyteorder("<")).tobytes()
        header[name] = {"dtype": dt, "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


class ModelWriter:
    """Adds tensors to a GGUFWriter in a chosen type and records the Hugging Face tensor each stands for."""

    def __init__(self, writer):
        self.w, self.expected = writer, {}

    def add(self, gguf_name, hf_name, hf_weight, qtype, perm_heads=None):
        w = hf_weight.astype(np.float32)
        g = permute(w, *perm_heads) if perm_heads else w
        if qtype in (T.F32, T.F16):
            data = quantize(g, qtype)
            self.w.add_tensor(gguf_name, data)
            deq = data.astype(np.float32)
        else:
            data = quantize(g, qtype)
            self.w.add_tensor(gguf_name, data, raw_dtype=qtype)
            deq = dequantize(data, qtype).astype(np.float32)
        hf = unpermute(deq, perm_heads[1] or perm_heads[0]) if perm_heads else deq
        if perm_heads:
            assert np.array_equal(permute(hf, *perm_heads), deq)
        self.record(hf_name, hf)

    def add_blocks(self, gguf_name, hf_name, rows, qtype):
        """A k-quant tensor gguf-py cannot quantise: random blocks with finite scales."""
        block_elems, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
        cols = 256
        data = random_blocks(qtype, rows * cols // block_elems).reshape(rows, -1)
        self.w.add_tensor(gguf_name, data, raw_dtype=qtype)
        self.record(hf_name, dequantize(data, qtype).astype(np.float32).reshape(rows, cols))

    def record(self, hf_name, a):
        if a.ndim == 1:
            self.expected[hf_name] = a
        else:
            self.expected[hf_name + ":head"] = a[:4]
            self.expected[hf_name + ":rowsum"] = a.astype(np.float64).sum(axis=1)


def tiny_vocab():
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    chars = [chr(c) for c in range(ord("a"), ord("z") + 1)] + ["Ġ", "Ċ", "!", ".", ",", "0", "1", "2"]
    merged = ["Ġt", "he", "Ġthe", "Ġa", "in", "er", "Ġs", "on", "at", "en", "Ġw", "Ġo", "is", "Ġh", "an",
              "es", "ou", "Ġc", "Ġb", "it", "or", "Ġf", "ed", "ar", "ing", "Ġm", "Ġp", "al", "re"]
    tokens = specials + chars + merged
    merges = ["Ġ t", "h e", "Ġt he", "Ġ a", "i n", "e r", "Ġ s", "o n", "a t", "e n", "Ġ w", "Ġ o", "i s",
              "Ġ h", "a n", "e s", "o u", "Ġ c", "Ġ b", "i t", "o r", "Ġ f", "e d", "a r", "in g", "Ġ m", "Ġ p",
              "a l", "r e"]
    types = [3, 3, 3] + [1] * (len(chars) + len(merged))
    return tokens, merges, types


def write_tiny_llama():
    hidden, n_head, n_kv, ff, n_layer = 32, 4, 2, 256, 3
    head_dim = hidden // n_head
    tokens, merges, types = tiny_vocab()
    vocab = len(tokens)
    path = os.path.join(OUT, "tiny_llama.gguf")
    w = gguf.GGUFWriter(path, "llama")
    w.add_name("tiny-llama")
    w.add_context_length(128)
    w.add_embedding_length(hidden)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(50000.0)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
    w.add_rope_scaling_factor(2.0)
    w.add_vocab_size(vocab)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_pad_token_id(0)
    w.add_chat_template("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}")
    # Test keys: every GGUF value type and an array of arrays of strings.
    w.add_uint8("loom.test.u8", 200)
    w.add_int8("loom.test.i8", -100)
    w.add_uint16("loom.test.u16", 60000)
    w.add_int16("loom.test.i16", -30000)
    w.add_uint32("loom.test.u32", 4000000000)
    w.add_int32("loom.test.i32", -2000000000)
    w.add_float32("loom.test.f32", 0.25)
    w.add_bool("loom.test.bool", True)
    w.add_string("loom.test.str", "héllo ✓")
    w.add_uint64("loom.test.u64", 2**63 + 5)
    w.add_int64("loom.test.i64", -(2**62))
    w.add_float64("loom.test.f64", -1.5e300)
    w.add_array("loom.test.nested", [["a", "bc"], ["def"], ["", "g", "h"]])
    w.add_array("loom.test.f32s", [1.0, -2.0, 0.5])

    m = ModelWriter(w)
    normal = lambda *s: rng.normal(0, 0.5, size=s).astype(np.float32)  # noqa: E731
    m.add("token_embd.weight", "model.embed_tokens.weight", normal(vocab, hidden), T.Q8_0)
    types_per_layer = [
        dict(q=T.Q8_0, k=T.Q4_0, v=T.Q4_1, o=T.F16, gate=T.Q8_0, up=T.Q4_1, down=T.Q4_K),
        dict(q=T.F16, k=T.Q8_0, v=T.BF16, o=T.Q4_0, gate=T.Q4_0, up=T.F32, down=T.Q5_K),
        dict(q=T.Q4_1, k=T.F32, v=T.Q8_0, o=T.Q8_0, gate=T.BF16, up=T.Q8_0, down=T.Q6_K),
    ]
    for i, t in enumerate(types_per_layer):
        p, h = f"blk.{i}.", f"model.layers.{i}."
        m.add(p + "attn_norm.weight", h + "input_layernorm.weight", 1 + 0.1 * normal(hidden), T.F32)
        m.add(p + "attn_q.weight", h + "self_attn.q_proj.weight", normal(n_head * head_dim, hidden), t["q"], (n_head, n_head))
        m.add(p + "attn_k.weight", h + "self_attn.k_proj.weight", normal(n_kv * head_dim, hidden), t["k"], (n_head, n_kv))
        m.add(p + "attn_v.weight", h + "self_attn.v_proj.weight", normal(n_kv * head_dim, hidden), t["v"])
        m.add(p + "attn_output.weight", h + "self_attn.o_proj.weight", normal(hidden, n_head * head_dim), t["o"])
        m.add(p + "ffn_norm.weight", h + "post_attention_layernorm.weight", 1 + 0.1 * normal(hidden), T.F32)
        m.add(p + "ffn_gate.weight", h + "mlp.gate_proj.weight", normal(ff, hidden), t["gate"])
        m.add(p + "ffn_up.weight", h + "mlp.up_proj.weight", normal(ff, hidden), t["up"])
        m.add_blocks(p + "ffn_down.weight", h + "mlp.down_proj.weight", hidden, t["down"])
    m.add("output_norm.weight", "model.norm.weight", 1 + 0.1 * normal(hidden), T.F32)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    write_safetensors(os.path.join(OUT, "tiny_llama.expected.safetensors"), m.expected)


def write_tiny_qwen2():
    hidden, n_head, n_kv, ff, vocab = 32, 4, 2, 64, 64
    head_dim = hidden // n_head
    path = os.path.join(OUT, "tiny_qwen2.gguf")
    w = gguf.GGUFWriter(path, "qwen2")
    w.add_context_length(256)
    w.add_embedding_length(hidden)
    w.add_block_count(1)
    w.add_feed_forward_length(ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(1000000.0)
    m = ModelWriter(w)
    normal = lambda *s: rng.normal(0, 0.5, size=s).astype(np.float32)  # noqa: E731
    m.add("token_embd.weight", "model.embed_tokens.weight", normal(vocab, hidden), T.F16)
    p, h = "blk.0.", "model.layers.0."
    m.add(p + "attn_norm.weight", h + "input_layernorm.weight", normal(hidden), T.F32)
    for g, n, rows in (("attn_q", "q_proj", n_head * head_dim), ("attn_k", "k_proj", n_kv * head_dim),
                       ("attn_v", "v_proj", n_kv * head_dim)):
        m.add(p + g + ".weight", h + "self_attn." + n + ".weight", normal(rows, hidden), T.Q8_0)  # qwen2: no permutation
        m.add(p + g + ".bias", h + "self_attn." + n + ".bias", normal(rows), T.F32)
    m.add(p + "attn_output.weight", h + "self_attn.o_proj.weight", normal(hidden, hidden), T.BF16)
    m.add(p + "ffn_norm.weight", h + "post_attention_layernorm.weight", normal(hidden), T.F32)
    m.add(p + "ffn_gate.weight", h + "mlp.gate_proj.weight", normal(ff, hidden), T.Q4_0)
    m.add(p + "ffn_up.weight", h + "mlp.up_proj.weight", normal(ff, hidden), T.Q4_1)
    m.add(p + "ffn_down.weight", h + "mlp.down_proj.weight", normal(hidden, ff), T.Q8_0)
    m.add("output_norm.weight", "model.norm.weight", normal(hidden), T.F32)
    m.add("output.weight", "lm_head.weight", normal(vocab, hidden), T.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    write_safetensors(os.path.join(OUT, "tiny_qwen2.expected.safetensors"), m.expected)


if __name__ == "__main__":
    os.makedirs(OUT, exist_ok=True)
    write_quant_fixtures()
    write_tiny_llama()
    write_tiny_qwen2()
    total = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(OUT) for f in fs)
    print(f"wrote {OUT} ({total / 1024:.0f} KiB)")
