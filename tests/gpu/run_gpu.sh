#!/usr/bin/env bash
# The model forward on the GPU machine, from a bundle made by tests/gpu/make_bundle.sh: the GPU tests
# (a skip is a failure here), compute-sanitizer on a full forward, the CLI on the GPU (golden logits and
# greedy tokens with 1 and 2 worker processes on one GPU), `dsmesh up --device cuda` serving the
# OpenAI API (chat, streaming, a client disconnect) checked with curl, and `dsmesh up` with no device flag
# choosing the GPU and surviving a worker killed mid-stream (how long serving was down). Logs go to $OUT
# (or /tmp/out).
#   usage (repository root on the GPU machine): tests/gpu/run_gpu.sh [parts]
#   parts: any of tests,sanitize,cli,serve,survive,flash,flashbench,profile,timeline,specbench,prefill,specloop,
#          specserve (default: all but the benches and specserve)
#   env: GPU_TESTS (test binaries of the tests part), GTEST_FILTER (passed through to them);
#        DSMESH_BIN: a dsmesh with its siblings laid out as in bazel-bin (bazel-bin/cli/dsmesh) instead of the
#        bundle, e.g. `DSMESH_BIN=bazel-bin/cli/dsmesh DEVICE=cpu tests/gpu/run_gpu.sh specserve` without a GPU
set -uo pipefail
B=.bundle/gpu
PARTS=${1:-tests,sanitize,cli,serve,survive,flash}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
fail=0
step() { echo; echo "=== $*"; }
check() { if "$@"; then echo "PASS: $*"; else echo "FAIL: $*"; fail=1; fi; }
# Whether PARTS (comma-separated) names this part exactly ("flashbench" does not also run "flash").
has() { [[ ",$PARTS," == *",$1,"* ]]; }
export DSMESH_ROOT=$PWD DSMESH_REQUIRE_GPU_TESTS=1
# What travels xz-compressed: binaries, libraries, the trained model's shards (make_bundle.sh).
[[ -d $B ]] && find "$B" ${BASE_LIBS:+"$BASE_LIBS"} -name '*.xz' | while read -r z; do xz -dc "$z" > "${z%.xz}" && chmod +x "${z%.xz}" && rm "$z"; done
if [[ -n ${DSMESH_BIN:-} ]]; then
  DS=$DSMESH_BIN
else
  CUBLAS_DIR=$(dirname "$(ls /usr/local/cuda/lib64/libcublas.so.13 2>/dev/null ||
    find "$(python3 -c 'import nvidia; print(list(nvidia.__path__)[0])' 2>/dev/null)" /usr -name 'libcublas.so.13' 2>/dev/null | head -1)")
  export LD_LIBRARY_PATH=$B/lib:$CUBLAS_DIR
  # `dsmesh up` finds its siblings as bazel-bin lays them out (cli/, worker/, coordinator/, gateway/).
  for p in cli/dsmesh worker/dsmesh-worker coordinator/dsmesh-coordinator gateway/dsmesh-gateway; do
    mkdir -p "$B/tree/${p%/*}" && cp -f "$B/bin/${p##*/}" "$B/tree/$p"
  done
  DS=$B/tree/cli/dsmesh
fi
command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/gpu.txt"
GOLDEN=tests/golden/tiny_v4

if has tests; then
  step "GPU tests (DSMESH_REQUIRE_GPU_TESTS=1: a missing GPU fails)"
  for t in ${GPU_TESTS:-exl3_gemv_test cuda_backend_test graph_chain_test cupti_timeline_test gpu_forward_test gpu_pdl_test gpu_profile_test gpu_timeline_test gpu_vision_test cuda_ipc_communicator_test}; do
    timeout 400 "$B/bin/$t" 2>&1 | tee "$OUT/$t.log" | grep -E "^\[  |FAIL|Failure|rel L2|ms/step|Expected|which is|SKIPPED" | head -80
    check grep -q "^\[  PASSED  \]" "$OUT/$t.log"
    check test "$(grep -c '^\[  FAILED  \]' "$OUT/$t.log")" = 0
    check test "$(grep -c 'SKIPPED' "$OUT/$t.log")" = 0
  done
fi

