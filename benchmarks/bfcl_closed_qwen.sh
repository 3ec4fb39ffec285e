#!/usr/bin/env bash
# The closed BFCL-v3 loop on the 32k target (--target qwen2.5-coder-0.5b; `bash scripts/setup.sh --qwen-coder`),
# in the target's native tool-calling format (issue #33), against the logged replay of the same entries:
#   - N base and N long_context multi-turn entries, chosen by seed (tasks/base.py seeded_subset: the same positions
#     in both files, so the same questions), every first context 5-8k tokens of this tokenizer;
#   - per subset: `--replay closed --tool-format native` (the target's own calls executed against bfcl-eval's
#     backends, scored by BFCL's state-based check) and `--replay logged` (BFCL's ground-truth calls as assistant
#     turns), each with METHODS, then one `evalsuite report` over the four runs (its closed-loop section: turns,
#     calls executed, errors, solved entries, τ and speedup per loop step, live against replayed).
# Run it on an otherwise idle machine (timings are measured); it resumes where it stopped (--resume).
# Longer than one session: stop it, then `SAVE_PARTIAL=1 bash benchmarks/bfcl_closed_qwen.sh` copies the unfinished
# runs into the tracked PARTIAL folder (benchmarks/results/bfcl-closed-qwen-partial for the default
# STAGE; none for another STAGE unless PARTIAL is given); commit it, and a fresh machine's run starts
# from it (benchmarks/publish_report.sh). The finished report holds the runs, so publishing it removes PARTIAL.
#
#   bash benchmarks/bfcl_closed_qwen.sh                                   # into reports/bfcl-closed-qwen/
#   N=1 NEW_TOKENS=16 REPEATS=1 MAX_TURNS=4 OUT=/tmp/bc STAGE=/tmp/bc-stage ALLOW_DIRTY=1 \
#     bash benchmarks/bfcl_closed_qwen.sh                                 # a smoke test of the same commands
set -euo pipefail
cd "$(dirname "$0")/.."

OUT=${OUT:-reports/bfcl-closed-qwen}
STAGE=${STAGE:-results/bfcl-closed-qwen}      # results/ is git-ignored
if [ "$STAGE" = results/bfcl-closed-qwen ]; then PARTIAL=${PARTIAL-benchmarks/results/bfcl-closed-qwen-partial}
else PARTIAL=${PARTIAL:-}; fi  # the committed unfinished runs (see above)
TARGET=${TARGET:-qwen2.5-coder-0.5b}
METHODS=${METHODS:-ar,ngram,suffix,dlite,eagle3,dflash,dspark}  # its four drafters: baselines/drafters/qwen2.5-coder-0.5b
N=${N:-10}                                    # entries per subset
SEED=${SEED:-0}
NEW_TOKENS=${NEW_TOKENS:-256}
REPEATS=${REPEATS:-1}                         # 1: the four runs are ~4.5 CPU-h on 2 cores (3 would be ~13 h);
                                              # the report's per-turn pairing and bootstrap carry the noise
THREADS=${THREADS:-$(nproc)}                  # one thread count for all four runs (a drift field: the report merges them)
MAX_TURNS=${MAX_TURNS:-}                      # a cap on the decodes per entry (closed) / turns (logged); none by default
TOOL_FORMAT=${TOOL_FORMAT:-native}
RESAMPLES=${RESAMPLES:-2000}
EVALSUITE=${EVALSUITE:-evalsuite}

. benchmarks/publish_report.sh
if [ "${SAVE_PARTIAL:-0}" = 1 ]; then save_partial "$STAGE" "$PARTIAL"; exit $?; fi
if [ -z "${ALLOW_DIRTY:-}" ] && [ -n "$(git status --porcelain --untracked-files=no)" ]; then
  echo "bfcl_closed_qwen.sh: the working tree has uncommitted changes (the runs would record a +dirty commit);" \
       "commit first, or ALLOW_DIRTY=1 for a preview" >&2
  exit 2
fi
common=(--target "$TARGET" --method "$METHODS" --task bfcl-v3 --limit "$N" --seed "$SEED"
        --max-new-tokens "$NEW_TOKENS" --repeats "$REPEATS" --threads "$THREADS" --resume)
if [ -n "$MAX_TURNS" ]; then common+=(--max-turns "$MAX_TURNS"); fi
seed_partial "$STAGE" "$PARTIAL"
for subset in base long_context; do
  $EVALSUITE run "${common[@]}" --subset "$subset" --replay closed --tool-format "$TOOL_FORMAT" \
    --out "$STAGE/runs/closed-$subset"
  $EVALSUITE run "${common[@]}" --subset "$subset" --replay logged --out "$STAGE/runs/logged-$subset"
done
rm -rf "$STAGE/tables" "$STAGE/figures" "$STAGE/index.html" "$STAGE/report.md"
$EVALSUITE report "$STAGE"/runs/closed-base "$STAGE"/runs/logged-base "$STAGE"/runs/closed-long_context \
  "$STAGE"/runs/logged-long_context --out "$STAGE" --resamples "$RESAMPLES"
publish_report "$STAGE" "$OUT"  # its hand-written README is kept
if [ -n "$PARTIAL" ]; then rm -rf "$PARTIAL"; fi  # the report holds the runs now
echo "closed-loop report in $OUT (open $OUT/index.html; the section 'Closed agent loop: live tool calls')"
