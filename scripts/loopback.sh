#!/usr/bin/env bash
# Runs a command in a network namespace of its own with only loopback up, so Ray and Flower (or anything they
# start) cannot reach another machine. Needs root (unshare --net). Example:
#   scripts/loopback.sh python bench/bench_flower.py --project .
set -euo pipefail
exec unshare --net -- sh -c 'ip link set lo up && exec "$@"' sh "$@"
