#!/usr/bin/env bash
# Cost surfaces on one GPU (issue 24): a Qwen3-8B-shaped target with random bf16 weights, batch 1–64 × context
# 1k–128k × verify blocks 1–8 (K=7), the four learned drafters (DLite, EAGLE-3, DFlash, DSpark: random-init,
# default sizes) at every batch and context (batched drafting), then the break-even map (evalsuite regime).
# Points that do not fit in the GPU's memory are estimated first, skipped and recorded. It stops starting new
# points after TIME_LIMIT seconds (400 by default) and writes its tables context by context, so it ends within
# 8 minutes on one H200 and a cut-off run keeps what it measured.
#
# Usage, from the repository root on the GPU machine:
#     bash benchmarks/gpu_profile.sh [RESULTS_DIR]          # default benchmarks/results/gpu_profile
# Results: RESULTS_DIR/profile/{target_cost,draft_cost}.parquet + run.json, RESULTS_DIR/regime/ (regime.csv,
# regime.md, heatmaps), RESULTS_DIR/profile.log. Where the device tool's $OUT exists, the eight files that matter
# are copied there too (the tool returns at most eight files).
#
# What the lead must carry (the device image has python3 3.12 with torch 2.11 + CUDA, pandas, pyarrow, matplotlib,
# typer, rich, safetensors 0.8, tokenizers 0.23, huggingface_hub 1.33, but transformers 5.17 and no platformdirs):
# two pure-Python wheels in .whl/ (ignored by git), fetched here with
#     python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#         --platform manylinux2014_x86_64 -d .whl transformers==5.24.0 platformdirs==4.3.8
# and the call carries them:  run(command="bash benchmarks/gpu_profile.sh", carry=[".whl"], timeout_s=600).
# torch stays the image's 2.11 (a CUDA torch 2.13 wheel is far over the 64 MiB a call may carry; nothing here
# needs 2.13). This script installs .whl/*.whl into /tmp when they are there.
#
# The same script on a CPU with a tiny shape (tests/test_gpu_profile.py runs this):
#     SHAPE=tiny DEVICE=cpu DTYPE=float32 BATCH=1,2 CONTEXTS=64,128 bash benchmarks/gpu_profile.sh /tmp/x
set -euo pipefail
cd "$(dirname "$0")/.."

if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/evalsuite-site \
    .whl/*.whl
  export PYTHONPATH="/tmp/evalsuite-site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1

PY=${PYTHON:-python3}
SHAPE=${SHAPE:-qwen3-8b}
DEVICE=${DEVICE:-cuda}
DTYPE=${DTYPE:-bfloat16}
BATCH=${BATCH:-1..64}
CONTEXTS=${CONTEXTS:-1k..128k}
METHODS=${METHODS:-dlite,eagle3,dflash,dspark}
TIME_LIMIT=${TIME_LIMIT:-400}
RESULTS=${1:-benchmarks/results/gpu_profile}
mkdir -p "$RESULTS"

if [ "$DEVICE" != "cpu" ]; then
  nvidia-smi --query-gpu=name,memory.total,memory.used,clocks.sm,clocks.mem --format=csv > "$RESULTS/gpu.txt" \
    2>&1 || true
fi
"$PY" -m evalsuite.cli profile --target-shape "$SHAPE" --device "$DEVICE" --dtype "$DTYPE" --method "$METHODS" \
  --batch "$BATCH" --contexts "$CONTEXTS" --k 7 --warmup 2 --repeats 5 --time-limit "$TIME_LIMIT" \
  --out "$RESULTS/profile" 2>&1 | tee "$RESULTS/profile.log"
"$PY" -m evalsuite.cli regime --cost "$RESULTS/profile" --out "$RESULTS/regime" 2>&1 | tee -a "$RESULTS/profile.log"

if [ -n "${OUT:-}" ] && [ -d "${OUT:-}" ]; then
  cp "$RESULTS/profile/target_cost.parquet" "$RESULTS/profile/draft_cost.parquet" "$RESULTS/profile/run.json" \
     "$RESULTS/regime/regime.csv" "$RESULTS/regime/regime.md" "$RESULTS/regime/regime_tau_break_even.png" \
     "$RESULTS/profile.log" "$OUT/"
  [ -f "$RESULTS/regime/concurrency_memory.csv" ] && cp "$RESULTS/regime/concurrency_memory.csv" "$OUT/"
fi
echo "results: $RESULTS"