if has sanitize; then
  # SAN_BIN/SAN_FILTER pick another workload: racecheck (shared-memory hazards, kernel by kernel) runs far
  # slower than memcheck, and the kernel tests reach every kernel that uses shared memory in seconds.
  step "compute-sanitizer on ${SAN_BIN:-gpu_forward_test} ${SAN_FILTER:-*SanitizerWorkload*} (default: a full forward, prefill + 8 decode steps, batch of 4)"
  for tool in ${SAN_TOOLS:-memcheck racecheck initcheck}; do
    timeout ${SAN_TIMEOUT:-300} /usr/local/cuda/bin/compute-sanitizer --tool $tool --error-exitcode 9 "$B/bin/${SAN_BIN:-gpu_forward_test}" \
      --gtest_filter="${SAN_FILTER:-*SanitizerWorkload*}" > "$OUT/sanitizer_$tool.log" 2>&1
    rc=$?
    echo "compute-sanitizer $tool: exit $rc $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitizer_$tool.log" | tr '\n' ' ')"
    check test $rc = 0
  done
fi

if has cli; then
  step "CLI on the GPU: golden logits and greedy tokens, 1 process and 2 worker processes on one GPU"
  ids=$(python3 -c "from safetensors.numpy import load_file; print(','.join(str(int(v)) for v in load_file('$GOLDEN/golden.safetensors')['input_ids'].reshape(-1)))")
  want=$(python3 -c "from safetensors.numpy import load_file; print(','.join(str(int(v)) for v in load_file('$GOLDEN/golden.safetensors')['greedy_tokens'].reshape(-1)))")
  n=$(echo "$want" | tr ',' '\n' | wc -l)
  for mode in "" "--world 2"; do
    tag=${mode:+tp2}; tag=${tag:-tp1}
    timeout 120 $DS logits --model $GOLDEN --tokens "$ids" --out /tmp/logits_$tag.safetensors --device cuda $mode 2>"$OUT/logits_$tag.log"
    check python3 tests/gpu/compare_logits.py $GOLDEN/golden.safetensors logits /tmp/logits_$tag.safetensors 1e-3
    got=$(timeout 120 $DS generate --model $GOLDEN --tokens "$ids" --max-new-tokens "$n" --ignore-eos --device cuda $mode 2>"$OUT/generate_$tag.log" |
          python3 -c "import json,sys; print(','.join(map(str, json.load(sys.stdin)['tokens'])))")
    echo "greedy ($tag): $got"
    check test "$got" = "$want"
    tail -2 "$OUT/generate_$tag.log"
  done
  step "dsmesh generate on the embedded tiny model: GPU and CPU, 64 tokens"
  timeout 200 $DS make-tiny --out /tmp/tiny >/dev/null 2>&1
  prompt=0,128803,1024,77,2048,9000,128804
  g=$(timeout 120 $DS generate --model /tmp/tiny --tokens $prompt --max-new-tokens 64 --ignore-eos --device cuda 2>"$OUT/tiny_gpu.log")
  c=$(timeout 300 $DS generate --model /tmp/tiny --tokens $prompt --max-new-tokens 64 --ignore-eos --device cpu 2>"$OUT/tiny_cpu.log")
  tail -1 "$OUT/tiny_gpu.log"; tail -1 "$OUT/tiny_cpu.log"
  check test "$g" = "$c"
  step "no device flag: the GPU, said so"
  $DS generate --model /tmp/tiny --tokens 1,2 --max-new-tokens 1 2>&1 >/dev/null | grep "device:" | tee "$OUT/default_device.txt"
  check grep -q "^\[load\] device: cuda:0 (" "$OUT/default_device.txt"
  step "no GPU visible: a clear error"
  CUDA_VISIBLE_DEVICES='' $DS generate --model /tmp/tiny --tokens 1,2 --device cuda 2>&1 | tail -1 | tee "$OUT/nogpu.txt"
  check grep -q "no CUDA GPU is visible" "$OUT/nogpu.txt"
fi

