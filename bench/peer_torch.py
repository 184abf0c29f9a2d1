#!/usr/bin/env python3
"""PyTorch peer of loom_bench: times the same operations, at the same sizes and under the same
benchmark names, with torch.cuda.Event timing, and writes the medians to a JSON file that
bench/compare.py reads beside loom_bench's Google Benchmark JSON.

    python3 bench/peer_torch.py --out OUTDIR/torch.json [--filter REGEX] [--min-time 0.5] [--list]

Each case is timed in batches of launches (each batch ~2 ms, so the launch latency of the first
launch does not count) until --min-time seconds of GPU time and at least 5 batches; the reported
time is the median over batches of the per-launch time. Backward cases time
torch.autograd.grad(..., retain_graph=True) on a graph built once, outside the timing.
A case may have several variants (e.g. AdamW forloop / foreach / fused); each is one entry.
"""
import argparse
import heapq
import json
import math
import re
import statistics
import sys
import time

import torch
import torch.nn.functional as F

MI = 1 << 20
BF16, F32 = torch.bfloat16, torch.float32
DEV = "cuda"


def rand(shape, dtype, lo=-1.0, hi=1.0):
    """Uniform values in [lo, hi), never zeros (as loom_bench fills its inputs)."""
    return torch.empty(shape, dtype=dtype, device=DEV).uniform_(lo, hi)


def time_fn(fn, min_time, target_batch_s=2e-3, max_batch=256):
    """Median seconds per call of fn over batches timed with CUDA events, and the number of calls."""
    fn()
    torch.cuda.synchronize()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    stop.record()
    stop.synchronize()
    one = max(start.elapsed_time(stop) * 1e-3, 1e-7)
    batch = min(max(math.ceil(target_batch_s / one), 1), max_batch)
    samples, total = [], 0.0
    while (total < min_time or len(samples) < 5) and len(samples) < 2000:
        start.record()
        for _ in range(batch):
            fn()
        stop.record()
        stop.synchronize()
        t = start.elapsed_time(stop) * 1e-3
        samples.append(t / batch)
        total += t
    return statistics.median(samples), min(samples), len(samples) * batch


def grad_fn(out, inputs, dout):
    """The backward of a graph built once: gradients of `out` w.r.t. inputs for upstream dout."""
    return lambda: torch.autograd.grad(out, inputs, dout, retain_graph=True)


def leaf(t):
    return t.detach().requires_grad_(True)


# ---- cases: each yields (name, variant, fn); sizes mirror bench/bench_*.cpp -----------------------

