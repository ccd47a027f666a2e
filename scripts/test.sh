#!/usr/bin/env bash
# Installs everything, then runs the whole test suite: unit tests, mirror tests (skipped without
# ../shared/data/raw) and one end-to-end `dvc repro` of the embedded default.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
. .venv/bin/activate
export DVC_NO_ANALYTICS=1 HF_HUB_OFFLINE=1
python -m pytest -ra --durations=40 "$@"   # the slowest 40 tests and fixtures, so CI shows where its time goes