if has flash; then
  step "full-size DeepSeek-V4-Flash, synthetic EXL3 pack (experts K2, dense K6) generated on the GPU: one stream, graphs and eager"
  prompt=$(python3 -c "print(','.join(str((i * 7919) % 120000 + 1000) for i in range(${FLASH_PROMPT:-16})))")
  for mode in graphs eager; do
    flag=; [[ $mode == eager ]] && flag=--enforce-eager
    timeout 500 $DS generate --model synthetic:v4-flash:seed=1 --device cuda --tokens "$prompt" \
      --max-new-tokens ${FLASH_TOKENS:-24} --ignore-eos $flag \
      > "$OUT/flash_tokens_$mode.json" 2> "$OUT/flash_$mode.log"
    check test $? = 0
    echo "-- $mode"; grep -E "\[load\] (layer 43|done)|routed experts|CUDA graphs|graph capture|prefill|decode|error" "$OUT/flash_$mode.log" | head -8
  done
  head -c 300 "$OUT/flash_tokens_graphs.json"; echo
  check cmp "$OUT/flash_tokens_graphs.json" "$OUT/flash_tokens_eager.json"
  nvidia-smi --query-gpu=memory.used --format=csv
fi

if has flashbench; then
  step "dsmesh bench on the full-size synthetic V4-Flash: decode at 1 and 4 streams, 4K context, beside the floor"
  # modes: graphs (everything recorded), stateful-eager (the stateful part eager between the graph segments,
  # DSMESH_CUDA_STATEFUL_GRAPHS=off), eager (--enforce-eager), pdl (graphs with programmatic dependent
  # launch, DSMESH_CUDA_PDL=1), block (one graph per decode block, DSMESH_CUDA_BLOCK_GRAPHS=1), base (graphs
  # with the libraries of folder $BASE_LIBS first on the library
  # path: an earlier build's kernels, side by side with this one's in one call). A mode named twice runs
  # twice (its logs get a run number), so "base graphs base graphs" alternates.
  declare -A seen=()
  for mode in ${FLASH_MODES:-graphs eager}; do
    seen[$mode]=$(( ${seen[$mode]:-0} + 1 ))
    tag=$mode; (( ${seen[$mode]} > 1 )) && tag=$mode${seen[$mode]}
    flag=; [[ $mode == eager ]] && flag=--enforce-eager
    sg=on; [[ $mode == stateful-eager ]] && sg=off
    pdl=0; [[ $mode == pdl ]] && pdl=1
    blocks=0; [[ $mode == block ]] && blocks=1
    libs=$LD_LIBRARY_PATH; [[ $mode == base ]] && libs=${BASE_LIBS:?mode base needs BASE_LIBS}:$LD_LIBRARY_PATH
    LD_LIBRARY_PATH=$libs DSMESH_CUDA_PDL=$pdl DSMESH_CUDA_BLOCK_GRAPHS=$blocks DSMESH_CUDA_STATEFUL_GRAPHS=$sg timeout 500 $DS bench --device cuda --model synthetic:v4-flash:seed=1 --contexts ${FLASH_CONTEXTS:-4096} \
      --streams ${FLASH_STREAMS:-1,4} --steps ${FLASH_STEPS:-10} $flag \
      --json "$OUT/flash_bench_$tag.json" 2> "$OUT/flash_bench_$tag.log" | tee "$OUT/flash_bench_$tag.txt"
    check test -s "$OUT/flash_bench_$tag.json"
    grep -E "CUDA graphs|graph capture|arena|decode block" "$OUT/flash_bench_$tag.log" | head -4
  done
fi

if has profile; then
  step "dsmesh bench --profile on the full-size synthetic V4-Flash: graphs timed, then every op timed eagerly by device events"
  timeout ${PROFILE_TIMEOUT:-400} $DS bench --device cuda --model synthetic:v4-flash:seed=1 --contexts ${FLASH_CONTEXTS:-4096} \
    --streams ${FLASH_STREAMS:-1,4} --steps ${FLASH_STEPS:-8} --profile --prefill-chunk ${PROFILE_CHUNK:-512} \
    --json "$OUT/flash_profile.json" 2> "$OUT/flash_profile.log" | tee "$OUT/flash_profile.txt"
  check test -s "$OUT/flash_profile.json"
fi

if has timeline; then
  # Where a decode step's wall time goes on the device: busy vs idle, the idle gaps by cause (graph boundaries,
  # inside graphs, around the parameter uploads, step start and end) and the device waiting for the host.
  step "dsmesh bench --timeline on the full-size synthetic V4-Flash: ${TIMELINE_STEPS:-4} decode steps traced with CUPTI after the timed ones"
  timeout ${TIMELINE_TIMEOUT:-400} $DS bench --device cuda --model synthetic:v4-flash:seed=1 --contexts ${FLASH_CONTEXTS:-4096} \
    --streams ${FLASH_STREAMS:-1,4} --steps ${FLASH_STEPS:-8} --timeline --timeline-steps ${TIMELINE_STEPS:-4} \
    --json "$OUT/flash_timeline.json" 2> "$OUT/flash_timeline.log" | tee "$OUT/flash_timeline.txt"
  check test -s "$OUT/flash_timeline.json"
  check grep -q "device busy" "$OUT/flash_timeline.txt"
