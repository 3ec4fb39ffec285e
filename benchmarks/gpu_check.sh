#!/usr/bin/env bash
# The long-context engine on a GPU, in one short run: a Qwen3-8B-shaped target with random bf16 weights.
# Prints `ar` ms/token against the memory floor (weight + KV bytes ÷ the copy bandwidth measured in the same run),
# verify-2/4/8 ÷ decode at 1k, 8k and 32k context for the dynamic and the static cache and the static cache compiled,
# then each drafter's draft ms (untrained drafters of the default size: cost, not quality).
# Usage (on the GPU machine, evalsuite installed): bash benchmarks/gpu_check.sh [OUT_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-benchmarks/results}
mkdir -p "$out"
python benchmarks/context_cost.py --target qwen3-8b-random --device cuda --contexts 1024,8192,32768 --repeats 10 \
  --compile | tee "$out/context_cost_gpu.txt"
python benchmarks/draft_cost.py --target qwen3-8b-random --device cuda | tee "$out/draft_cost_gpu.txt"
