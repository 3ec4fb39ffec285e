#!/usr/bin/env bash
# Held-out evaluation of the shipped default drafters (T=0, K=7), the DLite draft-length sweep and the DLite
# two-stage vs single-stage ablation, as run for baselines/drafters/README.md (runs in benchmarks/results/default-drafters).
# GSM8K and MT-Bench samples are never trained on (docs/training.md). One run at a time with torch's default
# threads (both cores here), on an otherwise idle machine, as a user would run it: with the default CPU weight
# layout the verify blocks run on oneDNN, which uses both cores (a two-stream, one-thread-each protocol made
# verify forwards ~45 % slower and is not used). Every speedup is paired turn by turn with the `ar` of its own run.
# Usage: bash benchmarks/eval_default_drafters.sh OUT_ROOT [SINGLE_STAGE_DLITE_DIR]
set -euo pipefail
OUT=${1:-runs/eval-default}
ABLATION=${2:-}
RUN=(evalsuite run --max-new-tokens 128 --seed 0)
ALL=ar,dlite,eagle3,dflash,dspark
# all four shipped drafters side by side
"${RUN[@]}" --method $ALL --task gsm8k --limit 10 --k 7 --out "$OUT/gsm8k-k7"
"${RUN[@]}" --method $ALL --task mt-bench --limit 4 --k 7 --out "$OUT/mtbench-k7"
if [ -n "$ABLATION" ]; then
  "${RUN[@]}" --method ar,dlite --drafter "dlite=$ABLATION" --task mt-bench --limit 4 --k 7 \
    --out "$OUT/mtbench-dlite-single-stage"
fi
# the DLite draft-length sweep, the other three at k=3, and the GSM8K ablation run
for k in 2 3 4; do
  "${RUN[@]}" --method ar,dlite --task gsm8k --limit 10 --k "$k" --out "$OUT/gsm8k-dlite-k$k"
done
"${RUN[@]}" --method ar,eagle3,dflash,dspark --task gsm8k --limit 10 --k 3 --out "$OUT/gsm8k-k3"
if [ -n "$ABLATION" ]; then
  "${RUN[@]}" --method ar,dlite --drafter "dlite=$ABLATION" --task gsm8k --limit 10 --k 7 \
    --out "$OUT/gsm8k-dlite-single-stage"
fi
python -m evalsuite.train.card baselines/drafters/dlite "$OUT/gsm8k-k7" "$OUT/mtbench-k7" "$OUT"/gsm8k-dlite-k[234]
for m in eagle3 dflash dspark; do
  python -m evalsuite.train.card "baselines/drafters/$m" "$OUT/gsm8k-k7" "$OUT/mtbench-k7" "$OUT/gsm8k-k3"
done
