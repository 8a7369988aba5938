#!/usr/bin/env bash
# `dsmesh ppl --url` against a real `dsmesh up` mesh (coordinator + 2 CPU workers + gateway, make-tiny
# model) gives the perplexity of `dsmesh ppl --model` on the same model and file within 1e-4 relative, with
# a progress line per window; the gateway's prompt_logprobs follows vLLM's shape; bad input and an
# unreachable URL fail with a clear message.
set -u
dsmesh=cli/dsmesh
[[ -x $dsmesh ]] || { echo "FAIL: $dsmesh not found in runfiles" >&2; exit 1; }
tmp="${TEST_TMPDIR:-$(mktemp -d)}/ppl_url_test"
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

"$dsmesh" make-tiny --out "$tmp/m" --seed 5 >/dev/null 2>&1 || { echo "FAIL: make-tiny" >&2; exit 1; }
[[ -f $tmp/m/tokenizer.json ]] || { echo "FAIL: make-tiny copied no tokenizer (DSMESH_ROOT?)" >&2; exit 1; }
cat > "$tmp/text.txt" <<'TXT'
The harbour was quiet in the early morning. Fishing boats came back one by one, their nets heavy with the
night's catch, and the gulls followed them in long, noisy lines. On the quay the market was being set up:
tables, ice, scales and the chalk boards on which the prices of the day would be written. An old man sat on a
bollard and mended a net with quick, sure movements of his hands, as he had done for sixty years.
def merge(a, b):
    """Merge two sorted lists into one sorted list."""
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        if a[i] <= b[j]:
            out.append(a[i]); i += 1
        else:
            out.append(b[j]); j += 1
    return out + a[i:] + b[j:]
harbour (noun): a place on the coast where vessels may find shelter. Synonyms: haven, port.
TXT

ctx=48
"$dsmesh" ppl --model "$tmp/m" --file "$tmp/text.txt" --ctx $ctx --chunks 3 --threads 1 >"$tmp/local.json" \
  2>"$tmp/local.err" || fail "ppl --model: $(cat "$tmp/local.err")"

port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
cport=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
# A generous heartbeat timeout: the test machine may be shared by several builds (the logits rows of a
# prompt_logprobs step are capped at 8 MiB by the scheduler, but a starved worker can still miss 1.5 s).
"$dsmesh" up --model "$tmp/m" --world 2 --threads 1 --port "$port" --coordinator-port "$cport" --kv-memory 256M \
  --heartbeat-timeout-ms 10000 --log-dir "$tmp/logs" 2>"$tmp/up.err" &
up_pid=$!
for _ in $(seq 240); do
  grep -q "dsmesh up: ready" "$tmp/up.err" && break
  kill -0 "$up_pid" 2>/dev/null || break
  sleep 0.5
done
grep -q "dsmesh up: ready" "$tmp/up.err" || { echo "FAIL: dsmesh up not ready: $(cat "$tmp/up.err")" >&2; exit 1; }
url="http://127.0.0.1:$port"

"$dsmesh" ppl --url "$url" --file "$tmp/text.txt" --ctx $ctx --chunks 3 >"$tmp/remote.json" 2>"$tmp/remote.err" ||
  fail "ppl --url: $(cat "$tmp/remote.err")"
grep -q "^\[ppl\] window 3/3: running ppl" "$tmp/remote.err" || fail "ppl --url printed no progress: $(cat "$tmp/remote.err")"
echo "ppl --model: $(cat "$tmp/local.json")"
echo "ppl --url:   $(cat "$tmp/remote.json")"
python3 - "$tmp/local.json" "$tmp/remote.json" <<'PY' || fail "ppl --url differs from ppl --model"
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
assert a["windows"] == b["windows"] == 3 and a["scored_tokens"] == b["scored_tokens"] == 3 * 47, (a, b)
assert a["file_tokens"] == b["file_tokens"], (a, b)
rel = abs(a["ppl"] - b["ppl"]) / a["ppl"]
print(f"relative difference {rel:.2e} (bound 1e-4)")
assert rel <= 1e-4, rel
PY

# The gateway's prompt_logprobs: vLLM's shape, top-k alternatives, and the errors.
python3 - "$url" <<'PY' || fail "prompt_logprobs API"
import json, math, sys, urllib.request, urllib.error
url = sys.argv[1]
def post(path, body):
    req = urllib.request.Request(url + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)
prompt = [0, 422, 4573, 1584, 260]
code, r = post("/v1/completions", {"prompt": prompt, "max_tokens": 2, "temperature": 0.7, "prompt_logprobs": 3})
assert code == 200, r
lp = r["choices"][0]["prompt_logprobs"]
assert len(lp) == len(prompt) and lp[0] is None, lp
for j in range(1, len(prompt)):
    e = lp[j]
    assert str(prompt[j]) in e, e
    assert 3 <= len(e) <= 4, e
    ranks = sorted(v["rank"] for v in e.values())
    assert ranks[:3] == [1, 2, 3], e
    for v in e.values():
        assert v["logprob"] <= 0 and isinstance(v["decoded_token"], str), v
    best = min(e.values(), key=lambda v: v["rank"])
    assert all(best["logprob"] >= v["logprob"] for v in e.values()), e
print("prompt_logprobs[1] =", json.dumps(lp[1])[:200])
for body, what in (({"prompt": prompt, "prompt_logprobs": 0, "stream": True}, "stream"),
                   ({"prompt": prompt, "prompt_logprobs": 21}, "between 0 and 20")):
    code, r = post("/v1/completions", body)
    assert code == 400 and what in r["error"]["message"], (code, r)
code, r = post("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "prompt_logprobs": 1})
assert code == 400 and "/v1/completions only" in r["error"]["message"], (code, r)
PY

# Usage errors and an unreachable gateway.
out=$("$dsmesh" ppl --file "$tmp/text.txt" 2>&1); rc=$?
[[ $rc == 2 && $out == *"exactly one of --model DIR and --url"* ]] || fail "ppl without --model/--url: exit $rc: $out"
out=$("$dsmesh" ppl --url "ftp://x" --file "$tmp/text.txt" 2>&1); rc=$?
[[ $rc == 2 && $out == *"--url must start with http://"* ]] || fail "ppl --url ftp://: exit $rc: $out"
cleanup
out=$("$dsmesh" ppl --url "$url" --file "$tmp/text.txt" --timeout-s 5 2>&1); rc=$?
[[ $rc == 1 && $out == *"$url/v1/models"* ]] || fail "ppl --url to a stopped gateway: exit $rc: $out"
exit $status
