#!/usr/bin/env bash
# sass_loop_ops.py on a real cuobjdump dump of Exl3GemvKernel<2, MCG> (sm_90, v8 code; encoding
# comments stripped): it must find the cp.async decode loop (not the tensor-core input transform's
# loop) and count it as docs/cuda-kernels.md reports: 447 instructions per iteration, ALU 3.31 / FMA 2.77 per weight.
set -euo pipefail
dir=$(dirname "$0")
sass=$(mktemp)
trap 'rm -f "$sass"' EXIT
zcat "$dir/testdata/gemv_k2_mcg_sm90_v8.sass.gz" > "$sass"
out=$(python3 "$dir/sass_loop_ops.py" "$sass" Exl3GemvKernel)
gemv_out=$out
expected="_ZN6dsmesh8exl3cuda14Exl3GemvKernelILi2ELi1EEEvNS0_10GemvParamsE: 447 instructions per iteration; per weight: ALU 3.31, FMA 2.77, all 6.98"
if [[ "$out" != "$expected" ]]; then
  echo "sass_loop_ops.py printed:"; echo "$out"; echo "expected:"; echo "$expected"; exit 1
fi
# A kernel with several decode loops (Exl3MoeKernel<2>, v13 code: the few-rows and the packed loop of
# the gate/up and of the down items) prints one line per loop, in address order, as docs/cuda-kernels.md v13 reports.
zcat "$dir/testdata/moe_k2_sm90_v13.sass.gz" > "$sass"
out=$(python3 "$dir/sass_loop_ops.py" "$sass" Exl3MoeKernel | sed 's/^.*Exl3MoeKernel//')
expected="ILi2EEEvNS0_9MoeParamsE (loop at 0x56b0): 335 instructions per iteration; per weight: ALU 2.56, FMA 1.95, all 5.23
ILi2EEEvNS0_9MoeParamsE (loop at 0x6ca0): 429 instructions per iteration; per weight: ALU 3.19, FMA 2.73, all 6.70
ILi2EEEvNS0_9MoeParamsE (loop at 0xfe40): 347 instructions per iteration; per weight: ALU 2.67, FMA 2.02, all 5.42
ILi2EEEvNS0_9MoeParamsE (loop at 0x115f0): 448 instructions per iteration; per weight: ALU 3.38, FMA 2.84, all 7.00"
if [[ "$out" != "$expected" ]]; then
  echo "sass_loop_ops.py printed:"; echo "$out"; echo "expected:"; echo "$expected"; exit 1
fi
# A name that matches no function prints nothing.
[[ -z "$(python3 "$dir/sass_loop_ops.py" "$sass" NoSuchKernel)" ]] || { echo "unexpected output for NoSuchKernel"; exit 1; }
echo "ok: $gemv_out and the 4 loops of Exl3MoeKernel<2>"
