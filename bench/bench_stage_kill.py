"""A stage SIGKILLed in the middle of a Flower deployment: how long its federation outlives it, and whether anything
writes to the cell's checkpoint afterwards (issue 52's budget: 0 processes after 10 s, 0 checkpoint writes).

Runs the drill of ``tests/test_flower.py`` (``run_stage_kill`` in ``tests/flower_cells.py``): for each kill point
(the federation up, its nodes joining; round 2 under way), a stage process of its own trains the tests' tiny relation
cell with FedAvg on a deployment and is SIGKILLed there; the bench prints the seconds until no process of the
federation ran, the processes still running 10 s after, and whether the checkpoint folder changed from 1 s after the
kill to the end of the point's watch. Prints the machine's instruction set with it. Run it on loopback only:
scripts/loopback.sh python bench/bench_stage_kill.py
Usage: python bench/bench_stage_kill.py [--work DIR]
"""

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from flower_cells import NODE_TIMINGS, STAGE_KILL_POINTS, run_stage_kill  # noqa: E402

from fedrepro.fl.flower.federation import LocalFederation  # noqa: E402
from fedrepro.ledger import machine_class  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, default=None, help="scratch folder (default: a temporary one)")
    args = parser.parse_args()
    LocalFederation.node_timings = NODE_TIMINGS
    work = args.work or Path(tempfile.mkdtemp(prefix="bench-stage-kill-"))
    drills = run_stage_kill(work)
    print(f"machine: {machine_class('fp32')}")
    for point, drill in drills.items():
        print(
            f"{point}: none of the federation's processes ran {drill['seconds_to_none']:.2f} s after the stage's "
            f"SIGKILL; running 10 s after: {len(drill['left_after_10s'])}; checkpoint written from 1 s to "
            f"{STAGE_KILL_POINTS[point]:.0f} s after: {'yes' if drill['checkpoint_changed'] else 'no'} "
            f"(rounds checkpointed: {drill['rounds_checkpointed']})"
        )


if __name__ == "__main__":
    main()
