#!/usr/bin/env bash
# Held-out evaluation of the shipped default drafters (T=0, K=7), the DLite draft-length sweep and the DLite
# two-stage vs single-stage ablation, as run for baselines/drafters/README.md (runs in baselines/drafters/eval-runs).
# GSM8K and MT-Bench samples are never trained on (docs/training.md).
# Usage: bash benchmarks/eval_default_drafters.sh OUT_ROOT [SINGLE_STAGE_DLITE_DIR]
set -euo pipefail
OUT=${1:-runs/eval-default}
ABLATION=${2:-}
export OMP_NUM_THREADS=1  # one thread: far faster than two spinning OpenMP workers on a busy 2-core CPU
RUN=(nice -n 10 evalsuite run --max-new-tokens 128 --seed 0)
"${RUN[@]}" --method ar,dlite,eagle3,dspark --task gsm8k --limit 6 --k 7 --out "$OUT/gsm8k-k7"
"${RUN[@]}" --method ar,dlite,eagle3,dspark --task mt-bench --limit 3 --k 7 --out "$OUT/mtbench-k7"
"${RUN[@]}" --method ar,dflash --task gsm8k --limit 6 --k 7 --out "$OUT/gsm8k-k7-dflash"
"${RUN[@]}" --method ar,dflash --task mt-bench --limit 3 --k 7 --out "$OUT/mtbench-k7-dflash"
for k in 2 4; do
  "${RUN[@]}" --method ar,dlite --task gsm8k --limit 6 --k "$k" --out "$OUT/gsm8k-dlite-k$k"
done
if [ -n "$ABLATION" ]; then
  "${RUN[@]}" --method ar,dlite --drafter "dlite=$ABLATION" --task gsm8k --limit 6 --k 7 \
    --out "$OUT/gsm8k-dlite-single-stage"
  "${RUN[@]}" --method ar,dlite --drafter "dlite=$ABLATION" --task mt-bench --limit 3 --k 7 \
    --out "$OUT/mtbench-dlite-single-stage"
fi
for m in dlite eagle3 dspark; do
  python -m evalsuite.train.card "baselines/drafters/$m" "$OUT/gsm8k-k7" "$OUT/mtbench-k7"
done
python -m evalsuite.train.card baselines/drafters/dflash "$OUT/gsm8k-k7-dflash" "$OUT/mtbench-k7-dflash"
