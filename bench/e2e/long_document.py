#!/usr/bin/env python3
"""Writes one JSONL line holding one long document: the demo paragraphs (examples/demo/weaving.jsonl)
joined, COPIES times over (1500: ~1.8M tokens). Loom's benchmarks train on it so that every row is
a plain causal piece of one text, the same attention work as the peers' rows of random ids; packed
short paragraphs would give Loom a document mask that skips most of the attention.

  python3 bench/e2e/long_document.py OUT.jsonl [COPIES]
"""
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

if len(sys.argv) not in (2, 3):
    sys.exit(__doc__.split("\n\n")[1])
copies = int(sys.argv[2]) if len(sys.argv) == 3 else 1500
text = " ".join(json.loads(line)["text"] for line in open(ROOT / "examples/demo/weaving.jsonl"))
Path(sys.argv[1]).write_text(json.dumps({"text": " ".join([text] * copies)}) + "\n")
