"""Entry-point helper for stage scripts: bad input ends in one clear line and a non-zero exit, no traceback."""

from __future__ import annotations

import sys
from typing import Callable

from fedrepro.errors import FedreproError


def run_stage(main: Callable[[], None]) -> None:
    try:
        main()
    except FedreproError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
