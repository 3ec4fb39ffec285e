#!/usr/bin/env bash
# Copy trained drafters into the directories `evalsuite run` loads when no --drafter is given: the released-format
# files, the model card and the training report (train_state.pt, the resumable optimizer state, stays behind).
#   default target (benchmarks/train_default_drafters.sh): baselines/drafters/<method>/
#   TARGET=<key> (benchmarks/train_qwen_drafters.sh: TARGET=qwen2.5-coder-0.5b): baselines/drafters/<key>/<method>/
# A drafter is shipped only once its card exists (its training finished); the size of the target's shipped
# drafters together is printed (budgets: 40 MB for the default target's four, 60 MB for the 32k target's).
# Usage: [TARGET=key] bash benchmarks/ship_default_drafters.sh SRC_ROOT [METHOD ...]   (default: all four)
set -euo pipefail
cd "$(dirname "$0")/.."
SRC=${1:-runs/drafters}
shift || true
METHODS=("$@")
[ ${#METHODS[@]} -gt 0 ] || METHODS=(dlite eagle3 dflash dspark)
ROOT=baselines/drafters${TARGET:+/$TARGET}
for method in "${METHODS[@]}"; do
  if [ ! -f "$SRC/$method/MODEL_CARD.md" ]; then
    echo "$method: no $SRC/$method/MODEL_CARD.md (training not finished): not shipped" >&2
    continue
  fi
  dest=$ROOT/$method
  mkdir -p "$dest"
  cp "$SRC/$method"/{config.json,model.safetensors,MODEL_CARD.md,training_report.json} "$dest/"
  echo "shipped $method to $dest"
done
files=()
for method in dlite eagle3 dflash dspark; do
  [ -f "$ROOT/$method/model.safetensors" ] && files+=("$ROOT/$method/model.safetensors")
done
if [ ${#files[@]} -gt 0 ]; then
  echo "shipped in $ROOT: $(du -cb "${files[@]}" | tail -1 | cut -f1) bytes in ${#files[@]} drafter(s)"
fi
