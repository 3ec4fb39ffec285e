#!/usr/bin/env bash
# Rebuild the committed example report (reports/smollm2-shipped/) from its committed runs, without decoding
# anything: the runs are copied into a staging folder, `evalsuite report` is run there exactly as
# benchmarks/example_report.sh runs it (the same --resamples and --hardware), and the staged report replaces the
# committed one (its hand-written README kept). Run it from a clean commit, so command.txt names that commit.
set -euo pipefail
cd "$(dirname "$0")/.."

OUT=${OUT:-reports/smollm2-shipped}
STAGE=${STAGE:-results/example-report-rebuild}   # results/ is git-ignored
RESAMPLES=${RESAMPLES:-2000}
HARDWARE=${HARDWARE:-benchmarks/results/regime_cpu/profile}
EVALSUITE=${EVALSUITE:-evalsuite}

if [ -z "${ALLOW_DIRTY:-}" ] && [ -n "$(git status --porcelain --untracked-files=no)" ]; then
  echo "rebuild_example_report.sh: commit first (command.txt would name a +dirty commit), or set ALLOW_DIRTY=1" >&2
  exit 2
fi
rm -rf "$STAGE"
mkdir -p "$STAGE"
cp -r "$OUT/runs" "$STAGE/runs"
$EVALSUITE report "$STAGE/runs/swebench" "$STAGE/runs/bfcl-v3" "$STAGE/runs/gsm8k" "$STAGE/runs/mt-bench" \
  "$STAGE/runs/mt-bench-T1" --out "$STAGE" --resamples "$RESAMPLES" --hardware "$HARDWARE"
. benchmarks/publish_report.sh
publish_report "$STAGE" "$OUT"
echo "example report rebuilt in $OUT from its committed runs"
