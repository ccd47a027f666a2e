#!/usr/bin/env bash
# Installs fedrepro and everything it needs into ./.venv (idempotent). Offline-safe: only package registries.
set -euo pipefail
cd "$(dirname "$0")/.."
# DVC needs this clone as a git repository. Git refuses one that another user owns (root in a CI container over the
# runner's workspace, "dubious ownership"): say so before the long install, with git's reason and its fix, which the
# `git config` calls at the end would hide behind "not in a git directory".
if ! git_refusal=$(git rev-parse --git-dir 2>&1 >/dev/null) && [[ $git_refusal == *"dubious ownership"* ]]; then
  echo "install.sh: git refuses $PWD, which another user owns:" >&2
  echo "$git_refusal" >&2
  exit 1
fi
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
. .venv/bin/activate
python -m pip install --quiet --upgrade pip
# torch is pinned exactly: a bare `torch` would pull a multi-GB CUDA build.
python -m pip install --quiet -e ".[pipeline,test,flower]"  # flower: train.runtime=flower-*, tests/test_flower.py
python -m pip check
# `dvc plots show` pages that open without internet: Vega bundles from the npm registry, inlined (issue 22).
python scripts/plots_offline.py
# DVC needs a git repository with at least one commit and an identity for `dvc exp run`.
git config user.name >/dev/null 2>&1 || git config user.name "fedrepro"
git config user.email >/dev/null 2>&1 || git config user.email "fedrepro@localhost"
