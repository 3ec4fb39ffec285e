#!/usr/bin/env bash
# Run a timed command on a quiet machine: pause the other heavy jobs (a background drafter training, a test run)
# with SIGSTOP while it runs, and resume them with SIGCONT afterwards, also when the command fails or is
# interrupted. Timings swing by tens of percent when two heavy jobs share this 2-core machine, so every committed
# timing is measured this way (or on an idle machine).
#
#   bash benchmarks/paused.sh [--match REGEX] [--every SECONDS] -- COMMAND [ARGS...]
#
# --match: an extended regex over a process's command line (default: `evalsuite (train|run)|pytest`); the command's
# own process tree, this script and anything under .venv-vllm (vLLM's engine core re-parents itself) are never
# paused. --every: how often to look again for new matching processes (default 5 s: a training script starts its
# next stage as a new process). Looking costs one pgrep per interval, nothing in between: a pauser that polls
# several times a second itself adds noise to what it is meant to keep quiet (measured here: a decode's per-step
# CV 24 % beside a 0.2 s polling loop, 11 % with the others stopped once).
# Exit status: the command's.
set -uo pipefail
match='evalsuite (train|run)|pytest'
every=5
while [ $# -gt 0 ]; do
  case "$1" in
    --match) match=$2; shift 2;;
    --every) every=$2; shift 2;;
    --) shift; break;;
    *) break;;
  esac
done
if [ $# -eq 0 ]; then
  echo "usage: bash benchmarks/paused.sh [--match REGEX] [--every SECONDS] -- COMMAND [ARGS...]" >&2
  exit 2
fi

stopped=()
resume() {
  for pid in "${stopped[@]}"; do kill -CONT "$pid" 2>/dev/null; done
  stopped=()
}
trap resume EXIT
trap '[ -n "${child:-}" ] && kill "$child" 2>/dev/null; resume; exit 130' INT TERM  # the command goes too

tree() {  # the pids of process $1 and all its descendants
  local p=$1 c
  echo "$p"
  for c in $(pgrep -P "$p"); do tree "$c"; done
}

pause_others() {
  local mine pid cmd
  mine=" $$ "
  [ -n "${child:-}" ] && mine=" $$ $(tree "$child" | tr '\n' ' ') "
  for pid in $(pgrep -f -- "$match"); do
    case "$mine" in *" $pid "*) continue;; esac
    cmd=$(tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null) || continue
    case "$cmd" in *.venv-vllm*|*benchmarks/paused.sh*) continue;; esac
    case " ${stopped[*]-} " in *" $pid "*) continue;; esac
    if kill -STOP "$pid" 2>/dev/null; then
      stopped+=("$pid")
    fi
  done
}

wait_stopped() {  # SIGSTOP takes effect asynchronously: let every paused job reach state T (at most ~2 s)
  local tries pid state pending
  for tries in $(seq 40); do
    pending=
    for pid in "${stopped[@]}"; do
      state=$(sed 's/.*) //' "/proc/$pid/stat" 2>/dev/null | cut -d' ' -f1) || continue
      case "$state" in T|t|Z|X|"") ;; *) pending=1;; esac
    done
    [ -z "$pending" ] && return 0
    sleep 0.05
  done
}

child=
pause_others  # before the command starts: its first second is timed too
wait_stopped
"$@" &
child=$!
status=
while [ -z "$status" ]; do
  sleep "$every" &
  timer=$!
  finished=
  wait -n -p finished "$child" "$timer"  # bash >= 5.1: whichever ends first, and which it was
  rc=$?
  if [ "$finished" = "$child" ]; then
    status=$rc
    kill "$timer" 2>/dev/null
  elif [ "$finished" = "$timer" ]; then
    pause_others
  fi
done
resume
exit "$status"
