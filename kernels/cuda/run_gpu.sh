#!/usr/bin/env bash
# Runs the EXL3 CUDA kernel tests, dsmesh-kernel-bench, compute-sanitizer and a SASS dump on the GPU
# machine from a bundle made here by kernels/cuda/make_bundle.sh. Output goes to $OUT (or /tmp/out).
#   usage (repository root on the GPU machine): kernels/cuda/run_gpu.sh [.bundle/cuda] [parts]
#   parts: any of tests,bench,sanitize,sass,ncu (default: tests,bench,sanitize,sass)
#   cuBLAS is not in the bundle: it is taken from /usr/local/cuda or python's nvidia-cublas package.
set -uo pipefail
B=$(cd "${1:-.bundle/cuda}" && pwd) || { echo "run_gpu.sh: no bundle at ${1:-.bundle/cuda} (make it with kernels/cuda/make_bundle.sh)" >&2; exit 1; }
PARTS=${2:-tests,bench,sanitize,sass}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
CUBLAS_DIR=$(dirname "$(ls /usr/local/cuda/lib64/libcublas.so.13 2>/dev/null ||
  find "$(python3 -c 'import nvidia; print(list(nvidia.__path__)[0])' 2>/dev/null)" /usr -name 'libcublas.so.13' 2>/dev/null | head -1)")
echo "cuBLAS from $CUBLAS_DIR"
# VARIANT_LIB: a folder whose libraries replace the bundle's (A/B runs of kernel variants in one call).
export LD_LIBRARY_PATH=${VARIANT_LIB:+$VARIANT_LIB:}$B/lib:$CUBLAS_DIR
# The bundle holds the repository's test vectors and anchor table at their repository paths.
export DSMESH_ROOT=$B
# make_bundle.sh ships the kernel library xz-compressed.
for z in "$B"/lib/*.so.xz; do [[ -f $z && ! -f ${z%.xz} ]] && xz -dc "$z" > "${z%.xz}"; done
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
if [[ $PARTS == *tests* ]]; then
  timeout 300 "$B/bin/exl3_gemv_test" 2>&1 | tee "$OUT/gemv_test.log" | grep -E "^\[  |FAIL|Failure|rel|Expected|which is" | head -60
  timeout 300 "$B/bin/exl3_moe_test" 2>&1 | tee "$OUT/moe_test.log" | grep -E "^\[  |FAIL|Failure|ACTIVE|rel|Expected|which is" | head -60
  timeout 300 "$B/bin/exl3_gemm_test" 2>&1 | tee "$OUT/gemm_test.log" | grep -E "^\[  |FAIL|Failure|rel|Expected|which is" | head -60
fi
if [[ $PARTS == *bench* ]]; then
  timeout 400 "$B/bin/dsmesh-kernel-bench" --anchors "$B/kernels/cuda/testdata/anchors-h200.json" ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log"
fi
if [[ $PARTS == *sanitize* ]]; then
  # SAN_TOOLS / SAN_BINS (gemv moe gemm) pick what runs; each test binary runs a filter of its tests.
  CS=/usr/local/cuda/bin/compute-sanitizer
  declare -A FILTER=([gemv]='*LinearMatchesExllamav3Vectors*:*GraphCapture*'
                     [moe]='*HotExpertDuplicatesAndEdgeIds*:*StrictMode*:*WideDown*:*FusedFinishMatches*'
                     [gemm]='*GraphReplay*:*RejectsBadCalls*:*WeightKernel*:*HugeSvh*')
  for tool in ${SAN_TOOLS:-memcheck racecheck synccheck}; do
    for bin in ${SAN_BINS:-gemv moe gemm}; do
      timeout ${SAN_TIMEOUT:-120} $CS --tool $tool --error-exitcode 9 "$B/bin/exl3_${bin}_test" \
        --gtest_filter="${FILTER[$bin]}" > /tmp/san.log 2>&1
      echo "compute-sanitizer $tool $bin: exit $? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED' /tmp/san.log | tr '\n' ' ')"
      cat /tmp/san.log >> "$OUT/sanitizer.log"
    done
  done
fi
if [[ $PARTS == *sass* ]]; then
  cuobjdump -arch sm_90 --dump-sass "$B"/lib/libkernels_Scuda_Slibexl3_Ucuda_Ukernels.so 2>&1 | gzip > "$OUT/sass_sm90.txt.gz" || true
  # Instructions per decoded weight in the main loops (the op floor of dsmesh-kernel-bench).
  zcat "$OUT/sass_sm90.txt.gz" > /tmp/sass_sm90.txt
  python3 "$(dirname "$0")/sass_loop_ops.py" /tmp/sass_sm90.txt Exl3GemvKernel ELi1ELb | tee "$OUT/sass_loop_ops.txt"
  python3 "$(dirname "$0")/sass_loop_ops.py" /tmp/sass_sm90.txt Exl3MoeKernel | tee -a "$OUT/sass_loop_ops.txt"
  ls -la "$OUT"
fi
if [[ $PARTS == *ncu* ]]; then
  # Warp-stall and pipe statistics of one large dense GEMV and one MoE launch (hardware counters).
  NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  timeout 240 $NCU --clock-control none --section WarpStateStats --section ComputeWorkloadAnalysis \
    --section SchedulerStats --section Occupancy --section LaunchStats --print-details all -k regex:Exl3GemvKernel -c 1 \
    "$B/bin/dsmesh-kernel-bench" --anchors "$B/kernels/cuda/testdata/anchors-h200.json" --only dense \
    --filter "K2 wq_b 1024x32768 m1" --replays 1 > "$OUT/ncu.txt" 2>&1
  echo "ncu exit $?"
  grep -E "Stall|Issue|Eligible|Active Warps|Occupancy|Pipe|Registers|Executed Ipc|Issued" "$OUT/ncu.txt" | head -60
fi
