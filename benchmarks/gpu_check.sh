#!/usr/bin/env bash
# The engine on a GPU, in one short run (about 5 minutes on one H200): a Qwen3-8B-shaped target with random bf16
# weights. First whether the CUDA-graph path (evalsuite.target.captured, `--cuda-graphs`) gives the fused decoder's greedy
# tokens (captured_check.py: exits non-zero if not); then `ar` ms/token against the memory floor (weight + KV
# bytes ÷ the copy bandwidth measured in the same run) and verify-2/4/8 ÷ decode at 1k, 8k and 32k context for
# the fused decoder with and without CUDA graphs and the Hugging Face decoder compiled; then each drafter's draft ms
# (untrained drafters of the default size: cost, not quality).
# Usage (on the GPU machine, from the repository root): bash benchmarks/gpu_check.sh [OUT_DIR]
# With the device tool, carry the two wheels gpu_profile.sh describes:
#     run(command="bash benchmarks/gpu_check.sh", carry=[".whl"], timeout_s=600)
set -euo pipefail
cd "$(dirname "$0")/.."
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/evalsuite-site \
    .whl/*.whl
  export PYTHONPATH="/tmp/evalsuite-site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
out=${1:-benchmarks/results}
mkdir -p "$out"
"$PY" benchmarks/captured_check.py --target qwen3-8b-random --device cuda --context 2048 --tokens 64 \
  | tee "$out/captured_check_gpu.txt"
"$PY" benchmarks/context_cost.py --target qwen3-8b-random --device cuda --contexts 1024,8192,32768 --repeats 10 \
  --layouts fused,fused+graphs --compile | tee "$out/context_cost_gpu.txt"
"$PY" benchmarks/draft_cost.py --target qwen3-8b-random --device cuda | tee "$out/draft_cost_gpu.txt"
if [ -n "${OUT:-}" ] && [ -d "${OUT:-}" ]; then
  cp "$out/captured_check_gpu.txt" "$out/context_cost_gpu.txt" "$out/draft_cost_gpu.txt" "$OUT/"
fi