fi

if has specbench; then
  step "dsmesh bench, verification shape (1 + 3 draft rows per stream) beside the plain decode step, full-size V4-Flash, graphs"
  for rows in 1 4; do
    timeout 400 $DS bench --device cuda --model synthetic:v4-flash:seed=1 --contexts ${FLASH_CONTEXTS:-4096} \
      --streams ${FLASH_STREAMS:-1,4} --steps ${FLASH_STEPS:-8} --rows $rows \
      --json "$OUT/spec_bench_rows$rows.json" 2> "$OUT/spec_bench_rows$rows.log" | tee "$OUT/spec_bench_rows$rows.txt"
    check test -s "$OUT/spec_bench_rows$rows.json"
  done
fi

if has prefill; then
  # Issue 41: prefill rate by chunk size at 4K, then one long prompt with the chunk rate at every tenth of it.
  step "dsmesh bench: prefill of the full-size synthetic V4-Flash by chunk size (4K), then a ${PREFILL_LONG:-166000}-token prompt"
  # PREFILL_MOE=per-expert|row-slices runs the routed experts' older paths (DSMESH_CUDA_PREFILL_MOE) for an A/B.
  moe_env=(${PREFILL_MOE:+DSMESH_CUDA_PREFILL_MOE=$PREFILL_MOE})
  for chunk in ${PREFILL_CHUNKS:-512 2048 4096}; do
    env "${moe_env[@]}" timeout 300 $DS bench --device cuda --model synthetic:v4-flash:seed=1 --contexts 4096 --streams 1 --steps 2 \
      --prefill-chunk $chunk --json "$OUT/prefill_chunk$chunk.json" 2> "$OUT/prefill_chunk$chunk.log" |
      tee "$OUT/prefill_chunk$chunk.txt" | grep -E "prefill"
    check test -s "$OUT/prefill_chunk$chunk.json"
  done
  env "${moe_env[@]}" timeout 560 $DS bench --device cuda --model synthetic:v4-flash:seed=1 --contexts ${PREFILL_LONG:-166000} --streams 1 \
    --steps 2 --prefill-chunk ${PREFILL_LONG_CHUNK:-512} --json "$OUT/prefill_long.json" 2> "$OUT/prefill_long.log" |
    tee "$OUT/prefill_long.txt" | grep -E "prefill|^1 "
  check test -s "$OUT/prefill_long.json"
fi

if has specloop; then
  # Issue 42: the whole speculative loop on a mesh of one GPU worker, speculation on and off in one call.
  step "dsmesh bench --world 1 --device cuda: speculative loop at simulated acceptance, full-size synthetic V4-Flash"
  for acc in ${SPEC_ACCEPTANCE:-0.85,0.70,0.55 0.3,0.1,0.0}; do
    timeout 560 $DS bench --world 1 --device cuda --model synthetic:v4-flash:seed=1 --streams ${FLASH_STREAMS:-1,4} \
      --max-tokens ${SPEC_TOKENS:-256} --repeat ${SPEC_REPEAT:-2} \
      --speculative-config "{\"method\":\"mtp\",\"num_speculative_tokens\":3,\"draft_vocab_size\":${SPEC_DRAFT_VOCAB:-32768}}" \
      --draft-acceptance $acc --json "$OUT/specloop_$acc.json" 2> "$OUT/specloop_$acc.log" | tee "$OUT/specloop_$acc.txt"
    check test -s "$OUT/specloop_$acc.json"
  done
fi

