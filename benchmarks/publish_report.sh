# Sourced by the report scripts: publish_report STAGE OUT replaces OUT with the staged report, keeping OUT's
# hand-written README.md (it describes the report; the staged copy stays in STAGE).
publish_report() {
  local stage=$1 out=$2 keep=""
  if [ -f "$out/README.md" ]; then keep=$(mktemp); cp "$out/README.md" "$keep"; fi
  rm -rf "$out"
  mkdir -p "$(dirname "$out")"
  cp -r "$stage" "$out"
  if [ -n "$keep" ]; then cp "$keep" "$out/README.md"; rm -f "$keep"; fi
}
