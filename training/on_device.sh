#!/usr/bin/env bash
# The GPU machine's part of making the default model (docs/trained-model.md), from the repository root there.
#   training/on_device.sh train CORPUS_TAR_XZ MINUTES   trains into .data/run (kept on the machine) and copies
#                                                       the export and logs to $OUT/run (what comes back)
#   training/on_device.sh continue CORPUS INIT MINUTES  stage 2: continues from INIT (a tar.xz of an export,
#                                                       e.g. stage 1's $OUT/run) with the copy-weighted loss;
#                                                       into .data/run and $OUT/run
#   training/on_device.sh pack                          from .data/run: the bf16 checkpoint, the shipped pack,
#                                                       the bit-width packs and their held-out perplexities on
#                                                       the GPU, the C++-vs-torch logits check; pack to $OUT/pack
# `pack` needs a bundle from tests/gpu/make_bundle.sh in .bundle/gpu (carried) for `dsmesh`.
set -euo pipefail
OUT=${OUT:-/tmp/out}
stage=${1:?usage: on_device.sh train CORPUS MINUTES | continue CORPUS INIT MINUTES | pack}
run=.data/run
corpus=.data/corpus
export PYTHONUNBUFFERED=1

case "$stage" in
  train)
    rm -rf "$run" "$corpus" && mkdir -p "$run" "$corpus" "$OUT/run"
    tar xJf "${2:?corpus tar}" -C "$corpus"
    python3 training/train.py --corpus "$corpus" --out "$run" --minutes "${3:?minutes}" --seed 20 --chat-frac 0.3 \
      2>&1 | tee "$run/train.log"
    cp "$run"/* "$OUT/run/"
    ;;
  continue)
    rm -rf "$run" "$corpus" .data/init && mkdir -p "$run" "$corpus" .data/init "$OUT/run"
    tar xJf "${2:?corpus tar}" -C "$corpus"
    tar xJf "${3:?init tar}" -C .data/init
    python3 training/train.py --corpus "$corpus" --out "$run" --minutes "${4:?minutes}" --seed 21 --chat-frac 0.6 \
      --init .data/init --copy-weight 5 --warmup 30 --lr 1.5e-3 2>&1 | tee "$run/train.log"
    cp "$run"/* "$OUT/run/"
    ;;
  pack)
    B=.bundle/gpu
    for z in $(find "$B" -name '*.xz'); do xz -dc "$z" > "${z%.xz}" && chmod +x "${z%.xz}" && rm "$z"; done
    CUBLAS_DIR=$(dirname "$(find "$(python3 -c 'import nvidia; print(list(nvidia.__path__)[0])')" /usr/local/cuda \
      -name 'libcublas.so.13' 2>/dev/null | head -1)")
    export LD_LIBRARY_PATH=$B/lib:$CUBLAS_DIR
    DS=$B/bin/dsmesh
    mkdir -p "$OUT/pack" .data/packs
    log=$OUT/pack.log
    python3 training/assemble.py --run "$run" --out .data/trained-bf16 2>&1 | tee "$log"
    # The shipped pack first (so it comes back even if a later step runs out of time), then one pack per
    # bit width of the blocks (head and embedding kept bf16) for the quality table, encoded side by side.
    $DS quantize --model .data/trained-bf16 --out .data/packs/ship --bits experts=4,dense=6,head=4,embed=fp8 \
      --shard-size-mb 15 --quiet 2>&1 | tee -a "$log"
    cp .data/packs/ship/*.safetensors .data/packs/ship/config.json "$OUT/pack/"
    for k in 2 3 4 6; do
      DSMESH_CPU_THREADS=4 $DS quantize --model .data/trained-bf16 --out .data/packs/k$k --bits experts=$k,dense=$k \
        --quiet > .data/packs/k$k.log 2>&1 &
    done
    wait
    cat .data/packs/k*.log >> "$log"
    for m in .data/trained-bf16 .data/packs/ship .data/packs/k2 .data/packs/k3 .data/packs/k4 .data/packs/k6; do
      echo "== ppl $m" | tee -a "$log"
      timeout 120 $DS ppl --model "$m" --file "$corpus/heldout.txt" --ctx 512 --device cuda 2>&1 | tail -3 | tee -a "$log"
    done
    echo "== C++ (CPU) vs torch logits on the bf16 checkpoint" | tee -a "$log"
    python3 training/compare_cpp.py --model .data/trained-bf16 --ids "$corpus/heldout_ids.json" --n 256 \
      --dsmesh "$DS" 2>&1 | tail -5 | tee -a "$log"
    ;;
  *) echo "on_device.sh: unknown stage '$stage' (train, continue or pack)" >&2; exit 2 ;;
esac
