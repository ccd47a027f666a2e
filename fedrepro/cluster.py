"""A stage's cells trained on the nodes of a Ray cluster (``$RAY_ADDRESS``, ``CLUSTER_ENV``), each cell
that must train a Ray task that asks for what the cell needs (one CPU unless the stage says otherwise), wherever in
the cluster that is free.

The library knows nothing of DVC, but DVC is why the outputs come back as they do: the stage's process (the driver,
which DVC runs) must end with exactly the files a local run writes, where it writes them. No file system is assumed
shared between the driver and the nodes, so everything travels by content:

- a cell's input folders: each distinct set is packed once (a tar of the folders at their paths relative to the
  stage's working directory: stages name them from the repository's root, ``data/...``), put in Ray's object store,
  and unpacked once per node, into a folder of the node's temporary folder named by the pack's digest
  (``NODE_INPUTS``), where later cells and stages that read the same set find it;
- the cell's checkpoint folder as the driver holds it (a run resumed, or restored from the cell store), so a node
  resumes the cell as this machine would;
- back, the cell's output and checkpoint folders, written where a local run writes them.

On the node the cell runs in a scratch folder of its own, its working directory, in which its inputs sit at the
relative paths they have on the driver, so it reads and writes the paths it would here. What only the driver holds
stays on the driver, as in a local run: the cell store, the results ledger, the outputs a cell was scored to before
(``fedrepro.jobs.scored_before``). A cell seeds itself and its run depends on its inputs and code only, so a node of
the driver's machine class (its CPU's kernels, ``fedrepro.hardware``) gives the bits the driver would; the nodes must
run the same code (the project installed as on the driver): it is part of each cell's fingerprint, and no node checks
it.

Ray is imported in the functions only: importing it costs seconds, which a stage that trains here does not pay.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import logging
import os
import pickle
import shutil
import socket
import sys
import tarfile
import tempfile
import time
import traceback
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from fedrepro.cell_store import CellStore
from fedrepro.errors import ConfigError
from fedrepro.io import atomic_dir
from fedrepro.jobs import Job, child_error, keep_scored, restore_job, scored_before
from fedrepro.ledger import ResultsLedger

CLUSTER_ENV = "RAY_ADDRESS"
"""Environment variable: the address of a Ray cluster (``ray start --head`` says it) on whose nodes a stage trains its
cells, each a Ray task, instead of on this machine's cores. Ray's own: its tools read it too.
Not a param: it moves no result (a node of the same machine class gives the bits this machine gives)."""


DEFAULT_RESOURCES = {"num_cpus": 1, "num_gpus": 0}
"""What a cell's task asks for unless the stage's ``resources(cell)`` says otherwise."""
RESOURCE_OPTIONS = ("num_cpus", "num_gpus", "memory", "resources")
"""The Ray task options ``resources(cell)`` may set: CPUs, GPUs (a fraction shares one), bytes of memory, and the
cluster's own named resources (``ray start --resources``)."""
NODE_INPUTS = "fedrepro-cluster-inputs"
"""In a node's temporary folder: the input folders its cells read, a folder per set named by its pack's digest. Kept
for the later cells and stages that read the same set; free to delete between stages."""
CONNECT_SECONDS = 10.0
"""How long the driver waits for the cluster's address to answer before it says that nothing does."""


@dataclass
class _Ran:
    """What a cell's task sends back: the lines it wrote to stderr (less its progress bars), the seconds it ran, and
    its metrics and output and checkpoint folders (packed), or its error as ``fedrepro.jobs.child_error`` takes it."""

    said: list[str] = field(default_factory=list)
    seconds: float = 0.0
    metrics: dict | None = None
    outputs: bytes | None = None
    checkpoint: bytes | None = None
    error: tuple | None = None


def run_on_cluster(
    address: str,
    jobs: list[Job],
    inputs: Callable[[Any], tuple[Path, ...]],
    run_cell: Callable[[Any, Path, Path, str], dict],
    store: CellStore,
    finish: Callable[[Job, dict], None],
    ledger: ResultsLedger | None,
    may_start: Callable[[Job], bool],
    stop_at: float | None,
    resources: Callable[[Any], dict] | None,
) -> None:
    """Finish the jobs: here those whose runs were scored before (``scored_before``; each job restored from the cell
    store first, as in a local run), the others on the Ray cluster at ``address``, joined only if there are any
    (``_train_on_cluster``). Paths travel relative to the working directory: an input, output or checkpoint folder
    that is not inside it is refused before anything is sent or restored."""
    travelling = [(job, _travelling(job, inputs(job.cell))) for job in jobs]
    to_train = []
    for job, folders in travelling:
        if not may_start(job):
            continue
        job.started = time.perf_counter()
        job.restored = restore_job(job, store, ledger)
        metrics = scored_before(job, ledger)
        if metrics is None:
            to_train.append((job, folders))
        else:
            finish(job, metrics)
    if to_train:
        _train_on_cluster(_connect(address), to_train, run_cell, finish, ledger, stop_at, resources)


