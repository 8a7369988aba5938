#!/usr/bin/env bash
# The model's single-process commands end to end: make-tiny (deterministic per seed), logits (file shape,
# agrees with generate's first token), generate (JSON of generated tokens only), bench --device, and the
# errors a user can provoke (missing model directory, bad token id, malformed --tokens, unsupported config)
# with their exit codes; project-reference (and its other name project-seat) on bad profiles.
set -u
dsmesh=cli/dsmesh
[[ -x $dsmesh ]] || { echo "FAIL: $dsmesh not found in runfiles" >&2; exit 1; }
tmp="${TEST_TMPDIR:-$(mktemp -d)}/model_commands_test"
rm -rf "$tmp" && mkdir -p "$tmp"
status=0
fail() { echo "FAIL: $*" >&2; status=1; }

# make-tiny: deterministic per seed, different across seeds.
"$dsmesh" make-tiny --out "$tmp/a" --seed 3 >/dev/null 2>&1 || fail "make-tiny --seed 3"
"$dsmesh" make-tiny --out "$tmp/b" --seed 3 >/dev/null 2>&1 || fail "make-tiny --seed 3 (again)"
"$dsmesh" make-tiny --out "$tmp/c" --seed 4 >/dev/null 2>&1 || fail "make-tiny --seed 4"
cmp -s "$tmp/a/model.safetensors" "$tmp/b/model.safetensors" || fail "same seed gave different weights"
cmp -s "$tmp/a/model.safetensors" "$tmp/c/model.safetensors" && fail "different seeds gave identical weights"
grep -q '"vocab_size": 129280' "$tmp/a/config.json" || fail "tiny model vocab is not 129280"

