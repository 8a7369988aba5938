#!/usr/bin/env bash
# Side-by-side benchmark of kernel variants in one GPU call (how every version in docs/cuda-kernels.md was measured).
#   usage (repository root on the GPU machine): kernels/cuda/ab_gpu.sh BUNDLE "VARIANTS" "SETS" [REPS]
#   BUNDLE    the bundle made by make_bundle.sh (.bundle/cuda)
#   VARIANTS  "new" is the bundle's own libraries; any other NAME is a folder BUNDLE/var/NAME whose
#             libraries (*.so, or *.so.xz as make_bundle.sh ships them) replace the bundle's, e.g. the
#             previous version's libkernels_Scuda_Slibexl3_Ucuda_Ukernels.so.xz (copy it from bazel-bin
#             with the bundle's file name, xz-compressed: a variant is ~4-6 MB, the carry limit 64 MiB)
#   SETS      benchmark sections: dense, moe, gemm
#   REPS      alternating repetitions (default 2): variants run in turn, so drifts hit all of them alike
# Extra dsmesh-kernel-bench flags per section: DENSE_ARGS, MOE_ARGS, GEMM_ARGS. Output: $OUT (or /tmp/out)
# ab_results.tgz (every log) and the SUMMARY lines on stdout.
set -uo pipefail
if (($# < 3)); then
  sed -n '2,12p' "$0"
  exit 2
fi
B=$1
VARIANTS=$2
SETS=$3
REPS=${4:-2}
OUT=${OUT:-/tmp/out}
work=$(mktemp -d)
mkdir -p "$OUT"
for v in $VARIANTS; do
  [[ $v == new ]] && continue
  [[ -d $B/var/$v ]] || { echo "ab_gpu.sh: no variant folder $B/var/$v" >&2; exit 2; }
  mkdir -p "$work/var/$v"
  for f in "$B/var/$v"/*; do
    case $f in
      *.xz) xz -dc "$f" > "$work/var/$v/$(basename "${f%.xz}")" ;;
      *) cp "$f" "$work/var/$v/" ;;
    esac
  done
done
for rep in $(seq 1 "$REPS"); do
  for set in $SETS; do
    case $set in
      dense) extra=${DENSE_ARGS:-} ;;
      moe) extra=${MOE_ARGS:-} ;;
      gemm) extra=${GEMM_ARGS:-} ;;
      *) echo "ab_gpu.sh: unknown set '$set' (dense, moe, gemm)" >&2; exit 2 ;;
    esac
    for v in $VARIANTS; do
      lib=""
      [[ $v != new ]] && lib=$work/var/$v
      VARIANT_LIB=$lib OUT=$work/run BENCH_ARGS="--only $set $extra" \
        bash "$(dirname "$0")/run_gpu.sh" "$B" bench > /dev/null 2>&1
      log=$work/logs/ab_${set}_${v}_$rep.log
      mkdir -p "$work/logs"
      mv "$work/run/bench.log" "$log" 2> /dev/null || echo "no bench output" > "$log"
      echo "$set $v rep $rep: $(grep SUMMARY "$log" | tr '\n' ' ')"
    done
  done
done
tar czf "$OUT/ab_results.tgz" -C "$work/logs" .
rm -rf "$work"
