#!/usr/bin/env bash
# Set up (if needed) and run the main job on the embedded default target, fully offline.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/evalsuite run --method "${METHOD:-dlite,ngram}" --task "${TASK:-gsm8k}" --limit "${LIMIT:-4}" "$@"
