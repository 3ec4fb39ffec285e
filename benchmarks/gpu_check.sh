#!/usr/bin/env bash
# The engine on a GPU, in one short run (under 9 minutes on one H200): a Qwen3-8B-shaped target with random bf16
# weights. First whether the CUDA-graph path (evalsuite.target.captured, `--cuda-graphs`) gives the fused decoder's
# greedy tokens, in float32 (split-K attention, float32's default), in bfloat16 (flash+split, its default) and with
# the masked attention (captured_check.py: exits non-zero if a token differs by more than a near-tie); then `ar`
# ms/token against the memory floor (weight + KV bytes ÷ the copy bandwidth measured in the same run) and
# verify-2/4/8 ÷ decode at 1k, 8k and 32k context for the fused decoder with and without CUDA graphs, the graphs'
# attention masked, flash+split or split-K (--captured-attention), with a kernel profile of flash+split; then each
# drafter's draft ms (untrained drafters of the default size: cost, not quality) with a profile of its proposals;
# the Hugging Face decoder compiled on request.
# Each stage runs under its own time limit and a failed stage does not stop the next; the script exits non-zero
# when any stage failed, and stages_gpu.txt says which. STOP_AT (epoch seconds) caps them all.
# Order: the default attention's tokens (bf16, flash+split), the cost table, the float32 and masked checks, the kernel
# profile, the draft costs: a call cut short keeps what runs use first.
# Usage (on the GPU machine, from the repository root): bash benchmarks/gpu_check.sh [OUT_DIR]
# (DRAFT_COST=0 leaves out the draft-cost stage; COMPILE=1 adds the compiled Hugging Face decoder: it did not
# finish in 110 s on 2026-12-04.)
# The checkout is over the 64 MiB a device call sends: `bash scripts/device_slim.sh on` first (`off` after).
# With the device tool, carry the two wheels gpu_profile.sh describes:
#     run(command="bash benchmarks/gpu_check.sh", carry=[".whl"], timeout_s=600)
set -uo pipefail
cd "$(dirname "$0")/.."
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/evalsuite-site \
    .whl/*.whl || exit 1
  export PYTHONPATH="/tmp/evalsuite-site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
out=${1:-benchmarks/results}
mkdir -p "$out"
# Where the device tool's $OUT exists, every file is copied there as soon as its stage ends (a cut-off call keeps
# what finished).
keep() { if [ -n "${OUT:-}" ] && [ -d "${OUT:-}" ]; then cp "$@" "$OUT/"; fi; }
failed=0
: > "$out/stages_gpu.txt"
stage() {  # stage NAME SECONDS FILE COMMAND...
  local name=$1 limit=$2 file=$3; shift 3
  local start=$SECONDS
  if [ -n "${STOP_AT:-}" ]; then  # an epoch second no stage may run past (gpu_session.sh sets it)
    local left=$((STOP_AT - $(date +%s)))
    if [ "$left" -lt 20 ]; then
      echo "$name: not started, $left s left before STOP_AT" | tee -a "$out/stages_gpu.txt"
      failed=1
      return
    fi
    [ "$left" -lt "$limit" ] && limit=$left
  fi
  timeout --kill-after=10 "$limit" "$@" 2>&1 | tee "$out/$file"
  local rc=${PIPESTATUS[0]}
  echo "$name: exit $rc after $((SECONDS - start)) s (limit $limit s)" | tee -a "$out/stages_gpu.txt"
  [ "$rc" = 0 ] || failed=1
  keep "$out/$file" "$out/stages_gpu.txt"
}
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.mem --format=csv 2>&1
  "$PY" -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, \
'transformers', transformers.__version__)"; } | tee "$out/gpu_env.txt"
keep "$out/gpu_env.txt"
# the CUDA default first (flash+split in bf16: its tokens, then its cost beside the other attentions), so that a
# call cut short still answers for what runs use
stage captured_bf16 70 captured_check_gpu.txt \
  "$PY" benchmarks/captured_check.py --target qwen3-8b-random --device cuda --context 2048 --tokens 64 \
  --attention flash+split
stage context_cost 200 context_cost_gpu.txt \
  "$PY" benchmarks/context_cost.py --target qwen3-8b-random --device cuda --contexts 1024,8192,32768 --repeats 5 \
  --layouts fused+graphs+flash+split,fused+graphs+split,fused+graphs,fused
stage captured_fp32 90 captured_check_fp32_gpu.txt \
  "$PY" benchmarks/captured_check.py --target qwen3-8b-random --device cuda --dtype float32 --context 2048 --tokens 64 \
  --attention split-k
stage captured_masked 70 captured_check_masked_gpu.txt \
  "$PY" benchmarks/captured_check.py --target qwen3-8b-random --device cuda --context 2048 --tokens 64
stage decode_profile 120 decode_profile_gpu.txt "$PY" benchmarks/gpu_decode_profile.py flash+split
if [ "${DRAFT_COST:-1}" = 1 ]; then
  stage draft_cost 100 draft_cost_gpu.txt \
    "$PY" benchmarks/draft_cost.py --target qwen3-8b-random --device cuda --contexts 2048,8192,32768 --steps 10 \
    --profile 3
fi
if [ "${COMPILE:-0}" = 1 ]; then  # the Hugging Face decoder through torch.compile, beside the captured path
  stage context_cost_compile 150 context_cost_compile_gpu.txt \
    "$PY" benchmarks/context_cost.py --target qwen3-8b-random --device cuda --contexts 1024,32768 --repeats 5 \
    --layouts fused+graphs+flash --compile
fi
exit $failed