def _train_on_cluster(
    ray: Any,
    jobs: list[tuple[Job, tuple[Path, ...]]],
    run_cell: Callable[[Any, Path, Path, str], dict],
    finish: Callable[[Job, dict], None],
    ledger: ResultsLedger | None,
    stop_at: float | None,
    resources: Callable[[Any], dict] | None,
) -> None:
    """Each job (with its input folders) sent as a task asking for ``resources(cell)`` (``DEFAULT_RESOURCES``), a line
    when it is sent and (``finish``) when it is done; its outputs and checkpoint written here, and kept
    (``keep_scored``). A task that reaches a node after ``stop_at`` does not start its cell (``$FEDREPRO_STOP_AT``).
    The first cell to fail stops the stage, with its error as a forked cell's (``fedrepro.jobs.child_error``); the
    others are ended, and what they trained on their nodes is lost (their checkpoints here stay as they were sent).
    This process leaves the cluster at the end."""
    train, cell_runner = ray.remote(_train_cell), ray.put(run_cell)
    packs: dict[tuple[Path, ...], tuple[str, Any]] = {}
    running: dict[Any, Job] = {}
    try:
        for job, folders in jobs:
            if folders not in packs:
                pack = _pack({folder.as_posix(): folder for folder in folders})
                packs[folders] = hashlib.sha256(pack).hexdigest(), ray.put(pack)
            digest, pack_ref = packs[folders]
            asked = _asked(job.cell, resources)
            task = train.options(name=f"cell {job.cell.name}", **asked).remote(
                cell_runner,
                job.cell,
                job.out,
                job.checkpoint_dir,
                job.inputs_digest,
                digest,
                [pack_ref],
                _pack_folder(job.checkpoint_dir),
                stop_at,
            )
            running[task] = job
            print(
                f"sent {job.cell.name} to the Ray cluster ({', '.join(f'{k} {v}' for k, v in asked.items())})",
                file=sys.stderr,
                flush=True,
            )
        while running:
            [task], _ = ray.wait(list(running))
            job = running.pop(task)
            try:
                ran = ray.get(task)
            except ray.exceptions.RayError as error:
                raise RuntimeError(f"cell {job.cell.name}: its Ray task failed: {error}") from None
            if ran is None:  # it reached its node past the stop time
                continue
            if ran.error is not None:
                if ran.said:
                    print(f"--- {job.cell.name}'s last lines:", *ran.said[-20:], sep="\n", file=sys.stderr)
                raise child_error(job, None, ran.error)
            if ran.said:
                print(*ran.said, sep="\n", file=sys.stderr)
            if ran.outputs is not None:
                _unpack(ran.outputs, job.out)
            if ran.checkpoint is not None:
                with atomic_dir(job.checkpoint_dir) as folder:
                    _unpack(ran.checkpoint, folder)
            job.started = time.perf_counter() - ran.seconds  # its run on the node, not its wait for one
            keep_scored(job, ran.metrics, ledger)
            finish(job, ran.metrics)
    finally:
        for task in running:
            ray.cancel(task, force=True)
        ray.shutdown()


def _connect(address: str) -> Any:
    """Ray, this process joined to the cluster at ``address`` as its driver; one clear line where nothing answers
    there (Ray itself would wait without a word)."""
    host, _, port = address.split("://")[-1].rpartition(":")
    if port.isdigit():  # host:port, or ray://host:port; Ray's "auto" finds a cluster of this machine itself
        try:
            socket.create_connection((host, int(port)), timeout=CONNECT_SECONDS).close()
        except OSError as error:
            raise ConfigError(
                f"${CLUSTER_ENV} = {address!r}: no Ray cluster answers there "
                f"({error.strerror or error}); start one (`ray start --head`), or unset {CLUSTER_ENV} "
                "to train here"
            ) from None
    import ray

    with warnings.catch_warnings():  # that a task asking for no GPU will one day see the node's: not in this Ray
        warnings.filterwarnings("ignore", "Tip: In future versions of Ray", FutureWarning)
        ray.init(address=address, logging_level=logging.WARNING)
    return ray


