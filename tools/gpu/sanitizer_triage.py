#!/usr/bin/env python3
"""Reads one compute-sanitizer log (tools/gpu/gpu_check.sh's sanitize stage) and says whether its
findings are Loom's. Two kinds of report come from NVIDIA's own libraries and are counted apart:

- racecheck hazards inside cuBLASLt's kernels (nvjet_*: its split-K GEMMs synchronise through
  mechanisms racecheck does not follow); excluding them with --kernel-name-exclude made the
  sanitizer itself fail (an internal error on a hardware exception), so they are filtered here;
- memcheck API errors that NCCL raises and handles while it probes its kernels at
  ncclCommInitRank (cudaFuncGetAttributes -> cudaErrorNoKernelImageForDevice).

Anything else (an invalid access, a leak, a hazard in a Loom kernel, another API error, a
sanitizer failure) is Loom's. Prints one line; exit 0 when nothing is Loom's, 1 otherwise.
    usage: sanitizer_triage.py LOG
"""
import re
import sys


def blocks(lines):
    """The sanitizer's reports: each starts at a '========= ' line that is not a frame or a blank."""
    out, cur = [], None
    for line in lines:
        if not line.startswith("========= "):
            continue
        body = line[len("========= "):]
        if body.startswith(" ") or not body.strip():  # a backtrace line or the separator
            if cur is not None:
                cur.append(body)
            continue
        if body.startswith(("COMPUTE-SANITIZER", "ERROR SUMMARY", "LEAK SUMMARY", "RACECHECK SUMMARY")):
            cur = None
            continue
        cur = [body]
        out.append(cur)
    return out


def foreign(block):
    head = block[0]
    if head.startswith("Error: Race reported"):
        accesses = [head] + [b for b in block[1:] if "access at" in b]
        return all(re.search(r"access at nvjet_", a) for a in accesses)
    if head.startswith("Program hit cudaErrorNoKernelImageForDevice") and "cudaFuncGetAttributes" in head:
        return any("libnccl" in b for b in block[1:])
    return False


def main(path):
    text = open(path, errors="replace").read()
    reports = blocks(text.splitlines())
    theirs = [b for b in reports if foreign(b)]
    ours = [b for b in reports if not foreign(b)]
    crashed = "Internal Sanitizer Error" in text or "Target application terminated" in text
    failed_test = "[  FAILED  ]" in text
    verdict = "clean" if not ours and not crashed and not failed_test else "FINDINGS"
    note = f", {len(theirs)} in NVIDIA's libraries (cuBLASLt nvjet hazards, NCCL's kernel probe)" if theirs else ""
    first = (f": {ours[0][0][:160]}" if ours else ": the sanitizer failed" if crashed else
             ": a test failed under the sanitizer" if failed_test else "")
    print(f"{verdict}: {len(ours)} of Loom's{note}{first}")
    return 0 if verdict == "clean" else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
