#!/usr/bin/env python3
# Reference values for `loom forward --objective dpo|ipo|simpo|orpo` (tests/models/test_preference.cpp):
# tiny fixture models with their PEFT adapters (tests/fixtures/models/<variant>), pairs of right-padded
# sequences with labels -100 on the prompt and the padding, the policy's and the reference's (adapter
# disabled, PEFT's disable_adapter) summed completion log-probabilities computed by transformers, and
# the loss from TRL's own code: CPOTrainer.cpo_loss ("sigmoid" on the log-ratios is DPO with cDPO
# smoothing, "ipo" on the length-normalised log-ratios is DPOTrainer's IPO, "simpo" on the average
# log-probs is SimPO) and ORPOTrainer.odds_ratio_loss plus the chosen completions' mean NLL (ORPO),
# called on a plain namespace holding their settings. Gradients: torch autograd through the PEFT model.
#
#   on the GPU machine, with ../shared/peers copied to .peers:
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .peers/*.whl
#   PYTHONPATH=/tmp/site python3 tools/reference/make_preference_reference.py --out /tmp/pref
# Writes OUT/<variant>/inputs.safetensors, OUT/<variant>/<case>.safetensors and OUT/cases.json.
import argparse
import json
import os
import sys
import types
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

REPO = Path(__file__).resolve().parents[2]
VARIANTS = ["llama", "phi3"]
# name: (objective, beta, simpo_gamma, label_smoothing)
CASES = {
    "dpo": ("dpo", 0.1, 0.5, 0.0),
    "dpo_smoothed": ("dpo", 0.5, 0.5, 0.2),
    "ipo": ("ipo", 0.1, 0.5, 0.0),
    "simpo": ("simpo", 2.0, 0.5, 0.0),
    "orpo": ("orpo", 0.1, 0.5, 0.0),
}
PAIRS, SEQ = 3, 10
PROMPT_LEN = [3, 4, 2]            # per pair
CHOSEN_LEN, REJECTED_LEN = [9, 10, 6], [7, 10, 8]  # tokens before right padding


def make_inputs(vocab, seed):
    g = torch.Generator().manual_seed(seed)
    out = {}
    for side, lens in (("chosen", CHOSEN_LEN), ("rejected", REJECTED_LEN)):
        ids = torch.zeros(PAIRS, SEQ, dtype=torch.int64)
        labels = torch.full((PAIRS, SEQ), -100, dtype=torch.int64)
        for p in range(PAIRS):
            seq = torch.randint(1, vocab, (lens[p],), generator=g)
            if side == "rejected":  # the same prompt as the chosen completion
                seq[:PROMPT_LEN[p]] = out["chosen_input_ids"][p, :PROMPT_LEN[p]]
            ids[p, :lens[p]] = seq
            labels[p, PROMPT_LEN[p]:lens[p]] = seq[PROMPT_LEN[p]:]
        out[f"{side}_input_ids"], out[f"{side}_labels"] = ids, labels
    return out


def seq_logps(model, ids, labels):
    """Summed log-probs of labels[t+1] under logits[t] (TRL's get_batch_logps), and the token counts."""
    logits = model(input_ids=ids, attention_mask=(ids != 0).long()).logits.float()  # right padding: id 0
    lg, lb = logits[:, :-1], labels[:, 1:]
    mask = lb != -100
    tok = torch.gather(lg.log_softmax(-1), 2, lb.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    return (tok * mask).sum(-1), mask.sum(-1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    global torch
    import torch
    import transformers
    import trl
    from peft import PeftModel
    from safetensors.torch import save_file
    from trl.experimental.cpo.cpo_trainer import CPOTrainer
    from trl.experimental.orpo.orpo_trainer import ORPOTrainer
    torch.set_num_threads(4)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    manifest = {"versions": {"torch": torch.__version__, "transformers": transformers.__version__, "trl": trl.__version__},
                "pairs": PAIRS, "seq": SEQ, "cases": {}}
    for v in VARIANTS:
        vdir = out / v
        vdir.mkdir(exist_ok=True)
        src = REPO / "tests" / "fixtures" / "models" / v
        base = transformers.AutoModelForCausalLM.from_pretrained(str(src), dtype=torch.float32, attn_implementation="eager")
        model = PeftModel.from_pretrained(base, str(src / "adapter"), is_trainable=True).eval()
        inputs = make_inputs(base.config.vocab_size, 7 + len(v))
        save_file({k: t.to(torch.int32).contiguous() for k, t in inputs.items()}, str(vdir / "inputs.safetensors"))
        with torch.no_grad(), model.disable_adapter():
            ref_c, _ = seq_logps(model, inputs["chosen_input_ids"], inputs["chosen_labels"])
            ref_r, _ = seq_logps(model, inputs["rejected_input_ids"], inputs["rejected_labels"])
        for name, (objective, beta, gamma, ls) in CASES.items():
            model.zero_grad(set_to_none=True)
            pc, nc = seq_logps(model, inputs["chosen_input_ids"], inputs["chosen_labels"])
            pr, nr = seq_logps(model, inputs["rejected_input_ids"], inputs["rejected_labels"])
            ns = types.SimpleNamespace(beta=beta, simpo_gamma=gamma, label_smoothing=ls, alpha=0.0,
                                       accelerator=types.SimpleNamespace(device=pc.device))
            if objective == "dpo":
                ns.loss_type = "sigmoid"
                losses, _, _ = CPOTrainer.cpo_loss(ns, pc - ref_c, pr - ref_r)
                loss = losses.mean()
            elif objective == "ipo":
                ns.loss_type = "ipo"
                losses, _, _ = CPOTrainer.cpo_loss(ns, (pc - ref_c) / nc, (pr - ref_r) / nr)
                loss = losses.mean()
            elif objective == "simpo":
                ns.loss_type = "simpo"
                losses, _, _ = CPOTrainer.cpo_loss(ns, pc / nc, pr / nr)
                loss = losses.mean()
            else:
                losses, _, _, _, _ = ORPOTrainer.odds_ratio_loss(ns, pc / nc, pr / nr)
                nll = -pc.sum() / nc.sum()  # the chosen completions' mean token NLL
                loss = nll - losses.mean()
            loss.backward()
            t = {"loss": loss.detach().float().reshape(1), "chosen_logps": pc.detach().float(),
                 "rejected_logps": pr.detach().float()}
            if objective in ("dpo", "ipo"):
                t["ref_chosen_logps"], t["ref_rejected_logps"] = ref_c.float(), ref_r.float()
            for n, p in model.named_parameters():
                if p.requires_grad:
                    t["grad." + n.replace(".default.", ".")] = p.grad.detach().float().contiguous()
            save_file(t, str(vdir / f"{name}.safetensors"))
            manifest["cases"][f"{v}/{name}"] = {"objective": objective, "beta": beta, "simpo_gamma": gamma,
                                               "label_smoothing": ls, "loss": float(loss)}
            print(f"{v}/{name}: loss {float(loss):.6f}", flush=True)
    (out / "cases.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
