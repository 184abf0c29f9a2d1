#!/usr/bin/env python3
"""Synthetic preference pairs for the DPO benchmark: N lines of TRL's {"prompt", "chosen", "rejected"}
strings of about PROMPT and COMPLETION words (random words of a fixed list, seeded), so every runner
reads the same pairs of the same lengths. PROMPT and COMPLETION may be ranges "LO-HI": each prompt and
each completion then draws its own length, uniformly (real preference data varies in length, which
is what padding pays for).   preference_pairs.py OUT N PROMPT COMPLETION"""
import json
import random
import sys

out, n = sys.argv[1], int(sys.argv[2])
rng = random.Random(0)


def words_of(spec):
    lo, _, hi = spec.partition("-")
    return (lambda: rng.randint(int(lo), int(hi))) if hi else (lambda: int(lo))


prompt_words, completion_words = words_of(sys.argv[3]), words_of(sys.argv[4])
vocab = ("the of and to in is was for on that with as by at from this are be or an which it not have "
         "model train data token loss step batch memory kernel tensor layer weight adapter rank gradient").split()
with open(out, "w") as f:
    for _ in range(n):
        pick = lambda k: " ".join(rng.choice(vocab) for _ in range(k))
        f.write(json.dumps({"prompt": pick(prompt_words()), "chosen": " " + pick(completion_words()),
                            "rejected": " " + pick(completion_words())}) + "\n")
