"""A federation's processes end with the process that started them (``fedrepro.fl.flower.reaper``), even when that
process is SIGKILLed and runs no ``finally``. The federation here spawns stand-ins for Flower's processes (sleepers,
one of which starts another in a session of its own, as Flower starts its SuperExecs), so the test needs no Flower
run; ``tests/test_flower.py`` kills a stage in the middle of a real deployment."""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from fedrepro.fl.flower.reaper import marked

ROOT = Path(__file__).resolve().parents[1]
SLEEPER = "import time; time.sleep(600)"
ESCAPER = (
    "import subprocess, sys, time; "
    f"subprocess.Popen([sys.executable, '-c', {SLEEPER!r}], start_new_session=True); time.sleep(600)"
)
STAGE = textwrap.dedent(f"""
    import os, sys, time
    from fedrepro.fl.flower.federation import LocalFederation
    from fedrepro.fl.flower.reaper import marked
    federation = LocalFederation(sys.argv[1])
    federation.start_service("superlink", [sys.executable, "-c", {ESCAPER!r}])
    federation.start_service("supernode-0", [sys.executable, "-c", {SLEEPER!r}])
    while len(marked(str(federation.folder) + ":")) < 3:
        time.sleep(0.1)
    if sys.argv[2] == "stop":
        federation.stop_all()
    fork = os.fork()  # a cell worker the stage forked: it holds the reaper's pipe open after the stage is gone
    if fork == 0:
        time.sleep(600)
        os._exit(0)
    print(fork, flush=True)
    time.sleep(600)
""")


def start_stage(folder: Path, how: str) -> tuple[subprocess.Popen, int]:
    """The stage, and the pid of the cell worker it forked."""
    stage = subprocess.Popen(
        [sys.executable, "-c", STAGE, str(folder), how],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        cwd=ROOT,
    )
    return stage, int(stage.stdout.readline())


def wait_for(condition, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def test_a_sigkilled_stage_leaves_no_process_of_its_federation_within_seconds(tmp_path):
    folder = tmp_path / "federation"
    prefix = f"{folder.resolve()}:"
    stage, worker = start_stage(folder, "kill")
    try:
        stage.send_signal(signal.SIGKILL)
        stage.wait()
        killed_at = time.monotonic()
        assert wait_for(lambda: not marked(prefix), 10), f"alive 10 s after the stage's SIGKILL: {marked(prefix)}"
        assert time.monotonic() - killed_at < 2, "the reaper polls its owner every 0.2 s"
        log_file = folder / "logs" / "reaper.log"
        assert wait_for(lambda: "process(es)" in log_file.read_text(), 10)
        log = log_file.read_text()
        assert "the owner" in log and "is gone: killed 3 process(es) left running " in log, log
        assert "['superlink', 'superlink', 'supernode-0']" in log, "the escaper's child too, by its mark"
    finally:
        for pid in marked(prefix):
            os.kill(pid, signal.SIGKILL)
        stage.kill()
        os.kill(worker, signal.SIGKILL)


def test_a_federation_stopped_by_its_stage_ends_its_reaper_and_leaves_no_process(tmp_path):
    folder = tmp_path / "federation"
    prefix = f"{folder.resolve()}:"
    stage, worker = start_stage(folder, "stop")
    try:
        assert not marked(prefix)
        log = (folder / "logs" / "reaper.log").read_text()
        assert "stopped the federation: killed " in log, log
        assert not [line for line in log.splitlines() if line.startswith("still alive")]
    finally:
        for pid in marked(prefix):
            os.kill(pid, signal.SIGKILL)
        stage.kill()
        os.kill(worker, signal.SIGKILL)
