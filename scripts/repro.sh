#!/usr/bin/env bash
# Installs everything, then runs the whole pipeline (`dvc repro`) on the embedded default: no mirror, no internet.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
. .venv/bin/activate
export DVC_NO_ANALYTICS=1 HF_HUB_OFFLINE=1
dvc repro "$@"
