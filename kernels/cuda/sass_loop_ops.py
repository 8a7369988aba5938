#!/usr/bin/env python3
"""Counts the instructions of a kernel's decode main loop in a cuobjdump SASS dump, per pipe and per weight.

usage: sass_loop_ops.py DUMP.sass [NAME_SUBSTRING ...]
For every function whose mangled name contains all substrings, finds the innermost loops (backward branches) that wait on
cp.async groups (DEPBAR) and contain HMMA instructions, and prints for each instructions per decoded weight: ALU pipe
(integer logic/shift/permute), FMA pipe (IMAD, HADD2), and all. A loop iteration of the EXL3 decode core
decodes 64 weights per lane (8 tiles of 8), which is what `--weights-per-iter` defaults to.
The numbers feed the op floor of dsmesh-kernel-bench (DecodeOpsPerWeight) and docs/cuda-kernels.md.
"""
import re
import sys
from collections import Counter

ALU = {"SHF", "LOP3", "PRMT", "LEA", "IADD3", "ISETP", "VIADD", "SEL", "IABS", "FLO", "POPC", "BMSK", "SGXT",
       "LOP", "SHL", "SHR", "VIMNMX", "IMNMX"}
FMA = {"IMAD", "HADD2", "HFMA2", "HMUL2", "FFMA", "FADD", "FMUL"}


def functions(lines):
    name, body = None, []
    for line in lines:
        m = re.search(r"Function : (\S+)", line)
        if m:
            if name:
                yield name, body
            name, body = m.group(1), []
        elif name:
            m = re.match(r"\s+/\*([0-9a-f]{4,})\*/\s+(.*?);", line)
            if m:
                body.append((int(m.group(1), 16), m.group(2).strip()))
    if name:
        yield name, body


def opcode(text):
    parts = text.split()
    if parts and parts[0].startswith("@"):
        parts = parts[1:]
    return parts[0].split(".")[0] if parts else ""


def main_loops(body):
    """The decode loops: backward branches whose span waits on cp.async (DEPBAR) and runs HMMAs, without
    such a loop inside (a kernel can have several, e.g. the few-rows and the many-rows loop)."""
    loops = []
    for addr, text in body:
        m = re.search(r"\bBRA\b.*?(0x[0-9a-f]+)", text)
        if not m:
            continue
        target = int(m.group(1), 16)
        if target >= addr:
            continue
        span = [(a, t) for a, t in body if target <= a <= addr]
        if any(opcode(t) == "HMMA" for _, t in span) and any(opcode(t) == "DEPBAR" for _, t in span):
            loops.append((target, addr, [t for _, t in span]))
    return [(t, a, span) for t, a, span in loops
            if not any((t2, a2) != (t, a) and t <= t2 and a2 <= a for t2, a2, _ in loops)]


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    args = [a for a in sys.argv[2:] if not a.startswith("--")]
    per_iter = 64
    for a in sys.argv[2:]:
        if a.startswith("--weights-per-iter="):
            per_iter = int(a.split("=")[1])
    with open(sys.argv[1]) as f:
        lines = f.readlines()
    for name, body in functions(lines):
        if not all(s in name for s in args):
            continue
        loops = main_loops(body)
        for target, _, loop in loops:
            ops = Counter(opcode(t) for t in loop)
            alu = sum(v for k, v in ops.items() if k in ALU)
            fma = sum(v for k, v in ops.items() if k in FMA)
            total = sum(ops.values())
            where = f" (loop at {target:#06x})" if len(loops) > 1 else ""
            print(f"{name}{where}: {total} instructions per iteration; per weight: ALU {alu / per_iter:.2f}, "
                  f"FMA {fma / per_iter:.2f}, all {total / per_iter:.2f}")

if __name__ == "__main__":
    main()
