"""Stage check, the first of the pipeline: every mistake in params.yaml listed at once, before any stage works
(``fedrepro.preflight``). Every other stage waits for it (acquire reads its output), and its output does not change
while params.yaml stays valid, so a valid change of params reruns no stage through it.

    python stages/check.py     # also: fedrepro check
"""

from fedrepro.cli import run_stage
from fedrepro.preflight import check_params

if __name__ == "__main__":
    run_stage(check_params)
