#!/usr/bin/env python3
"""Where ncu_stalls.py's hot instructions are in the source, and which mbarrier a waiting warp waits on.

ncu_stalls.py names instructions by their offset in the kernel; this reads the same kernel's SASS with
line information (built here, no GPU needed: the device's profile and a local cubin of the same
sources line up) and prints, per hot instruction, its source line and, for the branch of an mbarrier
wait loop (SYNCS.PHASECHK ... TRYWAIT Pn, then @!Pn BRA), the barrier's shared-memory operand; then
the samples summed by source line.
  nvcc <the kernel's compile command> -cubin -arch=sm_90a -lineinfo -o k.cubin
  nvdisasm -gi -c k.cubin > k.sass         (nvdisasm: the CUDA toolkit, or PyPI's nvidia-cuda-nvdisasm)
  tools/gpu/sass_where.py k.sass STALLS.txt --kernel 'flash_bwd_sm90_ws_kernelILi128E' [--top 30]
STALLS.txt is ncu_stalls.py's output for that kernel (one kernel's section of variant_call.sh's ncu.txt).
"""
import argparse
import collections
import re
import sys

FUNC = re.compile(r"^\.text\.(\S+):")
FILE_LINE = re.compile(r'//## File "([^"]+)", line (\d+)')
INSTR = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
HOT = re.compile(r"^\s+([0-9a-f]+)\s+(\d+)\s+[\d.]+%\s")
TRYWAIT = re.compile(r"SYNCS\.PHASECHK\.TRANS64\.TRYWAIT\s+(P\d),\s*(\[[^\]]+\])")
WAIT_BRA = re.compile(r"@!(P\d)\s+BRA")


def kernel_sass(path, kernel):
    """[(offset, instruction, 'file:line')] of the first function whose mangled name contains kernel. An
    instruction takes the last line annotation before it: with -gi, after an inlined call's chain, the
    kernel's own line."""
    out, where, inside = [], "?", False
    with open(path, errors="replace") as f:
        for line in f:
            m = FUNC.match(line)
            if m:
                if inside:
                    break
                inside = kernel in m.group(1)
                continue
            if not inside:
                continue
            m = FILE_LINE.search(line)
            if m:
                where = f"{m.group(1).split('/')[-1]}:{m.group(2)}"
                continue
            m = INSTR.search(line)
            if m:
                out.append((int(m.group(1), 16), m.group(2).strip(), where))
    return out


def barrier_of(sass, i):
    """For a '@!Pn BRA' at sass[i]: the [operand] of the TRYWAIT that set Pn just before, or ''."""
    m = WAIT_BRA.search(sass[i][1])
    if not m:
        return ""
    for j in range(i - 1, max(-1, i - 48), -1):
        t = TRYWAIT.search(sass[j][1])
        if t and t.group(1) == m.group(1):
            return t.group(2)
    return ""


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sass")
    ap.add_argument("stalls")
    ap.add_argument("--kernel", required=True, help="a substring of the kernel's mangled name")
    ap.add_argument("--top", type=int, default=30, help="source lines in the summary")
    args = ap.parse_args()
    sass = kernel_sass(args.sass, args.kernel)
    if not sass:
        sys.exit(f"sass_where: no function matching {args.kernel!r} in {args.sass}")
    at = {off: i for i, (off, _, _) in enumerate(sass)}
    hot = []
    with open(args.stalls) as f:
        for line in f:
            m = HOT.match(line)
            if m:
                hot.append((int(m.group(1), 16), int(m.group(2))))
    if not hot:
        sys.exit(f"sass_where: no instruction rows in {args.stalls} (ncu_stalls.py's output?)")
    total = sum(n for _, n in hot)
    print(f"{len(hot)} hot instructions, {total} samples; offset, samples, source line, instruction [barrier]")
    by_line = collections.Counter()
    missing = 0
    for off, n in hot:
        i = at.get(off)
        if i is None:
            missing += 1
            continue
        _, instr, where = sass[i]
        by_line[where] += n
        print(f"  {off:6x} {n:6d}  {where:36} {instr[:60]} {barrier_of(sass, i)}")
    if missing:
        print(f"  ({missing} offsets not in this SASS: another build of the sources?)")
    print("samples by source line:")
    for where, n in by_line.most_common(args.top):
        print(f"  {n:6d} {100 * n / total:5.1f}%  {where}")


if __name__ == "__main__":
    main()
