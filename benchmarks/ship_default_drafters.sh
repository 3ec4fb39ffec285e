#!/usr/bin/env bash
# Copy trained drafters (from benchmarks/train_default_drafters.sh) into baselines/drafters/<method>/, the
# directories `evalsuite run` loads when no --drafter is given: the released-format files, the model card and
# the training report (train_state.pt, the resumable optimizer state, stays behind).
# Usage: bash benchmarks/ship_default_drafters.sh SRC_ROOT [METHOD ...]   (default: all four)
set -euo pipefail
SRC=${1:-runs/drafters}
shift || true
METHODS=("$@")
[ ${#METHODS[@]} -gt 0 ] || METHODS=(dlite eagle3 dflash dspark)
for method in "${METHODS[@]}"; do
  dest=baselines/drafters/$method
  mkdir -p "$dest"
  cp "$SRC/$method"/{config.json,model.safetensors,MODEL_CARD.md,training_report.json} "$dest/"
done
du -cb baselines/drafters/*/model.safetensors | tail -1
