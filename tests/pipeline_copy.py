"""A fresh, committed copy of the project in a temporary folder, for end-to-end runs that must not touch ./data."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENV = {
    **os.environ,
    "DVC_NO_ANALYTICS": "1",
    "HF_HUB_OFFLINE": "1",
    "GIT_AUTHOR_NAME": "fedrepro",
    "GIT_AUTHOR_EMAIL": "fedrepro@localhost",
    "GIT_COMMITTER_NAME": "fedrepro",
    "GIT_COMMITTER_EMAIL": "fedrepro@localhost",
}


def fresh_copy(target: Path) -> Path:
    """Copy the files git would ship (tracked and new, not ignored) and commit them in a new repository."""
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout.split("\0")
    for name in filter(None, listed):
        source = ROOT / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    for command in (["git", "init", "-q"], ["git", "add", "-A"], ["git", "commit", "-qm", "copy"]):
        subprocess.run(command, cwd=target, check=True, env=ENV)
    return target


def run(command: list[str], cwd: Path, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(command, cwd=cwd, env=ENV, capture_output=True, text=True, **kwargs)
