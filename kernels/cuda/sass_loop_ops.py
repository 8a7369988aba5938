#!/usr/bin/env python3
"""Counts the instructions of a kernel's decode main loop in a cuobjdump SASS dump, per pipe and per weight.

usage: sass_loop_ops.py DUMP.sass [NAME_SUBSTRING ...]
For every function whose mangled name contains all substrings, finds the innermost loop (a backward branch) that waits on
cp.async groups (DEPBAR) and contains HMMA instructions, and prints instructions per decoded weight: ALU pipe
(integer logic/shift/permute), FMA pipe (IMAD, HADD2), and all. A loop iteration of the EXL3 decode core
decodes 64 weights per lane (8 tiles of 8), which is what `--weights-per-iter` defaults to.
The numbers feed the op floor of dsmesh-kernel-bench (DecodeOpsPerWeight) and NOTES.md.
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


def main_loop(body):
    best = None
    for addr, text in body:
        m = re.search(r"\bBRA\b.*?(0x[0-9a-f]+)", text)
        if not m:
            continue
        target = int(m.group(1), 16)
        if target >= addr:
            continue
        span = [t for a, t in body if target <= a <= addr]
        if (any(opcode(t) == "HMMA" for t in span) and any(opcode(t) == "DEPBAR" for t in span)
                and (best is None or len(span) < len(best))):
            best = span
    return best


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
        loop = main_loop(body)
        if not loop:
            continue
        ops = Counter(opcode(t) for t in loop)
        alu = sum(v for k, v in ops.items() if k in ALU)
        fma = sum(v for k, v in ops.items() if k in FMA)
        total = sum(ops.values())
        print(f"{name}: {total} instructions per iteration; per weight: ALU {alu / per_iter:.2f}, "
              f"FMA {fma / per_iter:.2f}, all {total / per_iter:.2f}")


if __name__ == "__main__":
    main()
