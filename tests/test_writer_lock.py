"""A checkpoint folder has one writer (``fedrepro.fl.flower.writer_lock``): a second is refused naming the first, and
a writer killed with SIGKILL leaves no stale lock behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from fedrepro.errors import FederationError
from fedrepro.fl.flower.writer_lock import sole_writer

HOLD = (
    "import sys, time\n"
    "from fedrepro.fl.flower.writer_lock import sole_writer\n"
    "with sole_writer(sys.argv[1]):\n"
    "    print('held', flush=True)\n"
    "    time.sleep(120)\n"
)


def test_a_second_writer_in_the_same_process_is_refused_and_the_lock_is_free_after(tmp_path):
    with sole_writer(tmp_path / "cell"):
        with pytest.raises(FederationError, match=f"process {os.getpid()} on") as refused:
            with sole_writer(tmp_path / "cell"):
                pass
        assert str(tmp_path / "cell") in str(refused.value)
    with sole_writer(tmp_path / "cell"):
        pass


def test_a_writer_killed_with_sigkill_leaves_no_stale_lock(tmp_path):
    folder = tmp_path / "cell"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(folder)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(FederationError, match=f"process {holder.pid} on .*kill {holder.pid}"):
            with sole_writer(folder):
                pass
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    with sole_writer(folder):  # the kernel dropped the dead holder's lock
        pass
