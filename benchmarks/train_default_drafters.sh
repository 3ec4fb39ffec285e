#!/usr/bin/env bash
# Train the four shipped drafters for the embedded default target (SmolLM2-135M-Instruct) and the DLite
# single-stage ablation, on one shared work directory (prompts, target-regenerated replies, feature cache).
# The step counts and batch sizes are the `evalsuite train` defaults; they are spelled out here.
# As run for baselines/drafters/ (Nov 30 2026, 2-core CPU):
#   data: 1,476 prompts → 1,344 regenerated replies (223k reply tokens), 16 min generation + 7 min features;
#   two jobs at a time, one torch thread each: DSpark 4,000 steps 48.5 min beside DLite, then alone;
#   DLite two-stage 6,000 steps 50.2 min beside DSpark; EAGLE-3 2,500 steps 39.2 min (three jobs on two cores);
#   alone, two threads: DFlash 4,400 steps 48.9 min; the DLite single-stage ablation, 6,000 steps.
# Usage: bash benchmarks/train_default_drafters.sh WORK_DIR OUT_ROOT
set -euo pipefail
WORK=${1:-$HOME/.cache/evalsuite/train/default}
OUT=${2:-runs/drafters}
DATA=(--target default --data sharegpt --work-dir "$WORK" --num-prompts 1200 --math-prompts 400
      --max-new-tokens 192 --heldout-extra ../shared/data)
mkdir -p "$OUT"
evalsuite train --method dlite --out "$OUT/dlite" --prepare-only --threads 2 "${DATA[@]}"  # data + features once
# One torch thread per job: two jobs on two cores beat one job with two OpenMP threads.
B=(--set batch_seqs=4 --set anchors_per_seq=16 --threads 1)
evalsuite train --method dspark --out "$OUT/dspark" --steps 4000 --set train_vocab_top=8 "${B[@]}" "${DATA[@]}" &
evalsuite train --method dlite --out "$OUT/dlite" --steps 6000 "${B[@]}" "${DATA[@]}" &
wait
evalsuite train --method eagle3 --out "$OUT/eagle3" --steps 2500 --set batch_seqs=1 --threads 1 "${DATA[@]}"
# DFlash's step parallelises well (1.9x on two threads), so it runs alone on both cores
evalsuite train --method dflash --out "$OUT/dflash" --steps 4400 --set batch_seqs=4 --set anchors_per_seq=16 \
  --set train_vocab_top=8 --threads 2 "${DATA[@]}"
# the ablation: single-stage (direct target alignment) on the shipped two-stage DLite's data and 6,000 steps
evalsuite train --method dlite --out "$OUT/dlite-single-stage" --steps 6000 --set single_stage=true \
  --set batch_seqs=4 --set anchors_per_seq=16 --threads 2 "${DATA[@]}"
