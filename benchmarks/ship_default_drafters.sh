#!/usr/bin/env bash
# Copy trained drafters (from benchmarks/train_default_drafters.sh) into baselines/drafters/<method>/, the
# directories `evalsuite run` loads when no --drafter is given: the released-format files, the model card and
# the training report (train_state.pt, the resumable optimizer state, stays behind).
set -euo pipefail
SRC=${1:-runs/drafters}
for method in dlite eagle3 dflash dspark; do  # all four must be trained first
  dest=baselines/drafters/$method
  mkdir -p "$dest"
  cp "$SRC/$method"/{config.json,model.safetensors,MODEL_CARD.md,training_report.json} "$dest/"
done
du -cb baselines/drafters/*/model.safetensors | tail -1
