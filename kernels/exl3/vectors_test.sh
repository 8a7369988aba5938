#!/usr/bin/env bash
# Runs `dsmesh exl3-check` on the three vector files written by exllamav3 1.4.1's CUDA extension
# (kernels/exl3/testdata, in the test's runfiles).
set -u
testdata=kernels/exl3/testdata
dsmesh=cli/dsmesh
[[ -x $dsmesh ]] || { echo "FAIL: $dsmesh not found in runfiles" >&2; exit 1; }
status=0
for f in exl3_codebooks exl3_reconstruct exl3_linear; do
  path="$testdata/$f.safetensors"
  [[ -f $path ]] || { echo "FAIL: missing $path" >&2; status=1; continue; }
  echo "== $path"
  "$dsmesh" exl3-check --vectors "$path" || { echo "FAIL: exl3-check reported mismatches in $path" >&2; status=1; }
done
# A file that is not a vector file must fail too (the check cannot pass vacuously).
tmp=$(mktemp -d)
printf 'not a safetensors file' > "$tmp/bad.safetensors"
if "$dsmesh" exl3-check --vectors "$tmp/bad.safetensors" >/dev/null 2>&1; then
  echo "FAIL: exl3-check accepted a corrupt file" >&2
  status=1
fi
# One flipped bit in a codebook table must be reported as a mismatch (non-zero exit, a FAIL line).
cp "$testdata/exl3_codebooks.safetensors" "$tmp/flipped.safetensors"
chmod u+w "$tmp/flipped.safetensors"
size=$(stat -c %s "$tmp/flipped.safetensors")
byte=$(od -An -tu1 -j $((size - 2)) -N1 "$tmp/flipped.safetensors" | tr -d ' ')
printf "$(printf '\\%03o' $((byte ^ 1)))" | dd of="$tmp/flipped.safetensors" bs=1 seek=$((size - 2)) conv=notrunc status=none
if out=$("$dsmesh" exl3-check --vectors "$tmp/flipped.safetensors" 2>&1); then
  echo "FAIL: exl3-check passed a codebook with a flipped bit" >&2
  status=1
elif ! grep -q "FAIL" <<<"$out"; then
  echo "FAIL: exl3-check exited non-zero without a FAIL line: $out" >&2
  status=1
else
  echo "== flipped bit detected:"; grep FAIL <<<"$out"
fi
rm -rf "$tmp"
exit $status
