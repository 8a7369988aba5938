#!/usr/bin/env bash
# Runs one node test script of tests/gateway under Bazel: fails clearly when DSMESH_ROOT is unset
# (the npm packages live under it), otherwise hands the remaining arguments to the script.
set -euo pipefail
if [[ -z "${DSMESH_ROOT:-}" ]]; then
  echo "FAIL: DSMESH_ROOT is not set; run through ./dsmesh test or export DSMESH_ROOT=<repo root>" >&2
  exit 1
fi
for package in openai @anthropic-ai/sdk; do
  if [[ ! -d "$DSMESH_ROOT/tests/node/node_modules/$package" ]]; then
    echo "FAIL: $DSMESH_ROOT/tests/node/node_modules/$package is missing; run (cd tests/node && npm ci)" >&2
    exit 1
  fi
done
script=$1
shift
exec node "$script" "$@"