if has serve; then
  # The random tiny model by name (served as "tiny-model"), so that these checks do not depend on the
  # trained pack being in the carried tree.
  TINY=/tmp/tiny-model
  [[ -f $TINY/config.json ]] || $DS make-tiny --out $TINY > /dev/null
  for world in 1 2; do
    step "dsmesh up --device cuda --world $world: chat, streaming, disconnect (curl)"
    port=$((8100 + world))
    $DS up --model $TINY --device cuda --world $world --port $port --kv-memory 2G > "$OUT/up_w$world.log" 2>&1 &
    up=$!
    for _ in $(seq 1 240); do
      curl -sf localhost:$port/health >/dev/null && break
      sleep 0.5
    done
    body='{"model":"tiny-model","messages":[{"role":"user","content":"Hello"}],"max_tokens":24}'
    curl -s localhost:$port/v1/chat/completions -H 'content-type: application/json' -d "$body" > "$OUT/chat_w$world.json"
    head -c 400 "$OUT/chat_w$world.json"; echo
    check python3 -c "import json; r=json.load(open('$OUT/chat_w$world.json')); assert r['choices'][0]['finish_reason'] and r['usage']['completion_tokens'] > 0"
    sbody='{"model":"tiny-model","messages":[{"role":"user","content":"Tell me a story"}],"max_tokens":40,"stream":true}'
    curl -sN localhost:$port/v1/chat/completions -H 'content-type: application/json' -d "$sbody" > "$OUT/stream_w$world.txt"
    check grep -q "data: \[DONE\]" "$OUT/stream_w$world.txt"
    echo "stream chunks: $(grep -c '^data: ' "$OUT/stream_w$world.txt")"
    # A client that goes away mid-stream: the request is cancelled and the server serves the next one.
    lbody='{"model":"tiny-model","messages":[{"role":"user","content":"Go on forever"}],"max_tokens":4000,"stream":true,"ignore_eos":true}'
    timeout 1 curl -sN localhost:$port/v1/chat/completions -H 'content-type: application/json' -d "$lbody" > /dev/null
    sleep 1
    curl -s localhost:$port/metrics | grep -E '^vllm:num_requests_running|^vllm:num_requests_waiting' | tee "$OUT/metrics_w$world.txt"
    check grep -qE '^vllm:num_requests_running(\{[^}]*\})? 0' "$OUT/metrics_w$world.txt"
    curl -s localhost:$port/v1/chat/completions -H 'content-type: application/json' -d "$body" > "$OUT/chat2_w$world.json"
    check python3 -c "import json; r=json.load(open('$OUT/chat2_w$world.json')); assert r['usage']['completion_tokens'] > 0"
    gbody='{"model":"tiny-model","messages":[{"role":"user","content":"Count to ten"}],"max_tokens":48,"temperature":0}'
    curl -s localhost:$port/v1/chat/completions -H 'content-type: application/json' -d "$gbody" > "$OUT/greedy_w$world.json"
    grep -E "backend|holds" "$OUT/up_w$world.log" | head -4
    kill -INT $up; wait $up
  done
  # A tiny model with 3 MTP blocks, as V4 is trained to draft: draft i runs block i.
  TINY3=/tmp/tiny-model-mtp3
  [[ -f $TINY3/config.json ]] || $DS make-tiny --out $TINY3 --mtp-layers 3 > /dev/null
  for world in 1 2; do
    port=$((8110 + world))
    step "dsmesh up --device cuda --world $world, 3 MTP blocks: greedy with speculation (3 drafts) equals speculation off"
    for spec in off on; do
      sflag=(); [[ $spec == on ]] && sflag=(--speculative-config '{"method":"mtp","num_speculative_tokens":3}' --draft-policy fixed)
      $DS up --model $TINY3 --device cuda --world $world --port $port --kv-memory 2G "${sflag[@]}" > "$OUT/up_mtp3_w${world}_$spec.log" 2>&1 &
      up=$!
      for _ in $(seq 1 240); do curl -sf localhost:$port/health >/dev/null && break; sleep 0.5; done
      for q in "Count to ten" "Write a poem about the sea" "What is a prime number?"; do
        qb="{\"model\":\"tiny-model-mtp3\",\"messages\":[{\"role\":\"user\",\"content\":\"$q\"}],\"max_tokens\":64,\"temperature\":0,\"ignore_eos\":true}"
        curl -s localhost:$port/v1/chat/completions -H 'content-type: application/json' -d "$qb" >> "$OUT/mtp3_w${world}_$spec.jsonl"
        echo >> "$OUT/mtp3_w${world}_$spec.jsonl"
      done
      curl -s localhost:$port/metrics | grep -E '^vllm:spec_decode_num_(draft|accepted)_tokens_total' > "$OUT/spec_metrics_w${world}_$spec.txt"
      kill -INT $up; wait $up
    done
    check python3 -c "
