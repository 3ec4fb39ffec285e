#!/usr/bin/env bash
# The device tool sends the checkout's tracked files, at most 64 MiB, and this repository tracks ~140 MB (mostly the
# shipped drafters and the training data, which the GPU checks do not read). Before a device call, `on` takes
# those folders out of git's index (the files stay on disk) and hides them in .git/info/exclude, so that they do
# not travel; `off` puts both back as they were. Nothing is committed either way: run `off` before any commit.
#   bash scripts/device_slim.sh on     # then run(command="bash benchmarks/gpu_check.sh", carry=[".whl"], ...)
#   bash scripts/device_slim.sh off
set -euo pipefail
cd "$(dirname "$0")/.."
FOLDERS=(baselines/drafters tasks/training)
EXCLUDE=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$EXCLUDE")"
case "${1:-}" in
  on)
    git rm -r -q --cached "${FOLDERS[@]}"
    for f in "${FOLDERS[@]}"; do grep -qxF "/$f/" "$EXCLUDE" 2>/dev/null || echo "/$f/" >> "$EXCLUDE"; done
    echo "device_slim: $(git ls-files -z | xargs -0 du -cb | tail -1 | cut -f1) bytes of tracked files travel" ;;
  off)
    for f in "${FOLDERS[@]}"; do sed -i "\\#^/$f/\$#d" "$EXCLUDE"; done
    git reset -q -- "${FOLDERS[@]}"
    git status --short -- "${FOLDERS[@]}" ;;
  *) echo "usage: bash scripts/device_slim.sh on|off" >&2; exit 2 ;;
esac
