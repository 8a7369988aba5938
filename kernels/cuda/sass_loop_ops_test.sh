#!/usr/bin/env bash
# sass_loop_ops.py on a real cuobjdump dump of Exl3GemvKernel<2, MCG> (sm_90, v8 code; encoding
# comments stripped): it must find the cp.async decode loop (not the tensor-core input transform's
# loop) and count it as NOTES.md reports: 447 instructions per iteration, ALU 3.31 / FMA 2.77 per weight.
set -euo pipefail
dir=$(dirname "$0")
sass=$(mktemp)
trap 'rm -f "$sass"' EXIT
zcat "$dir/testdata/gemv_k2_mcg_sm90_v8.sass.gz" > "$sass"
out=$(python3 "$dir/sass_loop_ops.py" "$sass" Exl3GemvKernel)
expected="_ZN6dsmesh8exl3cuda14Exl3GemvKernelILi2ELi1EEEvNS0_10GemvParamsE: 447 instructions per iteration; per weight: ALU 3.31, FMA 2.77, all 6.98"
if [[ "$out" != "$expected" ]]; then
  echo "sass_loop_ops.py printed:"; echo "$out"; echo "expected:"; echo "$expected"; exit 1
fi
# A name that matches no function prints nothing.
[[ -z "$(python3 "$dir/sass_loop_ops.py" "$sass" NoSuchKernel)" ]] || { echo "unexpected output for NoSuchKernel"; exit 1; }
echo "ok: $out"
