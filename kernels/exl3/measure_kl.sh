#!/usr/bin/env bash
# KL divergence per token of the tiny model's EXL3 logits against its bf16 logits, for K = 2, 3, 4, 6
# (experts=K, dense=K, MCG). Needs the model loader's EXL3 support (dsmesh logits on an EXL3 pack).
#   bazel build //cli:dsmesh //kernels/exl3:exl3_logits_kl && kernels/exl3/measure_kl.sh [WORKDIR]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
dsmesh="$root/bazel-bin/cli/dsmesh"
kl="$root/bazel-bin/kernels/exl3/exl3_logits_kl"
work=${1:-$(mktemp -d)}
mkdir -p "$work"
# 64 fixed token ids spread over the vocabulary.
tokens=$(python3 -c 'import random; r=random.Random(7); print(",".join(str(r.randrange(129280)) for _ in range(64)))')
[[ -d $work/bf16 ]] || "$dsmesh" make-tiny --out "$work/bf16" >/dev/null
"$dsmesh" logits --model "$work/bf16" --tokens "$tokens" --out "$work/bf16.logits.safetensors"
for K in ${KS:-2 3 4 6}; do
  /usr/bin/time -f "quantize K=$K: %e s wall, %U s user" \
    "$dsmesh" quantize --model "$work/bf16" --out "$work/exl3-k$K" --bits "experts=$K,dense=$K" --force --quiet
  "$dsmesh" logits --model "$work/exl3-k$K" --tokens "$tokens" --out "$work/k$K.logits.safetensors"
  echo -n "K=$K: "
  "$kl" "$work/bf16.logits.safetensors" "$work/k$K.logits.safetensors"
done
