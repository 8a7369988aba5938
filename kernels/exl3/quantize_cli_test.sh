#!/usr/bin/env bash
# `dsmesh quantize` rejects bad input before doing any work: clear message, non-zero exit (2 for flags).
set -u
dsmesh=cli/dsmesh
[[ -x $dsmesh ]] || { echo "FAIL: $dsmesh not found in runfiles" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/in" "$tmp/existing"
echo '{}' > "$tmp/in/config.json"
status=0

# expect CODE PATTERN ARGS...: exit code and a message matching PATTERN.
expect() {
  local code=$1 pattern=$2
  shift 2
  local out
  out=$("$dsmesh" quantize "$@" 2>&1)
  local rc=$?
  if [[ $rc != "$code" ]] || ! grep -q -- "$pattern" <<<"$out"; then
    echo "FAIL: quantize $* -> exit $rc, expected $code with /$pattern/; output: $out" >&2
    status=1
  else
    echo "ok: quantize $* -> exit $rc: $(head -c 160 <<<"$out")"
  fi
}

expect 2 "both experts=K and dense=K" --model "$tmp/in" --out "$tmp/o1" --bits experts=2
expect 2 "K must be 1..8" --model "$tmp/in" --out "$tmp/o1" --bits experts=2,dense=9
expect 2 "cannot parse 'layers.3=3'" --model "$tmp/in" --out "$tmp/o1" --bits experts=2,dense=6,layers.3=3
expect 2 "'head=9': K must be 1..8" --model "$tmp/in" --out "$tmp/o1" --bits experts=2,dense=6,head=9
expect 2 "embed=fp8 or embed=bf16" --model "$tmp/in" --out "$tmp/o1" --bits experts=2,dense=6,embed=fp4
expect 2 "unknown EXL3 codebook 'mcg2'" --model "$tmp/in" --out "$tmp/o1" --bits experts=2,dense=6 --codebook mcg2
expect 2 "model" --out "$tmp/o1" --bits experts=2,dense=6
expect 1 "already exists (pass --force" --model "$tmp/in" --out "$tmp/existing" --bits experts=2,dense=6
expect 1 "is not a directory" --model "$tmp/missing" --out "$tmp/o1" --bits experts=2,dense=6
expect 1 "must differ from --model" --model "$tmp/in" --out "$tmp/in" --bits experts=2,dense=6 --force
expect 1 "no model.safetensors.index.json and no" --model "$tmp/in" --out "$tmp/o1" --bits experts=2,dense=6
# A checkpoint with nothing to quantize, and one in transformers naming.
python3 - "$tmp" <<'PY'
import json, struct, sys, os
def write(path, name):
    header = json.dumps({name: {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}).encode()
    header += b" " * (-len(header) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header + struct.pack("<f", 1.0))
for d, name in (("norm_only", "norm.weight"), ("hf", "model.layers.0.self_attn.q_a_proj.weight")):
    os.makedirs(os.path.join(sys.argv[1], d))
    open(os.path.join(sys.argv[1], d, "config.json"), "w").write("{}")
    write(os.path.join(sys.argv[1], d, "model.safetensors"), name)
PY
expect 1 "no linear weights in DeepSeek naming" --model "$tmp/norm_only" --out "$tmp/o1" --bits experts=2,dense=6
expect 1 "uses transformers naming" --model "$tmp/hf" --out "$tmp/o1" --bits experts=2,dense=6
# --size-only: the pack's size by class from the shapes, nothing written (make-tiny: vocab 129,280 x 128).
"$dsmesh" make-tiny --out "$tmp/tiny" >/dev/null 2>&1 || { echo "FAIL: make-tiny" >&2; status=1; }
out=$("$dsmesh" quantize --model "$tmp/tiny" --size-only --bits experts=4,dense=6,head=6,embed=fp8 2>&1)
rc=$?
# head K6: 129,280 x 128 x 6 / 8 + 2 x (128 + 129,280) + 4 bytes = 12,669,700; embedding 129,280 x (128 + 4) = 17,064,960.
if [[ $rc != 0 ]] || ! grep -q "would be a pack of .* head 12.67 MB, embedding 17.06 MB" <<<"$out"; then
  echo "FAIL: quantize --size-only -> exit $rc: $out" >&2
  status=1
else
  echo "ok: $out"
fi
ls "$tmp" | grep -qv "^\(in\|existing\|norm_only\|hf\|tiny\)$" && { echo "FAIL: --size-only wrote something: $(ls "$tmp")" >&2; status=1; }
[[ -e $tmp/o1 ]] && { echo "FAIL: a failed run left $tmp/o1 behind" >&2; status=1; }
ls -A "$tmp" | grep -q partial && { echo "FAIL: a failed run left a temporary directory" >&2; status=1; }
exit $status
