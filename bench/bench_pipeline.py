"""Wall time of the embedded `dvc repro` in a fresh copy of the project, and of a second, no-op `dvc repro`.

Target (issue 2): the embedded repro <= 10 minutes on the 2-core machine; the no-op repro in seconds.
Usage: python bench/bench_pipeline.py
"""

import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from pipeline_copy import fresh_copy, run  # noqa: E402


def timed(command, cwd):
    started = time.perf_counter()
    result = run(command, cwd)
    if result.returncode != 0:
        sys.exit(f"{' '.join(command)} failed:\n{result.stdout[-2000:]}\n{result.stderr[-2000:]}")
    return time.perf_counter() - started, result.stdout


def main() -> None:
    with tempfile.TemporaryDirectory() as folder:
        project = fresh_copy(Path(folder))
        full, _ = timed(["dvc", "repro"], project)
        noop, output = timed(["dvc", "repro"], project)
        reran = output.count("Running stage")
    print(f"embedded dvc repro: {full:.1f} s ({full / 60:.2f} min; target <= 10 min)")
    print(f"no-op dvc repro:    {noop:.1f} s (stages rerun: {reran})")


if __name__ == "__main__":
    main()
