# Sourced by the report scripts.
#
# publish_report STAGE OUT replaces OUT with the staged report, keeping OUT's hand-written README.md (it describes
# the report; the staged copy stays in STAGE).
publish_report() {
  local stage=$1 out=$2 keep=""
  if [ -f "$out/README.md" ]; then keep=$(mktemp); cp "$out/README.md" "$keep"; fi
  rm -rf "$out"
  mkdir -p "$(dirname "$out")"
  cp -r "$stage" "$out"
  if [ -n "$keep" ]; then cp "$keep" "$out/README.md"; rm -f "$keep"; fi
}

# A study longer than one session on a machine that does not outlive it: its unfinished runs (and the staged
# measurements beside them, STAGE/*.txt) are committed as a seed, a tracked folder, and a fresh machine's staging
# folder starts from it, so the next session's --resume goes on from where the last one stopped (each resume is
# recorded in run.json with its own environment). The runs stay in the ignored staging folder while they run, so
# they never make the tracked tree +dirty under a running evaluation.
#
# seed_partial STAGE SEED: when STAGE/runs holds no run yet, start STAGE from the committed SEED.
seed_partial() {
  local stage=$1 seed=$2
  mkdir -p "$stage/runs"
  if [ -n "$seed" ] && [ -d "$seed/runs" ] && [ -z "$(ls -A "$stage/runs")" ]; then
    cp -r "$seed"/. "$stage/"
    echo "[$(date -u +%FT%TZ)] started from the committed unfinished runs in $seed ($(ls "$seed/runs" | tr '\n' ' '))"
  fi
}

# save_partial STAGE SEED: replace SEED with STAGE's runs and *.txt (run it once the study has stopped, then commit
# SEED). Refuses while an evalsuite run writes into STAGE.
save_partial() {
  local stage=$1 seed=$2
  if [ -z "$seed" ]; then echo "save_partial: no PARTIAL folder given for STAGE=$stage" >&2; return 2; fi
  if pgrep -f "evalsuite run .*--out $stage/runs" > /dev/null; then
    echo "save_partial: an evalsuite run still writes into $stage/runs; stop it first (it resumes)" >&2
    return 2
  fi
  if [ ! -d "$stage/runs" ] || [ -z "$(ls -A "$stage/runs")" ]; then
    echo "save_partial: no runs in $stage/runs" >&2
    return 2
  fi
  rm -rf "$seed"
  mkdir -p "$seed"
  cp -r "$stage/runs" "$seed/"
  find "$stage" -maxdepth 1 -name '*.txt' -exec cp {} "$seed/" \;
  echo "saved the unfinished runs of $stage/runs to $seed ($(du -sh "$seed" | cut -f1)); commit it"
}
