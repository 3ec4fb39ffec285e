#!/usr/bin/env bash
# Set up what the main job needs (if needed), then run a short main job on the embedded default target (offline).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/evalsuite run --method "${METHOD:-dlite,ngram}" --task "${TASK:-gsm8k}" --limit "${LIMIT:-4}" "$@"