# generate prints only the generated tokens.
out=$("$dsmesh" generate --model "$tmp/a" --tokens 0,128803,19923,128804 --max-new-tokens 6 --ignore-eos 2>/dev/null)
[[ $out =~ ^\{\"tokens\":\ \[([0-9]+,\ ){5}[0-9]+\]\}$ ]] || fail "generate printed '$out'"
first=$(echo "$out" | sed -E 's/^\{"tokens": \[([0-9]+).*/\1/')

# logits: f32 [T, vocab]; its last row's argmax is generate's first token.
"$dsmesh" logits --model "$tmp/a" --tokens 0,128803,19923,128804 --out "$tmp/l.safetensors" || fail "logits"
python3 - "$tmp/l.safetensors" "$first" <<'PY' || fail "logits file check"
import array, json, struct, sys
b = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])["logits"]
assert h["dtype"] == "F32" and h["shape"] == [4, 129280], h
a = array.array("f"); a.frombytes(b[8 + n + h["data_offsets"][0]:8 + n + h["data_offsets"][1]])
last = a[3 * 129280:]
best = max(range(129280), key=lambda i: last[i])
assert best == int(sys.argv[2]), (best, sys.argv[2])
PY

# Errors: message names the problem, exit 1 for failures, 2 for bad flags.
expect() {  # expect CODE NEEDLE -- command...
  local code=$1 needle=$2; shift 3
  local err; err=$("$@" 2>&1 >/dev/null); local rc=$?
  [[ $rc == "$code" ]] || fail "'$*' exited $rc, expected $code ($err)"
  [[ $err == *"$needle"* ]] || fail "'$*' said '$err', expected it to mention '$needle'"
}
expect 1 "$tmp/nope: model directory does not exist" -- "$dsmesh" generate --model "$tmp/nope" --tokens 1 --max-new-tokens 1
expect 1 "token id 999999 is outside the vocabulary" -- "$dsmesh" generate --model "$tmp/a" --tokens 5,999999 --max-new-tokens 1
expect 2 "\"x\" is not an integer token id" -- "$dsmesh" logits --model "$tmp/a" --tokens 5,x --out "$tmp/x.safetensors"
expect 2 "--out" -- "$dsmesh" make-tiny
mkdir -p "$tmp/llama" && cp "$tmp/a/model.safetensors" "$tmp/llama/" && echo '{"model_type": "llama"}' > "$tmp/llama/config.json"
expect 1 "unsupported model_type \"llama\"" -- "$dsmesh" generate --model "$tmp/llama" --tokens 1 --max-new-tokens 1
[[ -e "$tmp/x.safetensors" ]] && fail "a failed logits run left an output file"
expect 1 "no CUDA GPU is visible" -- env CUDA_VISIBLE_DEVICES= "$dsmesh" generate --model "$tmp/a" --tokens 1 --device cuda

# The device: without --device and without a visible GPU the CPU, with the reason; --device as given.
for cmd in "generate --max-new-tokens 1" "logits --out $tmp/d.safetensors"; do
  err=$(env CUDA_VISIBLE_DEVICES= "$dsmesh" $cmd --model "$tmp/a" --tokens 5,17 2>&1 >/dev/null) || fail "$cmd without a GPU: $err"
  [[ $err == *"[load] device: cpu (no CUDA GPU is visible"*"CUDA_VISIBLE_DEVICES is set to \"\""*"--device cuda to require a GPU)"* ]] ||
    fail "$cmd without a GPU said '$err'"
done
err=$("$dsmesh" generate --model "$tmp/a" --tokens 5,17 --max-new-tokens 1 --device cpu 2>&1 >/dev/null)
[[ $err == *"[load] device: cpu (given by --device)"* ]] || fail "generate --device cpu said '$err'"
expect 2 "--device cuda:x: expected cpu, cuda or cuda:N" -- "$dsmesh" generate --model "$tmp/a" --tokens 1 --device cuda:x
expect 1 "seed must be a non-negative integer" -- "$dsmesh" generate --model synthetic:v4-flash:seed=x --tokens 1

# The local benchmark: a row per (context, streams) with its floor, and the JSON beside it.
"$dsmesh" bench --device cpu --model "$tmp/a" --contexts 40 --streams 1,2 --steps 2 --json "$tmp/bench.json" \
  > "$tmp/bench.txt" 2>/dev/null || fail "bench --device cpu"
grep -qE "^2 +1 +40 " "$tmp/bench.txt" || fail "bench table: $(cat "$tmp/bench.txt")"
python3 -c "import json,sys; r=json.load(open(sys.argv[1])); assert len(r)==2 and all(x['ms_per_step']>0 and x['floor_ms']>0 and x['prefill_tok_per_s']>0 for x in r), r" \
  "$tmp/bench.json" || fail "bench json"
grep -qE "^  prefill of 40 tokens .* tok/s" "$tmp/bench.txt" || fail "bench prefill line: $(cat "$tmp/bench.txt")"
grep -qE "^# KV bf16: [0-9]+ B/token" "$tmp/bench.txt" || fail "bench KV costs: $(cat "$tmp/bench.txt")"
# --prefill-chunk: 25 chunks of 16 tokens fill 400; the chunk rate at every tenth of the context is printed.
"$dsmesh" bench --device cpu --model "$tmp/a" --contexts 400 --streams 1 --steps 1 --prefill-chunk 16 \
  --json "$tmp/chunks.json" > "$tmp/chunks.txt" 2>/dev/null || fail "bench --prefill-chunk 16"
grep -qE "^  prefill of 400 tokens \(16-token chunks" "$tmp/chunks.txt" || fail "prefill chunk line: $(cat "$tmp/chunks.txt")"
grep -qE "^  prefill chunk rate by context \(tok/s\): 16: [0-9]+ " "$tmp/chunks.txt" || fail "chunk rates: $(cat "$tmp/chunks.txt")"
python3 -c "import json,sys; r=json.load(open(sys.argv[1]))[0]; c=r['prefill_chunk_tok_per_s_by_context']; assert r['prefill_chunk_tokens']==16 and len(c)==12 and c[0]['context']==16 and all(x['tok_per_s']>0 for x in c), r" \
  "$tmp/chunks.json" || fail "chunk rates json"
expect 2 "--prefill-chunk must be 1..65536" -- "$dsmesh" bench --device cpu --model "$tmp/a" --contexts 40 --prefill-chunk 0
# --speculative-tokens 3: every stream's state speculates (rollback rows, MTP history) and proposes no drafts.
"$dsmesh" bench --device cpu --model "$tmp/a" --contexts 40 --streams 1 --steps 2 --speculative-tokens 3 \
  --json "$tmp/spec.json" > "$tmp/spec.txt" 2>/dev/null || fail "bench --speculative-tokens 3"
grep -q "^# every stream speculates 3 tokens" "$tmp/spec.txt" || fail "bench --speculative-tokens: $(cat "$tmp/spec.txt")"
python3 -c "import json,sys; r=json.load(open(sys.argv[1])); assert len(r)==1 and r[0]['speculative_tokens']==3 and r[0]['ms_per_step']>0, r" \
  "$tmp/spec.json" || fail "bench --speculative-tokens json"
expect 2 "--speculative-tokens: at most 4" -- "$dsmesh" bench --device cpu --model "$tmp/a" --contexts 40 --streams 1 --steps 1 --speculative-tokens 9
"$dsmesh" make-tiny --out "$tmp/nomtp" --mtp-layers 0 >/dev/null 2>&1 || fail "make-tiny --mtp-layers 0"
expect 2 "has no MTP block" -- "$dsmesh" bench --device cpu --model "$tmp/nomtp" --contexts 40 --streams 1 --steps 1 --speculative-tokens 3
# --profile on a backend that cannot time ops still runs (CPU: no op timings, an empty split).
"$dsmesh" bench --device cpu --model "$tmp/a" --contexts 40 --streams 1 --steps 1 --profile > "$tmp/prof.txt" 2>/dev/null ||
  fail "bench --profile on the CPU"
grep -q "^  step graphs: none (this backend records no graphs)" "$tmp/prof.txt" || fail "bench --profile graphs line: $(cat "$tmp/prof.txt")"
# project-reference (also named project-seat): a clear error for a missing or profile-less file.
for cmd in project-reference project-seat; do
  expect 2 "cannot open the file" -- "$dsmesh" $cmd --profile "$tmp/none.json"
  expect 2 "no row with a profile" -- "$dsmesh" $cmd --profile "$tmp/bench.json"
done

[[ $status == 0 ]] && echo "PASS"
exit $status
