#!/usr/bin/env bash
# Prints, as Markdown, how the reports in the work tree differ from the committed ones (HEAD): the metrics that
# moved and by how much (the `metrics:` files of dvc.yaml), any params that differ, and the report files that
# changed. Run it after `dvc repro`; CI puts its output in the job summary and beside the reports artifact.
set -euo pipefail
cd "$(dirname "$0")/.."
# ./.venv is where scripts/install.sh puts dvc; without it, the dvc on PATH is used.
if [ -f .venv/bin/activate ]; then . .venv/bin/activate; fi
export DVC_NO_ANALYTICS=1

echo "## Regenerated reports against the committed ones ($(git rev-parse --short HEAD))"
echo
echo "### Metrics that moved"
echo
# With nothing to show, DVC still prints a table's two header lines.
metrics=$(dvc metrics diff --md HEAD)
if [ "$(grep -c . <<<"$metrics")" -gt 2 ]; then echo "$metrics"; else echo "None."; fi
echo
params=$(dvc params diff --md HEAD)
if [ "$(grep -c . <<<"$params")" -gt 2 ]; then
  printf '### Params that differ from the committed params.yaml\n\n%s\n\n' "$params"
fi
echo "### Report files that changed"
echo
changed=$(git diff --stat -- reports/)
added=$(git ls-files --others --exclude-standard -- reports/)
if [ -z "$changed$added" ]; then
  echo "None: every report is byte-identical to the committed one."
else
  if [ -n "$changed" ]; then printf '```\n%s\n```\n\n' "$changed"; fi
  if [ -n "$added" ]; then printf 'New, not committed:\n\n```\n%s\n```\n' "$added"; fi
fi
