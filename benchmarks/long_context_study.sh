#!/usr/bin/env bash
# The long-context study on the 32k target (--target qwen2.5-coder-0.5b; `bash scripts/setup.sh --qwen-coder`):
# SWE-Bench agent trajectories (--subset mini-swe-agent-long) replayed through their logged replies up to 32k tokens,
# and LongBench v2 items cut to each point (LONGBENCH_LIMIT items, default 8; 0: none), decoded only at context
# points (--context-points), all seven methods with the drafters shipped for this target and EAGLE-3 with a
# 2,048-position sliding window (the label eagle3:window=2048, same drafter), then `evalsuite report`.
# Run it on an otherwise idle machine (timings are measured); it resumes where it stopped (--resume).
# Longer than one session: stop it, then `SAVE_PARTIAL=1 bash benchmarks/long_context_study.sh` copies the unfinished
# runs into the tracked PARTIAL folder (benchmarks/results/long-context-study-partial for the default
# STAGE; none for another STAGE unless PARTIAL is given); commit it, and a fresh machine's run starts
# from it (benchmarks/publish_report.sh). The finished report holds the runs, so publishing it removes PARTIAL.
#
#   bash benchmarks/long_context_study.sh                       # into reports/qwen-coder-long-context/
#   OUT=/tmp/lc STAGE=/tmp/lc-stage POINTS=2k,4k LIMIT_IDS=swebench-django__django-13933 REPEATS=1 NEW_TOKENS=8 \
#     ALLOW_DIRTY=1 bash benchmarks/long_context_study.sh       # a smoke test of the same commands
#
# What it measures, per context point: τ, per-position acceptance, draft ms, draft state bytes and the paired
# speedup of each method against `ar` (the within-trajectory context effect in the report), and first the target's
# own costs against context: benchmarks/context_cost.py at 1k, 8k, 16k and 32k (decode, verify of 2/4/8 tokens,
# the memory floor measured in the same run) into the report's context_cost_cpu.txt (once; a resumed study keeps
# it). benchmarks/results/context_cost_qwen_cpu.txt holds the GEMM / SDPA block-attention A/B.
set -euo pipefail
cd "$(dirname "$0")/.."

OUT=${OUT:-reports/qwen-coder-long-context}
STAGE=${STAGE:-results/long-context-study}        # results/ is git-ignored
if [ "$STAGE" = results/long-context-study ]; then PARTIAL=${PARTIAL-benchmarks/results/long-context-study-partial}
else PARTIAL=${PARTIAL:-}; fi  # the committed unfinished runs (see above)
TARGET=${TARGET:-qwen2.5-coder-0.5b}
METHODS=${METHODS:-ar,ngram,suffix,dlite,eagle3,eagle3:window=2048,dflash,dspark}  # eagle3:window=2048: docs/methods.md §7
POINTS=${POINTS:-2k,4k,8k,12k,16k,24k,32k}
# The bundled mini-swe-agent trajectories whose logged contexts pass 20k tokens with this target's tokenizer:
# `--subset mini-swe-agent-long` (12 runs, 8 repositories, held out of training; tasks/swebench/trajectories/README.md;
# `python benchmarks/long_context_study.py --subset mini-swe-agent-long --list` prints every trajectory's reach)
SUBSET=${SUBSET:-mini-swe-agent-long}
COUNT=${COUNT:-12}
LIMIT_IDS=${LIMIT_IDS:-}
NEW_TOKENS=${NEW_TOKENS:-64}
REPEATS=${REPEATS:-3}
RESAMPLES=${RESAMPLES:-2000}
EVALSUITE=${EVALSUITE:-evalsuite}
PY=${PY:-.venv/bin/python}

. benchmarks/publish_report.sh
if [ "${SAVE_PARTIAL:-0}" = 1 ]; then save_partial "$STAGE" "$PARTIAL"; exit $?; fi
if [ -z "${ALLOW_DIRTY:-}" ] && [ -n "$(git status --porcelain --untracked-files=no)" ]; then
  echo "long_context_study.sh: the working tree has uncommitted changes (the runs would record a +dirty commit);" \
       "commit first, or ALLOW_DIRTY=1 for a preview" >&2
  exit 2
fi
if [ -z "$LIMIT_IDS" ]; then
  LIMIT_IDS=$("$PY" benchmarks/long_context_study.py --target "$TARGET" --subset "$SUBSET" --min-tokens 20000 \
    --count "$COUNT")
fi
case ",$METHODS," in  # before the engine's costs (~20 min at 32k): a missing extra would stop the runs after them
  *,suffix,*) "$PY" -c "import arctic_inference.suffix_decoding" 2>/dev/null || {
    echo "long_context_study.sh: METHODS has suffix, which needs arctic-inference==0.3.0 (bash scripts/setup.sh" \
         "--all builds it); or leave suffix out of METHODS" >&2; exit 2; } ;;
esac
seed_partial "$STAGE" "$PARTIAL"
if [ -z "${SKIP_COST:-}" ] && [ ! -s "$STAGE/context_cost_cpu.txt" ]; then  # the engine's costs, beside the study
  COST=(benchmarks/context_cost.py --target "$TARGET" --contexts 1024,8192,16384,32000 --layouts auto --repeats 5)
  { echo "# python ${COST[*]}  (commit $(git rev-parse --short HEAD), $(date -u +%F))"; "$PY" "${COST[@]}"; } \
    > "$STAGE/context_cost_cpu.txt.tmp" && mv "$STAGE/context_cost_cpu.txt.tmp" "$STAGE/context_cost_cpu.txt"
fi
$EVALSUITE run --target "$TARGET" --method "$METHODS" --task swebench --subset "$SUBSET" --sample-ids "$LIMIT_IDS" \
  --context-points "$POINTS" --max-new-tokens "$NEW_TOKENS" --repeats "$REPEATS" --seed 0 --resume \
  --out "$STAGE/runs/swebench-points"
# LongBench v2 (the bundled items, contexts of 128k+ characters): each item decoded at every point, its context cut
# to the longest prefix that fits the point with the question kept (docs/tasks.md), so within-item context effects
# come from nested prefixes of one document
if [ -n "${LONGBENCH_LIMIT:-8}" ] && [ "${LONGBENCH_LIMIT:-8}" != 0 ]; then
  $EVALSUITE run --target "$TARGET" --method "$METHODS" --task longbench-v2 --limit "${LONGBENCH_LIMIT:-8}" \
    --context-points "$POINTS" --max-new-tokens "$NEW_TOKENS" --repeats "$REPEATS" --seed 0 --resume \
    --out "$STAGE/runs/longbench-points"
  LONGBENCH_RUN="$STAGE/runs/longbench-points"
fi
rm -rf "$STAGE/tables" "$STAGE/figures" "$STAGE/index.html" "$STAGE/report.md"
$EVALSUITE report "$STAGE/runs/swebench-points" ${LONGBENCH_RUN:-} --out "$STAGE" --resamples "$RESAMPLES"
publish_report "$STAGE" "$OUT"  # its hand-written README is kept
if [ -n "$PARTIAL" ]; then rm -rf "$PARTIAL"; fi  # the report holds the runs now
echo "long-context report in $OUT (open $OUT/index.html)"
