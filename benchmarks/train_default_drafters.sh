#!/usr/bin/env bash
# Train the four shipped drafters for the embedded default target (SmolLM2-135M-Instruct) and the DLite
# single-stage ablation, on one shared work directory (prompts, target-regenerated replies, feature cache).
# Long CPU jobs: run under `nice`; one torch thread each (two spinning OpenMP threads per process are ~40x
# slower on an oversubscribed 2-core machine). Usage: bash benchmarks/train_default_drafters.sh WORK_DIR OUT_ROOT
set -euo pipefail
WORK=${1:-$HOME/.cache/evalsuite/train/default}
OUT=${2:-runs/drafters}
COMMON=(--target default --data sharegpt --work-dir "$WORK" --num-prompts 1200 --max-new-tokens 192
        --heldout-extra ../shared/data --threads 1)
mkdir -p "$OUT"
nice -n 10 evalsuite train --method dlite --out "$OUT/dlite" --prepare-only "${COMMON[@]}"  # data + features once
B=(--set batch_seqs=4 --set anchors_per_seq=16)
nice -n 10 evalsuite train --method dlite  --out "$OUT/dlite"  --steps 600 "${B[@]}" "${COMMON[@]}" &
nice -n 10 evalsuite train --method dlite  --out "$OUT/dlite-single-stage" --steps 600 "${B[@]}" --set single_stage=true \
  "${COMMON[@]}" &
nice -n 10 evalsuite train --method dflash --out "$OUT/dflash" --steps 500 "${B[@]}" "${COMMON[@]}" &
nice -n 10 evalsuite train --method dspark --out "$OUT/dspark" --steps 500 "${B[@]}" "${COMMON[@]}" &
nice -n 10 evalsuite train --method eagle3 --out "$OUT/eagle3" --steps 250 --set batch_seqs=1 "${COMMON[@]}" &
wait
