#!/usr/bin/env bash
# Builds the model-on-GPU binaries and tests and gathers them, with the shared libraries they need, into
# .bundle/gpu (ignored by git) for the GPU machine; tests/gpu/run_gpu.sh runs them there.
#   usage (repository root, on the build machine): [BUNDLE_TRAINED_MODEL=1] tests/gpu/make_bundle.sh
#   BUNDLE_TRAINED_MODEL=1: the trained default model's shards (models/dsv4-small/model-*.safetensors, 34 MB,
#   21 MB xz-compressed) travel in the bundle too, for run_gpu.sh's specserve part when the carried tree
#   leaves them out (docs/gpu-forward.md, "Reproduce").
set -euo pipefail
cd "$(dirname "$0")/../.."
bins=(cli/dsmesh worker/dsmesh-worker coordinator/dsmesh-coordinator gateway/dsmesh-gateway
      model/gpu_forward_test model/gpu_vision_test model/gpu_pdl_test cli/bench/gpu_profile_test cli/bench/gpu_timeline_test kernels/cuda/cuda_backend_test
      kernels/cuda/exl3_gemv_test kernels/cuda/graph_chain_test kernels/cuda/cupti_timeline_test
      kernels/cuda/exl3_moe_test kernels/cuda/dsmesh-kernel-bench worker/cuda_ipc_communicator_test)
echo "building ${bins[*]}" >&2
targets=()
for b in "${bins[@]}"; do targets+=("//${b%/*}:${b##*/}"); done
bazel build --noshow_progress "${targets[@]}" >&2
rm -rf .bundle/gpu
tests/gpu/bundle_binaries.sh .bundle/gpu "${bins[@]/#/bazel-bin/}"
# CUPTI (4 MB, ~1 MB compressed) travels: `dsmesh bench --timeline` loads it with dlopen (so ldd does not list
# it), from the library path first, where run_gpu.sh puts this lib/ folder.
cp -L /usr/local/cuda/lib64/libcupti.so.13 .bundle/gpu/lib/
# cuBLAS (~700 MB) does not travel: the GPU machine has it (run_gpu.sh finds it).
rm -f .bundle/gpu/lib/libcublas*
if [[ ${BUNDLE_TRAINED_MODEL:-0} == 1 ]]; then
  mkdir -p .bundle/gpu/models/dsv4-small
  cp models/dsv4-small/model-*.safetensors .bundle/gpu/models/dsv4-small/
fi
# The binaries and kernel libraries carry fat binaries for two architectures; they travel xz-compressed
# so that the carried tree stays under the device's 64 MiB, and run_gpu.sh unpacks them.
find .bundle/gpu -type f -size +64k -print0 | xargs -0 -r -n1 -P2 xz -T1 -6
du -sh .bundle/gpu
