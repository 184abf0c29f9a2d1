#!/usr/bin/env python3
"""config.json cases for Loom's MoE config reader (models/moe_config.h), each with what transformers
makes of it: MixtralConfig / Qwen3MoeConfig's expert count, top k, expert width, renormalisation, aux
coefficient, output_router_logits, and which layers are MoE (Qwen3MoeSparseMoeBlock where
modeling_qwen3_moe.py puts one). Needs transformers 5.x (torch only for the import).

    python3 tools/reference/make_moe_config_cases.py > tests/fixtures/models/moe_config_cases.json
"""
import json

import transformers
from transformers import MixtralConfig, Qwen3MoeConfig

BASE = {"vocab_size": 64, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 6,
        "num_attention_heads": 4, "num_key_value_heads": 2}
CASES = [
    ("mixtral", {}),
    ("mixtral", {"num_local_experts": 4, "num_experts_per_tok": 1, "router_aux_loss_coef": 0.02,
                 "output_router_logits": True}),
    ("mixtral", {"num_experts": 6}),
    ("qwen3_moe", {}),
    ("qwen3_moe", {"num_experts": 16, "num_experts_per_tok": 4, "moe_intermediate_size": 24, "norm_topk_prob": True}),
    ("qwen3_moe", {"num_local_experts": 8, "decoder_sparse_step": 2, "mlp_only_layers": [3]}),
    ("qwen3_moe", {"num_experts": 8, "mlp_only_layers": [0, 5]}),
]


def is_moe(cfg, i):  # modeling_qwen3_moe.py Qwen3MoeDecoderLayer
    return (i not in cfg.mlp_only_layers) and cfg.num_experts > 0 and (i + 1) % cfg.decoder_sparse_step == 0


out = []
for family, extra in CASES:
    d = dict(BASE, model_type=family, **extra)
    if family == "mixtral":
        c = MixtralConfig(**{k: v for k, v in d.items() if k != "model_type"})
        want = dict(experts=c.num_local_experts, experts_per_token=c.num_experts_per_tok,
                    expert_intermediate=c.intermediate_size, renormalize=True,
                    router_aux_loss_coef=c.router_aux_loss_coef, output_router_logits=c.output_router_logits,
                    layer_is_moe=[True] * c.num_hidden_layers)
    else:
        c = Qwen3MoeConfig(**{k: v for k, v in d.items() if k != "model_type"})
        want = dict(experts=c.num_experts, experts_per_token=c.num_experts_per_tok,
                    expert_intermediate=c.moe_intermediate_size, renormalize=c.norm_topk_prob,
                    router_aux_loss_coef=c.router_aux_loss_coef, output_router_logits=c.output_router_logits,
                    layer_is_moe=[is_moe(c, i) for i in range(c.num_hidden_layers)])
    out.append({"family": family, "config": d, "want": want})
print(json.dumps({"transformers": transformers.__version__, "cases": out}, indent=1))
