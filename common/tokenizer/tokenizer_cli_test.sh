#!/bin/bash
# `dsmesh tokenize` / `dsmesh detokenize` end to end on the committed DeepSeek-V4 tokenizer.
set -euo pipefail
: "${DSMESH_ROOT:?DSMESH_ROOT is not set (the repository root; ./dsmesh test exports it)}"
dsmesh="$1"
tok="$DSMESH_ROOT/common/tokenizer/data/deepseek_v4"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
fail() { echo "FAIL: $*" >&2; exit 1; }

printf '<｜User｜>你好<｜Assistant｜><think>推理</think>答案<｜end▁of▁sentence｜>' > "$tmp/prompt.txt"
out=$("$dsmesh" tokenize --tokenizer "$tok" --text-file "$tmp/prompt.txt")
[[ "$out" == '{"ids":[128803,30594,128804,128821,36101,128822,7624,1]}' ]] || fail "tokenize printed $out"
out=$("$dsmesh" tokenize --tokenizer "$tok/tokenizer.json" --text-file "$tmp/prompt.txt" --add-special-tokens)
[[ "$out" == '{"ids":[0,128803,30594,128804,128821,36101,128822,7624,1]}' ]] || fail "--add-special-tokens printed $out"

out=$("$dsmesh" detokenize --tokenizer "$tok" --ids 128803,30594,128804,7624,1)
[[ "$out" == '{"text":"<｜User｜>你好<｜Assistant｜>答案<｜end▁of▁sentence｜>"}' ]] || fail "detokenize printed $out"
out=$("$dsmesh" detokenize --tokenizer "$tok" --ids 0,7624,1 --skip-special-tokens)
[[ "$out" == '{"text":"答案"}' ]] || fail "--skip-special-tokens printed $out"

# Bad input: clear message, non-zero exit.
printf 'ok\xff' > "$tmp/bad.txt"
if err=$("$dsmesh" tokenize --tokenizer "$tok" --text-file "$tmp/bad.txt" 2>&1); then fail "accepted invalid UTF-8"; fi
[[ "$err" == *"$tmp/bad.txt"*"byte offset 2"* ]] || fail "invalid UTF-8 message: $err"
if err=$("$dsmesh" detokenize --tokenizer "$tok" --ids 1,x 2>&1); then fail "accepted --ids 1,x"; fi
[[ "$err" == *"'x' is not an integer"* ]] || fail "bad --ids message: $err"
if err=$("$dsmesh" detokenize --tokenizer "$tok" --ids 999999 2>&1); then fail "accepted id 999999"; fi
[[ "$err" == *"999999"* ]] || fail "out-of-range id message: $err"
if err=$("$dsmesh" tokenize --tokenizer "$tmp/nowhere" --text-file "$tmp/prompt.txt" 2>&1); then fail "loaded a missing tokenizer"; fi
[[ "$err" == *"$tmp/nowhere"* ]] || fail "missing tokenizer message: $err"
echo PASS
