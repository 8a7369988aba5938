#!/usr/bin/env bash
# Gathers binaries and the non-system shared libraries they load into one folder, so that they run on the GPU
# machine, which has the driver and CUDA's runtime but not this machine's -dev packages (gRPC, protobuf, Gloo, ...).
#   usage: tests/gpu/bundle_binaries.sh OUT_DIR BINARY...
#   there: LD_LIBRARY_PATH=OUT_DIR/lib:<python's nvidia.nccl lib folder> OUT_DIR/bin/BINARY ...
# Left out: the C runtime and loader (every Linux has them; mixing them breaks a process) and the driver's and
# NCCL's libraries (the GPU machine's own must be used).
set -euo pipefail
if (($# < 2)); then
  echo "usage: $0 OUT_DIR BINARY..." >&2
  exit 2
fi
out=$1
shift
mkdir -p "$out/bin" "$out/lib"
system_lib='^(linux-vdso|ld-linux|libc\.so|libm\.so|libdl\.so|librt\.so|libpthread\.so|libstdc\+\+|libgcc_s|libcuda\.so|libnccl\.so|libnvidia)'
for binary in "$@"; do
  [[ -x $binary ]] || { echo "$0: $binary: not an executable (build it first)" >&2; exit 1; }
  cp -L "$binary" "$out/bin/"
  # ldd lines of the form 'libfoo.so.1 => /path/libfoo.so.1 (0x...)'; 'not found' has no path and fails below.
  while read -r lib path; do
    [[ $lib =~ $system_lib ]] && continue
    if [[ ! -f $path ]]; then
      echo "$0: $binary needs $lib, which is not installed here" >&2
      exit 1
    fi
    cp -L --update "$path" "$out/lib/"
  done < <(ldd "$binary" | awk '/=>/ {print $1, $3}')
done
echo "bundle: $(du -sh "$out" | cut -f1) in $out (the device tool carries at most 64 MiB)" >&2
