#!/usr/bin/env bash
# Installs Debian's headless-capable Chromium for tests/test_plots_offline.py (idempotent).
# Exits non-zero with one line saying why when it cannot: the test then skips with that line.
set -euo pipefail
if command -v chromium >/dev/null 2>&1; then
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "install_chromium.sh: no apt-get here; install Chromium yourself (a 'chromium' on PATH)" >&2
  exit 1
fi
if [ "$(id -u)" -eq 0 ]; then
  AS_ROOT=()
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
  AS_ROOT=(sudo -n)
else
  echo "install_chromium.sh: apt-get needs root and passwordless sudo is not available" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
LOG=$(mktemp -t install_chromium.XXXXXX.log)
if ! { "${AS_ROOT[@]}" apt-get update -qq &&
       "${AS_ROOT[@]}" apt-get install -y -qq --no-install-recommends chromium; } >"$LOG" 2>&1; then
  echo "install_chromium.sh: apt-get install chromium failed (Debian mirror unreachable?); see $LOG" >&2
  exit 1
fi
rm -f "$LOG"
