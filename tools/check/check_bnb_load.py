#!/usr/bin/env python3
"""Loads a `loom quantize` output folder with transformers + bitsandbytes, as a user would, and checks
it against what transformers + bitsandbytes themselves computed for the same fixture.

  python3 tools/check/check_bnb_load.py QUANTIZED_DIR FAMILY

QUANTIZED_DIR: `loom quantize --model tests/fixtures/models/FAMILY --out QUANTIZED_DIR`.
Checks: AutoModelForCausalLM.from_pretrained(QUANTIZED_DIR) (no quantization_config argument: the
one in config.json) gives a bitsandbytes Linear4bit (nf4, blocksize 64, double quantisation) for
every decoder projection; every 4-bit weight dequantises (bitsandbytes.functional.dequantize_4bit)
to what bitsandbytes' own checkpoint of the fixture holds ("dequant.*" of
tests/fixtures/bnb/models/FAMILY/reference_4bit.safetensors, tools/reference/make_bnb_model_reference.py);
the logits on the fixture's inputs, in float32 compute as the reference ran (`loom quantize` writes
bfloat16 by default), follow that checkpoint's logits. The two quantisers may differ in a code
where x / absmax sits within bitsandbytes' fast-math reciprocal of a decision threshold
(tests/e2e/test_quantize.cpp), and in a block's scale by the double-quantisation offset's few ulps;
so an element counts as different when it moves by more than 1e-4 relative (a code step is > 1e-2),
at most 1e-4 of them may, and the logits' relative error is at most 1e-4 (the 4-bit error itself
against the f32 model is ~1e-2). Prints one line; exits non-zero on a failed check.

Needs a CUDA device, torch, transformers 5.x and the bitsandbytes wheel (PYTHONPATH).
"""
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402
import transformers  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__.split("\n\n")[1])
    qdir, family = Path(sys.argv[1]), sys.argv[2]
    import bitsandbytes as bnb
    import bitsandbytes.functional as bnbf

    ref = load_file(str(ROOT / "tests/fixtures/bnb/models" / family / "reference_4bit.safetensors"))
    inputs = load_file(str(ROOT / "tests/fixtures/models" / family / "inputs.safetensors"))
    torch.backends.cuda.matmul.allow_tf32 = False
    model = transformers.AutoModelForCausalLM.from_pretrained(str(qdir), dtype=torch.float32,
                                                              attn_implementation="eager",
                                                              device_map={"": 0}).eval()
    n4, worst_share, worst_scale = 0, 0.0, 0.0
    for name, mod in model.named_modules():
        if name.split(".")[-1] in LINEARS:
            if not isinstance(mod, bnb.nn.Linear4bit):
                sys.exit(f"{family}: {name} loaded as {type(mod).__name__}, not bitsandbytes' Linear4bit")
            # The reference ran with float32 compute (make_bnb_model_reference.py); `loom quantize`
            # writes bfloat16 by default (--compute-dtype): compare the logits in float32.
            mod.compute_dtype = torch.float32
            qs = mod.weight.quant_state
            if qs.quant_type != "nf4" or qs.blocksize != 64 or not qs.nested:
                sys.exit(f"{family}: {name}: quant_type {qs.quant_type}, blocksize {qs.blocksize}, nested {qs.nested}")
            got = bnbf.dequantize_4bit(mod.weight.data, qs).float().cpu()
            want = ref[f"dequant.{name}.weight"]
            if got.shape != want.shape:
                sys.exit(f"{family}: {name} dequantises to {tuple(got.shape)}, bitsandbytes' to {tuple(want.shape)}")
            # A code that differs moves an element by a whole NF4 step (> 1e-2 relative); the
            # double-quantisation offset, a mean summed in another order, moves a block's scale by a
            # few ulps (~1e-6 relative).
            rel = ((got - want).abs() / want.abs().clamp_min(1e-30)).double()
            share = float((rel > 1e-4).double().mean())
            worst_share = max(worst_share, share)
            worst_scale = max(worst_scale, float(rel[rel <= 1e-4].max()) if bool((rel <= 1e-4).any()) else 0.0)
            if share > 1e-4:
                sys.exit(f"{family}: {name}: {share:.3g} of the dequantised elements differ from bitsandbytes' by more than 1e-4")
            n4 += 1
    if n4 != len(LINEARS) * model.config.num_hidden_layers:
        sys.exit(f"{family}: {n4} 4-bit projections, expected {len(LINEARS) * model.config.num_hidden_layers}")
    with torch.no_grad():
        logits = model(input_ids=inputs["input_ids"].long().cuda(), use_cache=False).logits.float().cpu()
    want = ref["logits"].double()
    rel_logits = float((logits.double() - want).norm() / want.norm())
    ok = rel_logits <= 1e-4
    print(f"{family}: transformers {transformers.__version__} + bitsandbytes {bnb.__version__} load {qdir}: "
          f"{n4} Linear4bit; against bitsandbytes' own checkpoint: codes differ in at most {worst_share:.2g} of "
          f"elements, the rest within {worst_scale:.2g} relative; logits rel {rel_logits:.3g} ({'ok' if ok else 'FAILED'})")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
