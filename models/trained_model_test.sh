#!/usr/bin/env bash
# The trained default model (models/dsv4-small, docs/trained-model.md) as users get it: `dsmesh up` with no
# --model serves it, and its quality holds with margins: held-out perplexity under a bound, and definition
# questions through the real chat path (gateway chat template, 2 CPU workers, greedy) answered in the
# trained answer form, naming the asked word.
set -u
dsmesh=cli/dsmesh
[[ -x $dsmesh ]] || { echo "FAIL: $dsmesh not found in runfiles" >&2; exit 1; }
tmp="${TEST_TMPDIR:-$(mktemp -d)}/trained_model_test"
rm -rf "$tmp" && mkdir -p "$tmp"
status=0
fail() { echo "FAIL: $*" >&2; status=1; }
up_pid=
cleanup() {
  if [[ -n $up_pid ]] && kill -0 "$up_pid" 2>/dev/null; then
    kill -INT "$up_pid"
    for _ in $(seq 60); do kill -0 "$up_pid" 2>/dev/null || break; sleep 0.5; done
  fi
}
trap cleanup EXIT

# Held-out perplexity over the whole of models/testdata/heldout.txt (46 windows of 512 tokens, text no
# training run saw): 42.937 on the CPU (docs/trained-model.md). The bound leaves 2.5 % for arithmetic
# differences between machines; a broken load, a wrong kernel or another model's weights give far more
# (the random make-tiny model: ~10^5).
"$dsmesh" ppl --model models/dsv4-small --file models/testdata/heldout.txt --ctx 512 >"$tmp/ppl.json" \
  2>"$tmp/ppl.err" || fail "ppl: $(cat "$tmp/ppl.err")"
grep -q "head EXL3 K4" "$tmp/ppl.err" || fail "the load line does not show the EXL3 head: $(grep load "$tmp/ppl.err")"
python3 - "$tmp/ppl.json" <<'PY' || fail "held-out perplexity above its bound"
import json, sys
r = json.load(open(sys.argv[1]))
print(f"held-out ppl (46 windows of 512): {r['ppl']:.3f}, bound 44.0")
assert r["windows"] == 46 and r["scored_tokens"] == 23506, r
assert r["ppl"] < 44.0, r
PY

port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
cport=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$dsmesh" up --world 2 --threads 1 --port "$port" --coordinator-port "$cport" --kv-memory 256M \
  --heartbeat-timeout-ms 10000 --log-dir "$tmp/logs" 2>"$tmp/up.err" &
up_pid=$!
for _ in $(seq 240); do
  grep -q "dsmesh up: ready" "$tmp/up.err" && break
  kill -0 "$up_pid" 2>/dev/null || break
  sleep 0.5
done
grep -q "dsmesh up: ready" "$tmp/up.err" || { echo "FAIL: dsmesh up not ready: $(cat "$tmp/up.err")" >&2; exit 1; }
grep -q "serving the trained small model" "$tmp/up.err" || fail "dsmesh up without --model did not pick the trained model"

python3 - "http://127.0.0.1:$port" <<'PY' || fail "definition answers"
import json, sys, urllib.request
url = sys.argv[1]
models = json.load(urllib.request.urlopen(url + "/v1/models"))["data"]
assert [m["id"] for m in models] == ["dsv4-small"], models
# The chat stage taught the answer form ("The word 'harbour' is a noun meaning ...") with the asked word
# copied from the question; the glosses themselves are mostly wrong at this size (docs/trained-model.md,
# "Quality"). So the check is the form, naming the asked word, in readable ASCII English, for words the
# training split defines; a random or mis-loaded model fails it. One miss of five is tolerated (greedy
# near-ties may differ between machines); this machine answers all five.
import re
FORM = re.compile(r"""^The word (['"])([A-Za-z]+)\1 is an? (noun|verb|adjective|adverb) meaning [a-z]""")
CASES = [("What does 'harbour' mean?", "harbour"), ("Define 'king'.", "king"), ("What does 'bread' mean?", "bread"),
         ("What is meant by 'city'?", "city"), ('What does the word "water" mean?', "water")]
misses = 0
for q, word in CASES:
    body = {"model": "dsv4-small", "messages": [{"role": "user", "content": q}], "max_tokens": 48, "temperature": 0}
    req = urllib.request.Request(url + "/v1/chat/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    answer = json.load(urllib.request.urlopen(req, timeout=300))["choices"][0]["message"]["content"] or ""
    words = re.findall(r"[A-Za-z]+", answer)
    m = FORM.match(answer)
    hit = bool(m) and m.group(2) == word and answer.isascii() and len(words) >= 6
    misses += not hit
    print(f"{'ok  ' if hit else 'MISS'} {q!r} -> {answer!r}")
assert misses <= 1, f"{misses} of {len(CASES)} answers do not name the asked word in the trained answer form"
PY
exit $status
