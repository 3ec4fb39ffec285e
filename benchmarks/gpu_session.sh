#!/usr/bin/env bash
# Both prepared GPU runs in one device call (a session's device time is 15 minutes, and each fresh machine costs
# a minute or more to start): benchmarks/gpu_check.sh (the captured path's tokens, decode/verify against the HBM
# floor, draft costs with a profile) and then benchmarks/gpu_profile.sh (batch × context cost surfaces and the
# break-even map) with whatever time is left under DEADLINE seconds (default 540; the call's limit is 600).
# The device tool returns at most 8 files, so every result goes into one archive, rewritten after each part:
# $OUT/gpu_session.tar.gz (and $OUT/gpu_session.log); a call cut off keeps what had finished.
#
# Here, before the call: `bash scripts/device_slim.sh on` (the checkout is over the 64 MiB a call sends) and the
# wheels of gpu_profile.sh in .whl/; then
#     run(command="bash benchmarks/gpu_session.sh", carry=[".whl"], timeout_s=600)
# and afterwards `bash scripts/device_slim.sh off`; `tar xzf gpu_session.tar.gz -C benchmarks/results/` unpacks it into
# benchmarks/results/gpu_session/.
set -uo pipefail
cd "$(dirname "$0")/.."
DEADLINE=${DEADLINE:-540}
RESULTS=${1:-/tmp/gpu_session}
mkdir -p "$RESULTS/check" "$RESULTS/stage"
log="$RESULTS/gpu_session.log"
archive() {
  if [ -n "${OUT:-}" ] && [ -d "${OUT:-}" ]; then
    local tmp="$RESULTS/gpu_session.$BASHPID.tar.gz"  # written aside, then moved: never a half-written archive
    tar czf "$tmp" -C "$RESULTS" --exclude=stage --exclude='*.tar.gz' --transform 's,^\.,gpu_session,' . \
      2>/dev/null && mv -f "$tmp" "$OUT/gpu_session.tar.gz"
    cp "$log" "$OUT/"
  fi
}
echo "gpu_session: started $(date -u +%FT%TZ), deadline ${DEADLINE} s" | tee "$log"
# the archive is rewritten every 20 s too, so that a call cut off inside a stage keeps every finished one
( while sleep 20; do archive; done ) &
archiver=$!
trap 'kill $archiver 2>/dev/null' EXIT
# gpu_check.sh copies each file to its own $OUT as it goes: point that at a staging folder, archive here instead
OUT_CHECK="$RESULTS/stage"
STOP_AT=$(($(date +%s) + DEADLINE)) OUT="$OUT_CHECK" bash benchmarks/gpu_check.sh "$RESULTS/check" 2>&1 | tee -a "$log"
check_rc=${PIPESTATUS[0]}
echo "gpu_check.sh: exit $check_rc after $SECONDS s" | tee -a "$log"
archive
left=$((DEADLINE - SECONDS - 60))  # a minute for loading, the last point and the break-even map
if [ "$left" -ge 60 ]; then
  TIME_LIMIT=$left OUT= bash benchmarks/gpu_profile.sh "$RESULTS/profile" 2>&1 | tee -a "$log"
  echo "gpu_profile.sh: exit ${PIPESTATUS[0]} after $SECONDS s (time limit $left s)" | tee -a "$log"
else
  echo "gpu_profile.sh: not started, $left s left" | tee -a "$log"
fi
archive
kill $archiver 2>/dev/null; wait $archiver 2>/dev/null
echo "gpu_session: done after $SECONDS s" | tee -a "$log"
archive
