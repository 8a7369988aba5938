#!/usr/bin/env bash
# dsmesh-kernel-bench rejects bad flags with a usage error (exit 2) naming the flag, before it touches a
# GPU (so this runs on the CI machine too); with no GPU visible it says so and names nvidia-smi (exit 1).
set -u
bench=$1
fail=0
expect_usage() {  # expected text, then the arguments
  local want=$1
  shift
  local out rc
  out=$("$bench" "$@" 2>&1)
  rc=$?
  if [[ $rc -ne 2 || $out != *"$want"* ]]; then
    echo "FAIL: dsmesh-kernel-bench $* -> exit $rc, output: $out (want exit 2 and '$want')"
    fail=1
  else
    echo "ok   dsmesh-kernel-bench $*: $out"
  fi
}
expect_usage "--replays" --replays x
expect_usage "--replays" --replays 0
expect_usage "--replays" --replays 3,4
expect_usage "--only" --only dens
expect_usage "unknown flag --bogus" --bogus
expect_usage "--moe-items-per-sm" --moe-items-per-sm 2,x
out=$(CUDA_VISIBLE_DEVICES= "$bench" --only dense 2>&1)
rc=$?
if [[ $rc -ne 1 || $out != *"no CUDA GPU is visible"* || $out != *nvidia-smi* ]]; then
  echo "FAIL: dsmesh-kernel-bench with no GPU visible -> exit $rc, output: $out (want exit 1, 'no CUDA GPU is visible', nvidia-smi)"
  fail=1
else
  echo "ok   dsmesh-kernel-bench with no GPU visible: $out"
fi
exit $fail
