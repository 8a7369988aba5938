#!/usr/bin/env bash
# Builds the GPU test and benchmark binaries and gathers them, their shared libraries, exllamav3's test
# vectors and the anchor table into .bundle/cuda (ignored by git) for the GPU machine.
set -euo pipefail
cd "$(dirname "$0")/../.."
: "${DSMESH_SHARED:?set DSMESH_SHARED (the shared folder with testdata/ and reference/)}"
bazel build //kernels/cuda:exl3_gemv_test //kernels/cuda:exl3_moe_test //kernels/cuda:exl3_gemm_test \
  //kernels/cuda:dsmesh-kernel-bench
rm -rf .bundle/cuda
"$DSMESH_SHARED/tools/gpu-bundle.sh" .bundle/cuda bazel-bin/kernels/cuda/exl3_gemv_test \
  bazel-bin/kernels/cuda/exl3_moe_test bazel-bin/kernels/cuda/exl3_gemm_test bazel-bin/kernels/cuda/dsmesh-kernel-bench
# cuBLAS (~700 MB with cublasLt) does not travel: the GPU machine has it (run_gpu.sh finds it).
rm -f .bundle/cuda/lib/libcublas*
# The kernel library (~43 MB, two architectures) travels xz-compressed (~6 MB) so that the carried tree
# stays under the device's 64 MiB; run_gpu.sh unpacks it.
kernels=.bundle/cuda/lib/libkernels_Scuda_Slibexl3_Ucuda_Ukernels.so
xz -T0 -c "$kernels" > "$kernels.xz" && rm "$kernels"
mkdir -p .bundle/cuda/shared/testdata/exl3 .bundle/cuda/shared/reference
cp "$DSMESH_SHARED"/testdata/exl3/*.safetensors .bundle/cuda/shared/testdata/exl3/
cp "$DSMESH_SHARED"/reference/anchors-h200.json .bundle/cuda/shared/reference/
du -sh .bundle/cuda
