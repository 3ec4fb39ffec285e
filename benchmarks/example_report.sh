#!/usr/bin/env bash
# Regenerate the committed example report (reports/smollm2-shipped/) from a clean commit: the shipped default
# drafters and the two model-free/AR references on SWE-Bench agent trajectories, GSM8K and MT-Bench, then
# `evalsuite report`. Run it on an otherwise idle machine (timings are measured): one run at a time.
#
#   bash benchmarks/example_report.sh                    # full size, into reports/smollm2-shipped/
#   OUT=/tmp/preview STAGE=/tmp/preview-stage SWE_IDS=swebench-django__django-10999 SWE_TURNS=2 BFCL_LIMIT=1 \
#     GSM8K_LIMIT=1 MTBENCH_LIMIT=1 HOT_LIMIT=1 NEW_TOKENS=8 REPEATS=1 ALLOW_DIRTY=1 \
#     bash benchmarks/example_report.sh                  # a quick smoke test of the same commands
#
# Full size: 10 SWE-Bench trajectories x 8 turns, every turn inside the default target's 8k window with room for the
# reply (SWE_IDS: picked from the bundled 30 so that no turn is skipped, across 9 repositories), 5 BFCL-v3
# multi-turn samples x 4 turns, 10 GSM8K (128 new tokens: the drafters' held-out GSM8K evaluation), 5 MT-Bench
# questions, and a T=1 block (MT-Bench at temperature 1, a column of its own); seven methods (ar, ngram, suffix
# and the four shipped drafters), 64 new tokens per turn elsewhere, every turn decoded --repeats 3 times (the
# median kept). The runs are made in a staging folder outside the tracked tree (so the runs themselves do not
# make the tree +dirty), the report is built there with the runs under its runs/, and the whole folder then
# replaces $OUT. Rerunning resumes unfinished runs in the staging folder (--resume).
# Longer than one session: stop it, then `SAVE_PARTIAL=1 bash benchmarks/example_report.sh` copies the unfinished
# runs into the tracked PARTIAL folder (benchmarks/results/example-report-partial for the default STAGE); commit it,
# and a fresh machine's run starts from it (benchmarks/publish_report.sh); publishing the report removes it.
set -euo pipefail
cd "$(dirname "$0")/.."

OUT=${OUT:-reports/smollm2-shipped}
STAGE=${STAGE:-results/example-report}          # results/ is git-ignored
METHODS=${METHODS:-ar,ngram,suffix,dlite,eagle3,dflash,dspark}
SWE_IDS=${SWE_IDS:-swebench-django__django-10999,swebench-django__django-13512,swebench-matplotlib__matplotlib-13989,swebench-mwaskom__seaborn-3187,swebench-psf__requests-1766,swebench-pydata__xarray-4629,swebench-pytest-dev__pytest-10051,swebench-scikit-learn__scikit-learn-10297,swebench-sphinx-doc__sphinx-9367,swebench-sympy__sympy-13372}
SWE_TURNS=${SWE_TURNS:-8}
GSM8K_LIMIT=${GSM8K_LIMIT:-10}
GSM8K_TOKENS=${GSM8K_TOKENS:-128}   # the held-out GSM8K evaluation of the drafters (benchmarks/results/default-drafters)
BFCL_LIMIT=${BFCL_LIMIT:-5}
BFCL_TURNS=${BFCL_TURNS:-4}
MTBENCH_LIMIT=${MTBENCH_LIMIT:-5}
NEW_TOKENS=${NEW_TOKENS:-64}
REPEATS=${REPEATS:-3}
HOT_LIMIT=${HOT_LIMIT:-5}            # the T=1 block: MT-Bench at temperature 1
RESAMPLES=${RESAMPLES:-2000}
EVALSUITE=${EVALSUITE:-evalsuite}
HARDWARE=${HARDWARE:-benchmarks/results/regime_cpu/profile}  # the committed CPU cost surface (other-hardware table)
if [ "$STAGE" = results/example-report ]; then PARTIAL=${PARTIAL-benchmarks/results/example-report-partial}
else PARTIAL=${PARTIAL:-}; fi  # the committed unfinished runs (see above)
. benchmarks/publish_report.sh
if [ "${SAVE_PARTIAL:-0}" = 1 ]; then save_partial "$STAGE" "$PARTIAL"; exit $?; fi

if [ -z "${ALLOW_DIRTY:-}" ] && [ -n "$(git status --porcelain --untracked-files=no)" ]; then
  echo "example_report.sh: the working tree has uncommitted changes, so the runs would record a +dirty commit;" \
       "commit first (or set ALLOW_DIRTY=1 for a preview that is not to be committed)" >&2
  exit 2
fi

RUN=($EVALSUITE run --method "$METHODS" --max-new-tokens "$NEW_TOKENS" --seed 0 --repeats "$REPEATS" --resume)
seed_partial "$STAGE" "$PARTIAL"
"${RUN[@]}" --task swebench --sample-ids "$SWE_IDS" --max-turns "$SWE_TURNS" --out "$STAGE/runs/swebench"
"${RUN[@]}" --task bfcl-v3 --limit "$BFCL_LIMIT" --max-turns "$BFCL_TURNS" --out "$STAGE/runs/bfcl-v3"
"${RUN[@]}" --task gsm8k --limit "$GSM8K_LIMIT" --max-new-tokens "$GSM8K_TOKENS" --out "$STAGE/runs/gsm8k"
"${RUN[@]}" --task mt-bench --limit "$MTBENCH_LIMIT" --out "$STAGE/runs/mt-bench"
"${RUN[@]}" --task mt-bench --limit "$HOT_LIMIT" --temperature 1 --out "$STAGE/runs/mt-bench-T1"
rm -rf "$STAGE/tables" "$STAGE/figures" "$STAGE/index.html" "$STAGE/report.md"   # a previous report's files
$EVALSUITE report "$STAGE/runs/swebench" "$STAGE/runs/bfcl-v3" "$STAGE/runs/gsm8k" "$STAGE/runs/mt-bench" \
  "$STAGE/runs/mt-bench-T1" --out "$STAGE" --resamples "$RESAMPLES" --hardware "$HARDWARE"

publish_report "$STAGE" "$OUT"  # its hand-written README is kept
if [ -n "$PARTIAL" ]; then rm -rf "$PARTIAL"; fi  # the report holds the runs now
echo "example report in $OUT (open $OUT/index.html); the staged copy stays in $STAGE"
