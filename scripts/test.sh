#!/usr/bin/env bash
# Installs everything, then runs the whole test suite: unit tests, mirror tests (skipped without
# ../shared/data/raw) and one end-to-end `dvc repro` of the embedded default.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
. .venv/bin/activate
export DVC_NO_ANALYTICS=1 HF_HUB_OFFLINE=1
# The house style first (pyproject.toml's [tool.ruff]): seconds, and a newcomer's change learns it before the tests run.
# `ruff format . && ruff check --fix .` puts a tree right.
ruff format --check . || { echo "ruff format: the files above are not formatted; run \`ruff format .\`" >&2; exit 1; }
ruff check --quiet .
# Two workers (tests/conftest.py groups the tests so that each module's fixtures run once): the Flower drills mostly
# wait on processes and timeouts while the end-to-end pipeline run computes. The slowest 40 tests and fixtures are
# listed, so CI shows where its time goes.
python -m pytest -n 2 -ra --durations=40 "$@"