import json
a=[json.loads(l)['choices'][0]['message'] for l in open('$OUT/mtp3_w${world}_off.jsonl') if l.strip()]
b=[json.loads(l)['choices'][0]['message'] for l in open('$OUT/mtp3_w${world}_on.jsonl') if l.strip()]
assert len(a) == 3 and a == b, (a, b)
print('greedy equal over', len(a), 'requests of 64 tokens')"
    cat "$OUT/spec_metrics_w${world}_on.txt"
    check grep -qE '^vllm:spec_decode_num_draft_tokens_total(\{[^}]*\})? [1-9]' "$OUT/spec_metrics_w${world}_on.txt"
  done
fi
if has survive; then
  # `dsmesh up` without --device or --world: one worker on the GPU. A long stream runs, the worker gets
  # SIGKILL in the middle of it; the stream must end at once with an error, `up` restarts the worker (its
  # weights reloaded onto the GPU), and the figure is how long serving was down: from the kill until a new
  # request succeeds.
  step "dsmesh up (no device flag) on the GPU: a worker killed mid-stream, time until serving again"
  TINY=/tmp/tiny-model
  [[ -f $TINY/config.json ]] || $DS make-tiny --out $TINY > /dev/null
  port=8120
  ulog=$OUT/up_survive.log
  $DS up --model $TINY --port $port --log-dir "$OUT/up_survive_logs" > "$ulog" 2>&1 &
  up=$!
  # `up` itself says "ready" (it polls the coordinator every 200 ms): a kill before that is a failure during
  # start-up, reported as "ready" after the restart, not as "serving again".
  for _ in $(seq 1 240); do grep -q "^dsmesh up: ready" "$ulog" && curl -sf localhost:$port/health >/dev/null && break; sleep 0.5; done
  grep -E "dsmesh up: device|worker\(s\) on|backend" "$ulog" | head -4
  check grep -q "dsmesh up: device: cuda:0 (" "$ulog"
  check grep -q "1 worker(s) on cuda:0" "$ulog"
  worker=$(sed -nE 's/.*dsmesh up: started .*worker0 pid ([0-9]+).*/\1/p' "$ulog" | head -1)
  lbody='{"model":"tiny-model","messages":[{"role":"user","content":"Go on forever"}],"max_tokens":4000,"stream":true,"ignore_eos":true}'
  stream=$OUT/survive_stream.txt
  curl -sN --max-time 60 localhost:$port/v1/chat/completions -H 'content-type: application/json' -d "$lbody" > "$stream" &
  client=$!
  for _ in $(seq 1 100); do (( $(grep -c '^data: ' "$stream") >= 5 )) && break; sleep 0.05; done
  chunks_before=$(grep -c '^data: ' "$stream")
  t0=$(date +%s.%N)
  check test -n "$worker"
  kill -KILL "$worker"
  wait $client
  t_stream=$(date +%s.%N)
  check grep -q '"error"' "$stream"
  check grep -q "data: \[DONE\]" "$stream"
  body='{"model":"tiny-model","messages":[{"role":"user","content":"Hello"}],"max_tokens":8}'
  t1=
  for _ in $(seq 1 1200); do
    code=$(curl -s -o "$OUT/survive_after.json" -w '%{http_code}' --max-time 30 localhost:$port/v1/chat/completions \
      -H 'content-type: application/json' -d "$body")
    if [[ $code == 200 ]]; then t1=$(date +%s.%N); break; fi
    sleep 0.1
  done
  check test -n "$t1"
  check python3 -c "import json; r=json.load(open('$OUT/survive_after.json')); assert r['usage']['completion_tokens'] > 0"
  check grep -q "worker0 restarted as pid" "$ulog"
  for _ in $(seq 1 50); do grep -q "dsmesh up: serving again" "$ulog" && break; sleep 0.1; done  # up polls every 200 ms
  check grep -q "dsmesh up: serving again" "$ulog"
  check test "$(grep -c 'backend cuda' "$ulog")" -ge 2
  python3 - "$t0" "$t_stream" "${t1:-nan}" "$chunks_before" <<'PY' | tee "$OUT/survive.txt"
