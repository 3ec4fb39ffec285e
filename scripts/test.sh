#!/usr/bin/env bash
# Set up (if needed, with every optional extra, so that their tests run) and run the default test suite.
# Integration tests on the embedded default target: scripts/test.sh -m integration
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --all
exec .venv/bin/python -m pytest -q "$@"
