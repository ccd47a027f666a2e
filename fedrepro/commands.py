"""The ``fedrepro`` command (``pyproject.toml``'s scripts), for what a user asks of the project outside a stage.

    fedrepro check [PARAMS]    # every mistake in params.yaml (and its scale's preset) at once; exit 2 if any

The pipeline runs the same check as its first stage (``stages/check.py``); no stage imports this module, so its
commands add nothing to any stage's dependencies.
"""

from __future__ import annotations

import argparse
import sys

from fedrepro.errors import ConfigError
from fedrepro.preflight import check_params


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="fedrepro", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    check = commands.add_parser("check", help="list every mistake in params.yaml at once, before any work")
    check.add_argument("params", nargs="?", default="params.yaml", help="the params file (its scales/ folder beside it)")
    args = parser.parse_args(argv)
    try:
        check_params(args.params, out=None)
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    print(f"{args.params}: no problem found (keys and values, names, algorithm knobs, backbones, own files)")


if __name__ == "__main__":
    main()