import sys
t0, ts, t1, n = float(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
print(f"worker SIGKILLed after {n} stream chunks: the stream ended {ts - t0:.2f} s later (with an error event); "
      f"serving was down for {t1 - t0:.2f} s (kill -> the first request that succeeded)")
PY
  grep -E "exited|restarted|serving again" "$ulog" | head -4
  kill -INT $up; wait $up
fi

if has specserve; then
  # Issue 42: speculation as a client of `dsmesh up` sees it, on the trained default model (models/dsv4-small,
  # served when no --model is given): the same chat completions (tests/gpu/spec_serve.py: 8 prompts, greedy and
  # sampled sets) with 3 MTP drafts under each draft policy of SPEC_POLICIES and with speculation off, one mesh
  # after the other; tok/s on / off, the acceptance per position from the vllm:spec_decode_* counters.
  # DEVICE (cuda; cpu runs the same part without a GPU), SPEC_WORLD (workers; up's default), SPEC_TOKENS (128
  # per request), SPEC_REPEAT (2 runs of each set), SPEC_STREAMS (1 client at a time) choose the runs.
  DEVICE=${DEVICE:-cuda}
  step "dsmesh up --device $DEVICE, trained default model: speculation (${SPEC_DRAFTS:-3} MTP drafts, policies ${SPEC_POLICIES:-fixed adaptive}) and off"
  # The model's shards travel in the bundle (make_bundle.sh with BUNDLE_TRAINED_MODEL=1) when the carried
  # tree leaves them out; they go where `dsmesh up` looks for the default model.
  for f in "$B"/models/dsv4-small/*.safetensors; do
    [[ -e $f && ! -e models/dsv4-small/${f##*/} ]] && ln -s "$PWD/$f" models/dsv4-small/
  done
  port=8130
  ons=()
  # SPEC_DRAFT_VOCAB: the drafts' draft_vocab_size (default: the whole vocabulary); SPEC_UP_FLAGS: more flags
  # for every `dsmesh up` (e.g. --heartbeat-timeout-ms on a loaded CPU machine).
  spec="{\"method\":\"mtp\",\"num_speculative_tokens\":${SPEC_DRAFTS:-3}${SPEC_DRAFT_VOCAB:+,\"draft_vocab_size\":$SPEC_DRAFT_VOCAB}}"
  for mode in ${SPEC_POLICIES:-fixed adaptive} off; do
    sflag=()
    [[ $mode != off ]] && sflag=(--speculative-config "$spec" --draft-policy "$mode")
    eflag=(); [[ $mode == fixed ]] && eflag=(--expect-drafts)  # the fixed policy proposes every draft
    ulog=$OUT/up_specserve_$mode.log
    $DS up --device "$DEVICE" ${SPEC_WORLD:+--world "$SPEC_WORLD"} --port $port "${sflag[@]}" ${SPEC_UP_FLAGS:-} > "$ulog" 2>&1 &
    up=$!
    for _ in $(seq 1 600); do
      grep -qs "^dsmesh up: ready" "$ulog" && curl -sf localhost:$port/health >/dev/null && break
      kill -0 $up 2>/dev/null || break  # `up` gave up (its reason is in the log)
      sleep 0.5
    done
    grep -E "dsmesh up: (device|serving|model)|error" "$ulog" | head -6
    check grep -q "dsmesh up: serving the trained small model" "$ulog"
    timeout ${SPEC_TIMEOUT:-500} python3 tests/gpu/spec_serve.py measure --url http://127.0.0.1:$port --label "$mode" \
      --out "$OUT/specserve_$mode.json" --max-tokens ${SPEC_TOKENS:-128} --repeat ${SPEC_REPEAT:-2} --streams ${SPEC_STREAMS:-1} "${eflag[@]}"
    check test -s "$OUT/specserve_$mode.json"
    [[ $mode != off ]] && ons+=("$OUT/specserve_$mode.json")
    kill -INT $up; wait $up
  done
  # One block: tok/s on and off and their ratio, mean accepted length, acceptance per position, draft time per
  # pass and per step, the draft policy's decisions; FAIL where greedy replies with speculation differ from
  # those without, or where the fixed policy counted no drafts (the adaptive one may rightly propose none).
  check python3 tests/gpu/spec_serve.py summary --off "$OUT/specserve_off.json" --text "$OUT/specserve.txt" "${ons[@]}"
fi

echo
[[ $fail == 0 ]] && echo "ALL GPU CHECKS PASSED" || echo "SOME GPU CHECKS FAILED"
exit $fail
