#!/usr/bin/env bash
# Builds the GPU test and benchmark binaries and gathers them, their shared libraries, exllamav3's test
# vectors and the anchor table (from this repository, at the same paths) into .bundle/cuda (ignored by
# git) for the GPU machine. The binaries and their libraries are gathered by
# tests/gpu/bundle_binaries.sh.
set -euo pipefail
cd "$(dirname "$0")/../.."
bazel build //kernels/cuda:exl3_gemv_test //kernels/cuda:exl3_moe_test //kernels/cuda:exl3_gemm_test \
  //kernels/cuda:dsmesh-kernel-bench
rm -rf .bundle/cuda
tests/gpu/bundle_binaries.sh .bundle/cuda bazel-bin/kernels/cuda/exl3_gemv_test \
  bazel-bin/kernels/cuda/exl3_moe_test bazel-bin/kernels/cuda/exl3_gemm_test bazel-bin/kernels/cuda/dsmesh-kernel-bench
# cuBLAS (~700 MB with cublasLt) does not travel: the GPU machine has it (run_gpu.sh finds it).
rm -f .bundle/cuda/lib/libcublas*
# The kernel library (~43 MB, two architectures) travels xz-compressed (~6 MB) so that the carried tree
# stays under the device's 64 MiB; run_gpu.sh unpacks it.
kernels=.bundle/cuda/lib/libkernels_Scuda_Slibexl3_Ucuda_Ukernels.so
xz -T0 -c "$kernels" > "$kernels.xz" && rm "$kernels"
mkdir -p .bundle/cuda/kernels/exl3/testdata .bundle/cuda/kernels/cuda/testdata
cp kernels/exl3/testdata/*.safetensors .bundle/cuda/kernels/exl3/testdata/
cp kernels/cuda/testdata/anchors-h200.json .bundle/cuda/kernels/cuda/testdata/
du -sh .bundle/cuda