def _travelling(job: Job, inputs: tuple[Path, ...]) -> tuple[Path, ...]:
    """The job's input folders; refused where one of them, or its output or checkpoint folder, cannot travel: a node
    puts each at the same path in its scratch folder, so each must be a path relative to the working directory that
    stays inside it."""
    for path in (*inputs, job.out, job.checkpoint_dir):
        if Path(path).is_absolute() or ".." in Path(path).parts:
            raise ConfigError(
                f"cell {job.cell.name}: {path} is not inside the working directory, so it cannot travel "
                f"to a node of the Ray cluster (${CLUSTER_ENV}): a cell sent there reads and writes "
                "paths relative to the stage's working directory"
            )
    return tuple(Path(folder) for folder in inputs)


def _asked(cell: Any, resources: Callable[[Any], dict] | None) -> dict:
    """What the cell's task asks Ray for: ``DEFAULT_RESOURCES`` and what ``resources(cell)`` sets."""
    asked = {**DEFAULT_RESOURCES, **(resources(cell) if resources is not None else {})}
    unknown = sorted(set(asked) - set(RESOURCE_OPTIONS))
    if unknown:
        raise ConfigError(
            f"cell {cell.name}: {unknown} are not resources a Ray task asks for "
            f"(those are {', '.join(RESOURCE_OPTIONS)})"
        )
    return asked


def _pack(folders: dict[str, Path]) -> bytes:
    """A tar of the folders, each under its name, with the files that links point to (their content is what
    travels). A folder that does not exist is left out: the cell finds it missing on the node, as it would here."""
    packed = io.BytesIO()
    with tarfile.open(fileobj=packed, mode="w", dereference=True) as archive:
        for name, folder in folders.items():
            if Path(folder).exists():
                archive.add(folder, arcname=name)
    return packed.getvalue()


def _pack_folder(folder: Path) -> bytes | None:
    """The folder's files packed, or None where there is no folder."""
    return _pack({".": folder}) if Path(folder).is_dir() else None


def _unpack(pack: bytes, folder: Path) -> None:
    """A pack's files written under ``folder`` (made), none outside it."""
    Path(folder).mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(pack)) as archive:
        archive.extractall(folder, filter="data")


def _train_cell(
    run_cell: Callable[[Any, Path, Path, str], dict],
    cell: Any,
    out: Path,
    checkpoint_dir: Path,
    inputs_digest: str,
    pack_digest: str,
    pack: list,
    checkpoint: bytes | None,
    stop_at: float | None,
) -> _Ran | None:
    """A cell's task, on its node: ``run_cell`` in a scratch folder (its working directory) that holds its inputs
    (``_node_inputs``: ``pack`` is a list, so that Ray hands over the reference, not the pack, which a node that
    unpacked it already need not fetch) and its checkpoint as the driver had it; what it wrote and said sent back. None
    past ``stop_at`` (nothing started)."""
    if stop_at is not None and time.time() >= stop_at:
        return None
    started = time.perf_counter()
    with (
        tempfile.TemporaryDirectory(prefix="fedrepro-cell-") as scratch,
        tempfile.TemporaryFile("w+", encoding="utf-8", newline="") as said,
    ):  # newline="": its "\r"s kept
        shutil.copytree(_node_inputs(pack_digest, pack[0]), scratch, copy_function=os.link, dirs_exist_ok=True)
        if checkpoint is not None:
            _unpack(checkpoint, Path(scratch) / checkpoint_dir)
        with contextlib.chdir(scratch):
            try:
                with contextlib.redirect_stderr(said):
                    metrics = run_cell(cell, out, checkpoint_dir, inputs_digest)
                ran = _Ran(metrics=metrics, outputs=_pack_folder(out), checkpoint=_pack_folder(checkpoint_dir))
            except BaseException as error:
                ran = _Ran(error=("error", error if _pickles(error) else None, traceback.format_exc()))
        said.seek(0)
        ran.said = [line for line in said.read().split("\n") if line.strip() and "\r" not in line]  # no progress bars
    ran.seconds = time.perf_counter() - started
    return ran


def _node_inputs(digest: str, pack: Any) -> Path:
    """The folder of this node's ``NODE_INPUTS`` that holds the pack ``digest`` unpacked: the first cell here to read
    it fetches and unpacks it (a cell that does so at the same time as another leaves the other's)."""
    import ray

    kept = Path(tempfile.gettempdir()) / NODE_INPUTS
    folder = kept / digest
    if not folder.is_dir():
        kept.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{digest[:12]}.tmp-", dir=kept))
        _unpack(ray.get(pack), staging)
        try:
            staging.rename(folder)
        except OSError:  # another cell on this node unpacked it first
            shutil.rmtree(staging)
    return folder


def _pickles(error: BaseException) -> bool:
    """Whether the error can travel back as itself (else its traceback's text does)."""
    try:
        pickle.dumps(error)
        return True
    except Exception:
        return False
