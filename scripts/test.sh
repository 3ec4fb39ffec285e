#!/usr/bin/env bash
# Set up (if needed) and run the default test suite (fast; tiny models built in the tests).
# Integration tests on the embedded default target: scripts/test.sh -m integration
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest -q "$@"