def elementwise_cases():
    n = 128 * MI
    for dt, dn in ((F32, "f32"), (BF16, "bf16")):
        tail = f"/{dn}/128Mi"

        def axpby(dt=dt):
            a, b, out = rand(n, dt), rand(n, dt), torch.empty(n, dtype=dt, device=DEV)
            return lambda: torch.add(a, b, alpha=-0.5, out=out)

        def mul(dt=dt):
            a, b, out = rand(n, dt), rand(n, dt), torch.empty(n, dtype=dt, device=DEV)
            return lambda: torch.mul(a, b, out=out)

        def scale(dt=dt):
            a, out = rand(n, dt), torch.empty(n, dtype=dt, device=DEV)
            return lambda: torch.mul(a, 0.75, out=out)

        def sum_squares(dt=dt):
            a = rand(n, dt)
            return lambda: torch.linalg.vector_norm(a, dtype=F32)

        yield "axpby" + tail, "add_alpha", axpby
        yield "mul" + tail, "", mul
        yield "scale" + tail, "", scale
        yield "sum_squares" + tail, "vector_norm", sum_squares

    rows, cols = 16384, 4096

    def add_bias():
        a, bias, out = rand((rows, cols), BF16), rand(cols, BF16), torch.empty((rows, cols), dtype=BF16, device=DEV)
        return lambda: torch.add(a, bias, out=out)

    def sum_rows():
        a, out = rand((rows, cols), BF16), torch.empty(cols, dtype=F32, device=DEV)
        return lambda: torch.sum(a, dim=0, dtype=F32, out=out)

    def fill():
        out = torch.empty(n, dtype=BF16, device=DEV)
        return lambda: out.fill_(0.5)

    def sum_all():
        a = rand(n, BF16)
        return lambda: torch.sum(a, dtype=F32)

    yield f"add_bias/bf16/{rows}x{cols}", "", add_bias
    yield f"sum_rows/bf16_to_f32/{rows}x{cols}", "", sum_rows
    yield "fill/bf16/128Mi", "", fill
    yield "sum/bf16/128Mi", "", sum_all

    sq = 8192
    for dt, dn in ((F32, "f32"), (BF16, "bf16"), (torch.int32, "i32")):
        def transpose(dt=dt):
            if dt == torch.int32:
                src = torch.randint(-2**31, 2**31 - 1, (sq, sq), dtype=dt, device=DEV)
            else:
                src = rand((sq, sq), dt)
            dst = torch.empty((sq, sq), dtype=dt, device=DEV)
            return lambda: dst.copy_(src.t())
        yield ("transpose_bytes" if dt == torch.int32 else "transpose") + f"/{dn}/{sq}x{sq}", "copy_t", transpose

    for s, d, sn, dn in ((F32, BF16, "f32", "bf16"), (BF16, F32, "bf16", "f32")):
        def cast(s=s, d=d):
            src, dst = rand(n, s), torch.empty(n, dtype=d, device=DEV)
            return lambda: dst.copy_(src)
        yield f"cast/{sn}_to_{dn}/128Mi", "copy", cast


def gemm_cases():
    def mm(m, n, k, ta, tb, dt):
        def make():
            torch.backends.cuda.matmul.allow_tf32 = False  # Loom's f32 GEMM is CUBLAS_COMPUTE_32F
            a = rand((k, m) if ta else (m, k), dt)
            b = rand((n, k) if tb else (k, n), dt)
            c = torch.empty((m, n), dtype=dt, device=DEV)
            a_op, b_op = (a.t() if ta else a), (b.t() if tb else b)
            return lambda: torch.matmul(a_op, b_op, out=c)
        return make

    def name(m, n, k):
        return f"{m}x{n}x{k}"

    yield "gemm/bf16/" + name(4096, 4096, 4096), "matmul", mm(4096, 4096, 4096, False, False, BF16)
    yield "gemm/bf16/" + name(8192, 8192, 8192), "matmul", mm(8192, 8192, 8192, False, False, BF16)
    yield "gemm/bf16/llama7b_mlp_fwd/" + name(8192, 11008, 4096), "matmul", mm(8192, 11008, 4096, False, True, BF16)
    yield "gemm/bf16/llama7b_mlp_dgrad/" + name(8192, 4096, 11008), "matmul", mm(8192, 4096, 11008, False, False, BF16)
    yield "gemm/bf16/llama7b_mlp_wgrad/" + name(11008, 4096, 8192), "matmul", mm(11008, 4096, 8192, True, False, BF16)
    yield "gemm/f32/" + name(4096, 4096, 4096), "matmul_no_tf32", mm(4096, 4096, 4096, False, False, F32)


