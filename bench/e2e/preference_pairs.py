#!/usr/bin/env python3
"""Synthetic preference pairs for the DPO benchmark: N lines of TRL's {"prompt", "chosen", "rejected"}
strings of about PROMPT and COMPLETION words (random words of a fixed list, seeded), so every runner
reads the same pairs of the same lengths.   preference_pairs.py OUT N PROMPT COMPLETION"""
import json
import random
import sys

out, n, prompt_words, completion_words = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
words = ("the of and to in is was for on that with as by at from this are be or an which it not have "
         "model train data token loss step batch memory kernel tensor layer weight adapter rank gradient").split()
rng = random.Random(0)
with open(out, "w") as f:
    for _ in range(n):
        pick = lambda k: " ".join(rng.choice(words) for _ in range(k))
        f.write(json.dumps({"prompt": pick(prompt_words), "chosen": " " + pick(completion_words),
                            "rejected": " " + pick(completion_words)}) + "\n")