def hf_rms_norm(x, w, eps):
    """transformers' LlamaRMSNorm.forward."""
    h = x.to(F32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return w * h.to(x.dtype)


def nn_cases():
    rows, cols, eps = 16384, 4096, 1e-5
    shape = f"/bf16/{rows}x{cols}"
    norms = (("F.rms_norm", lambda x, w: F.rms_norm(x, (cols,), w, eps)), ("hf", lambda x, w: hf_rms_norm(x, w, eps)))
    for variant, norm in norms:
        def fwd(norm=norm):
            x, w = rand((rows, cols), BF16), rand(cols, BF16)
            return lambda: norm(x, w)

        def bwd(norm=norm):
            x, w, dy = leaf(rand((rows, cols), BF16)), leaf(rand(cols, BF16)), rand((rows, cols), BF16)
            return grad_fn(norm(x, w), (x, w), dy)
        yield "rms_norm_fwd" + shape, variant, fwd
        yield "rms_norm_bwd" + shape, variant, bwd

    tokens, heads, hd, seq = 16384, 32, 128, 2048

    def rope_tables():
        inv_freq = 1.0 / (500000.0 ** (torch.arange(0, hd, 2, dtype=torch.int64, device=DEV).float() / hd))
        pos = (torch.arange(tokens, device=DEV) % seq).float()
        freqs = pos[:, None] * inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(BF16)[:, None, :], emb.sin().to(BF16)[:, None, :]

    def rotate(x, cos, sin):
        x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
        return x * cos + torch.cat((-x2, x1), dim=-1) * sin

    rshape = f"/bf16/{tokens}x{heads}x{hd}"

    def rope_fwd():
        cos, sin = rope_tables()
        x = rand((tokens, heads, hd), BF16)
        return lambda: rotate(x, cos, sin)

    def rope_bwd():
        cos, sin = rope_tables()
        x, dy = leaf(rand((tokens, heads, hd), BF16)), rand((tokens, heads, hd), BF16)
        return grad_fn(rotate(x, cos, sin), (x,), dy)
    yield "rope_fwd" + rshape, "hf_rotate_half", rope_fwd
    yield "rope_bwd" + rshape, "hf_rotate_half", rope_bwd

    mt, inter = 8192, 11008
    gshape = f"/bf16/{mt}x{inter}"
    acts = (("swiglu", "silu*up", F.silu), ("geglu", "gelu_tanh*up", lambda g: F.gelu(g, approximate="tanh")))
    for base, variant, act in acts:
        def fwd(act=act):
            g, u = rand((mt, inter), BF16, -4.0, 4.0), rand((mt, inter), BF16)
            return lambda: act(g) * u

        def bwd(act=act):
            g, u = leaf(rand((mt, inter), BF16, -4.0, 4.0)), leaf(rand((mt, inter), BF16))
            dout = rand((mt, inter), BF16)
            return grad_fn(act(g) * u, (g, u), dout)
        yield base + "_fwd" + gshape, variant, fwd
        yield base + "_bwd" + gshape, variant, bwd

    n, dim, vocab = 16384, 4096, 128256
    eshape = f"/bf16/{n}x{dim}/vocab{vocab}"

    def emb_fwd():
        ids, table = torch.randint(0, vocab, (n,), device=DEV), rand((vocab, dim), BF16)
        return lambda: F.embedding(ids, table)

    def emb_bwd():
        ids, table, dout = torch.randint(0, vocab, (n,), device=DEV), leaf(rand((vocab, dim), BF16)), rand((n, dim), BF16)
        return grad_fn(F.embedding(ids, table), (table,), dout)
    yield "embedding_fwd" + eshape, "", emb_fwd
    yield "embedding_bwd" + eshape, "dense_grad", emb_bwd


# Results a case measured itself (peak memory; a single timed run), by (name, variant); main()
# merges them into the case's entry. A make() that returns None has timed itself here.
EXTRA = {}


def attention_cases():
    """Causal SDPA in Loom's bench shapes: fwd, bwd (autograd.grad of a built graph), fwdbwd (both,
    with the peak memory of one step). Windows and packed documents take a boolean mask (the
    memory-efficient or math kernel, what transformers' sdpa path does); plain causal takes
    is_causal (flash)."""
    def name(b, s, h, kv, d, window=0, doc=0):
        n = f"/bf16/b{b}_s{s}_h{h}_kv{kv}_d{d}"
        return n + (f"_w{window}" if window else "") + (f"_doc{doc}" if doc else "")

    def qkv(b, s, h, kv, d, grad, repeat):
        # Loom's layout [b, s, heads, d]; SDPA takes [b, heads, s, d]: transposed views, no copies.
        q = rand((b, s, h, d), BF16).transpose(1, 2)
        k = rand((b, s, kv, d), BF16).transpose(1, 2)
        v = rand((b, s, kv, d), BF16).transpose(1, 2)
        if repeat:
            k, v = k.repeat_interleave(h // kv, dim=1), v.repeat_interleave(h // kv, dim=1)
        if grad:
            q, k, v = leaf(q), leaf(k), leaf(v)
        return q, k, v

    def mask_of(s, window, doc):
        i = torch.arange(s, device=DEV)[:, None]
        j = torch.arange(s, device=DEV)[None, :]
        m = j <= i
        if window:
            m &= (i - j) < window
        if doc:
            m &= (i // doc) == (j // doc)
        return m

    def cases(b, s, h, kv, d, window=0, doc=0, variants=(("enable_gqa", False), ("repeat_kv", True))):
        shape = name(b, s, h, kv, d, window, doc)
        mask = mask_of(s, window, doc) if (window or doc) else None
        for variant, repeat in variants:
            def sdpa(q, k, v, repeat=repeat):
                if mask is not None:
                    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=not repeat)
                return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=not repeat)

            def fwd(repeat=repeat, sdpa=sdpa):
                q, k, v = qkv(b, s, h, kv, d, False, repeat)
                return lambda: sdpa(q, k, v)

            def bwd(repeat=repeat, sdpa=sdpa):
                q, k, v = qkv(b, s, h, kv, d, True, repeat)
                out = sdpa(q, k, v)
                return grad_fn(out, (q, k, v), torch.randn_like(out))

            def fwdbwd(repeat=repeat, sdpa=sdpa, variant=variant):
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
                base = torch.cuda.memory_allocated()
                q, k, v = qkv(b, s, h, kv, d, True, repeat)
                dout = rand((b, h, s, d), BF16)

                def step():
                    out = sdpa(q, k, v)
                    torch.autograd.grad(out, (q, k, v), dout)
                step()
                torch.cuda.synchronize()
                EXTRA[("attention_fwdbwd" + shape, variant)] = {
                    "peak_bytes": torch.cuda.max_memory_allocated() - base}
                return step
            yield "attention_fwd" + shape, variant, fwd
            yield "attention_bwd" + shape, variant, bwd
            yield "attention_fwdbwd" + shape, variant, fwdbwd

    H, KV = 32, 8
    yield from cases(4, 2048, H, KV, 128)
    yield from cases(4, 2048, H, KV, 64)
    yield from cases(4, 2048, 16, 8, 256)
    yield from cases(1, 8192, H, KV, 128)
    yield from cases(1, 32768, H, KV, 128, variants=(("enable_gqa", False),))
    yield from cases(1, 8192, H, KV, 128, window=4096, variants=(("repeat_kv", True),))
    yield from cases(4, 2048, H, KV, 128, doc=512, variants=(("repeat_kv", True),))
    yield from cases(4, 2048, 8, 4, 256, window=1024, variants=(("repeat_kv", True),))  # Gemma 3's sliding layers

    def once_128k():
        """One forward + backward at 128k tokens, timed once, with its peak memory."""
        s = 131072
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        q, k, v = qkv(1, s, H, KV, 128, True, False)
        dout = rand((1, H, s, 128), BF16)
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        torch.autograd.grad(out, (q, k, v), dout)
        stop.record()
        stop.synchronize()
        t = start.elapsed_time(stop) * 1e-3
        EXTRA[("attention_fwdbwd" + name(1, s, H, KV, 128), "enable_gqa")] = {
            "median_s": t, "min_s": t, "calls": 1, "peak_bytes": torch.cuda.max_memory_allocated() - base}
        return None
    yield "attention_fwdbwd" + name(1, 131072, H, KV, 128), "enable_gqa", once_128k


def loss_cases():
    # Linear + cross-entropy as transformers computes it: bf16 logits h @ W^T, then F.cross_entropy;
    # forward + backward, W frozen (LoRA) or trained; the peak memory above the inputs.
    rows, vocab, hidden = 8192, 128256, 4096
    for variant_name, train_w in (("frozen", False), ("trained", True)):
        def lce(train_w=train_w, variant_name=variant_name):
            h = leaf(rand((rows, hidden), BF16))
            w = rand((vocab, hidden), BF16, -0.02, 0.02)
            if train_w:
                w = leaf(w)
            t = torch.randint(0, vocab, (rows,), device=DEV)
            inputs = (h, w) if train_w else (h,)
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()

            def step():
                loss = F.cross_entropy(h @ w.T, t)
                torch.autograd.grad(loss, inputs)
            step()
            torch.cuda.synchronize()
            EXTRA[(f"linear_cross_entropy_fwdbwd/bf16/{rows}x{vocab}x{hidden}_{variant_name}", "")] = {
                "peak_bytes": torch.cuda.max_memory_allocated() - base}
            return step
        yield f"linear_cross_entropy_fwdbwd/bf16/{rows}x{vocab}x{hidden}_{variant_name}", "", lce

    n = 8192
    for vocab in (32000, 128256):
        def ce_fwd(vocab=vocab):
            logits, t = rand((n, vocab), BF16, -8.0, 8.0), torch.randint(0, vocab, (n,), device=DEV)
            return lambda: F.cross_entropy(logits, t, reduction="none")

        def ce_bwd(vocab=vocab):
            logits, t = leaf(rand((n, vocab), BF16, -8.0, 8.0)), torch.randint(0, vocab, (n,), device=DEV)
            loss = F.cross_entropy(logits, t, reduction="none")
            return grad_fn(loss, (logits,), rand(n, BF16, 0.5, 1.0))
        yield f"cross_entropy_fwd/bf16/{n}x{vocab}", "", ce_fwd
        yield f"cross_entropy_bwd/bf16/{n}x{vocab}", "", ce_bwd


def optim_cases():
    n = 64 * MI
    variants = (("forloop", dict(foreach=False, fused=False)), ("foreach", dict(foreach=True)), ("fused", dict(fused=True)))
    for variant, kw in variants:
        def adamw(kw=kw):
            p = torch.nn.Parameter(rand(n, F32))
            p.grad = rand(n, F32, -1e-2, 1e-2)
            opt = torch.optim.AdamW([p], lr=1e-4, weight_decay=0.01, **kw)
            opt.step()  # creates the state outside the timing
            return opt.step
        yield "adamw/f32grad/64Mi", variant, adamw

    # Loom's bf16-gradient step also writes a bf16 copy of the weights; torch's AdamW needs the
    # gradient in the parameter's dtype, so the peer is the fused f32 step plus a copy to bf16.
    def adamw_copy():
        p = torch.nn.Parameter(rand(n, F32))
        p.grad = rand(n, F32, -1e-2, 1e-2)
        p16 = torch.empty(n, dtype=BF16, device=DEV)
        opt = torch.optim.AdamW([p], lr=1e-4, weight_decay=0.01, fused=True)
        opt.step()

        def step():
            opt.step()
            with torch.no_grad():
                p16.copy_(p)
        return step
    yield "adamw/bf16grad_bf16copy/64Mi", "fused+copy(f32grad)", adamw_copy

    m = 256 * MI
    for dt, dn in ((F32, "f32"), (BF16, "bf16")):
        def uni(dt=dt):
            x = torch.empty(m, dtype=dt, device=DEV)
            return lambda: x.uniform_(-1.0, 1.0)

        def nrm(dt=dt):
            x = torch.empty(m, dtype=dt, device=DEV)
            return lambda: x.normal_(0.0, 1.0)
        yield f"uniform_fill/{dn}/256Mi", "", uni
        yield f"normal_fill/{dn}/256Mi", "", nrm


def quant_cases():
    """bitsandbytes' NF4 (double-quantised, blocks of 64) on the Llama-3-8B MLP weight shape, when
    bitsandbytes imports (the wheel in ../shared/peers/); no cases otherwise."""
    try:
        import bitsandbytes.functional as bnbf
    except Exception as e:  # not installed, or no CUDA library for this machine
        print(f"peer_torch.py: bitsandbytes not importable ({type(e).__name__}: {e}); no nf4 peer", file=sys.stderr)
        return
    rows, cols = 14336, 4096
    shape = f"/{rows}x{cols}"
    for dt, dn in ((BF16, "bf16"), (F32, "f32")):
        def deq(dt=dt):
            w = rand((rows, cols), dt, -0.05, 0.05)
            packed, qs = bnbf.quantize_4bit(w, blocksize=64, compress_statistics=True, quant_type="nf4")
            out = torch.empty((rows, cols), dtype=dt, device=DEV)
            return lambda: bnbf.dequantize_4bit(packed, qs, out=out)
        yield "nf4_dequantize/" + dn + shape, "bnb", deq

    def quant():
        w = rand((rows, cols), BF16, -0.05, 0.05)
        return lambda: bnbf.quantize_4bit(w, blocksize=64, compress_statistics=True, quant_type="nf4")
    yield "nf4_quantize/bf16" + shape, "bnb", quant


# ---- grouped expert GEMMs (bench/bench_grouped_gemm.cpp) -------------------------------------------

_M64 = (1 << 64) - 1


def _splitmix64(x):
    x = (x + 0x9E3779B97F4A7C15) & _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


def _uniform(stream, i):
    return ((_splitmix64(((stream << 32) + i) & _M64) >> 11) + 0.5) * 2.0 ** -53


def routing_counts(experts, top_k, tokens):
    """Rows per expert as bench_grouped_gemm.cpp's routing_offsets draws them (the same numbers): each
    token's top_k experts sampled without replacement from softmax(logits) by Gumbel top-k."""
    logit = [math.sqrt(3.0) * (2.0 * _uniform(1, e) - 1.0) for e in range(experts)]
    counts = [0] * experts
    for t in range(tokens):
        score = [logit[e] - math.log(-math.log(_uniform(2, t * experts + e))) for e in range(experts)]
        for e in heapq.nlargest(top_k, range(experts), key=score.__getitem__):
            counts[e] += 1
    return counts


MOE_SHAPES = (  # name, hidden, expert width, experts, top k, tokens
    ("qwen3_30b_a3b", 2048, 768, 128, 8, 4 * 2048),
    ("mixtral_8x7b", 4096, 14336, 8, 2, 4 * 2048),
)


def moe_cases():
    """Each expert projection (weights [E, out, in]) forward, dgrad and wgrad through torch._grouped_mm
    (the 2d x 3d and 2d x 2d forms MoE training uses, offs = the experts' cumulative row ends), and a
    per-expert torch.mm loop (transformers' eager experts)."""
    for name, hidden, width, experts, top_k, tokens in MOE_SHAPES:
        counts = routing_counts(experts, top_k, tokens)
        ends = [0]
        for c in counts:
            ends.append(ends[-1] + c)
        n = ends[-1]
        for proj, fin, fout in (("gate_up", hidden, 2 * width), ("down", width, hidden)):
            base = f"grouped_gemm/bf16/{name}/{proj}"

            def grouped(kind, fin=fin, fout=fout, n=n, ends=ends, experts=experts):
                def make():
                    offs = torch.tensor(ends[1:], dtype=torch.int32, device=DEV)
                    if kind == "fwd":  # y [N, out] = x [N, in] w_e^T
                        x, w = rand((n, fin), BF16), rand((experts, fout, fin), BF16)
                        wt = w.transpose(-2, -1)
                        return lambda: torch._grouped_mm(x, wt, offs)
                    if kind == "dgrad":  # dx [N, in] = dy [N, out] w_e
                        dy, w = rand((n, fout), BF16), rand((experts, fout, fin), BF16)
                        return lambda: torch._grouped_mm(dy, w, offs)
                    dy, x = rand((n, fout), BF16), rand((n, fin), BF16)  # dw [E, out, in] = dy_e^T x_e
                    dyt = dy.t()
                    return lambda: torch._grouped_mm(dyt, x, offs)
                return make

            def loop(kind, fin=fin, fout=fout, n=n, ends=ends, experts=experts):
                def make():
                    spans = [(e, ends[e], ends[e + 1]) for e in range(experts) if ends[e + 1] > ends[e]]
                    w = rand((experts, fout, fin), BF16)
                    if kind == "fwd":
                        x, y = rand((n, fin), BF16), torch.empty((n, fout), dtype=BF16, device=DEV)
                        return lambda: [torch.mm(x[a:b], w[e].t(), out=y[a:b]) for e, a, b in spans]
                    dy = rand((n, fout), BF16)
                    if kind == "dgrad":
                        dx = torch.empty((n, fin), dtype=BF16, device=DEV)
                        return lambda: [torch.mm(dy[a:b], w[e], out=dx[a:b]) for e, a, b in spans]
                    x, dw = rand((n, fin), BF16), torch.empty_like(w)
                    return lambda: [torch.mm(dy[a:b].t(), x[a:b], out=dw[e]) for e, a, b in spans]
                return make

            for kind in ("fwd", "dgrad", "wgrad"):
                yield f"{base}_{kind}", "_grouped_mm", grouped(kind)
                yield f"{base}_{kind}", "mm_loop", loop(kind)


def all_cases():
    for gen in (elementwise_cases, gemm_cases, nn_cases, attention_cases, loss_cases, optim_cases, quant_cases,
                moe_cases):
        yield from gen()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", help="JSON file to write (required unless --list)")
    ap.add_argument("--filter", default="", help="regular expression on benchmark names (re.search)")
    ap.add_argument("--min-time", type=float, default=0.5, help="GPU seconds per case (default 0.5)")
    ap.add_argument("--list", action="store_true", help="print the case names and variants, run nothing")
    args = ap.parse_args()
    if args.list:
        for name, variant, _ in all_cases():
            print(f"{name} {variant}".rstrip())
        return 0
    if not args.out:
        ap.error("--out is required")
    if not torch.cuda.is_available():
        print("peer_torch.py: no CUDA device", file=sys.stderr)
        return 1
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    props = torch.cuda.get_device_properties(0)
    context = {"gpu": props.name, "torch": torch.__version__, "cuda": torch.version.cuda,
               "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "min_time_s": args.min_time}
    pattern = re.compile(args.filter) if args.filter else None
    results = []
    for name, variant, make in all_cases():
        if pattern and not pattern.search(name):
            continue
        entry = {"name": name, "variant": variant}
        try:
            fn = make()
            if fn is not None:
                med, best, calls = time_fn(fn, args.min_time)
                entry.update(median_s=med, min_s=best, calls=calls)
            entry.update(EXTRA.pop((name, variant), {}))
            med, calls = entry["median_s"], entry["calls"]
            mem = f"  peak {entry['peak_bytes'] / 2**30:.2f} GiB" if "peak_bytes" in entry else ""
            print(f"{name:60s} {variant:16s} {med * 1e6:12.1f} us  ({calls} calls){mem}", flush=True)
        except Exception as e:  # OOM, unsupported backend: record it and go on
            entry["error"] = f"{type(e).__name__}: {e}".splitlines()[0][:300]
            print(f"{name:60s} {variant:16s} ERROR {entry['error']}", flush=True)
        finally:
            fn = make = None
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
        results.append(entry)
    with open(args.out, "w") as f:
        json.dump({"context": context, "benchmarks": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
