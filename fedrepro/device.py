"""Where a cell computes: ``train.device`` (auto | cpu | cuda | cuda:N), one setting for all three papers.

``auto`` is a GPU when torch sees one, else the CPU. It is resolved when the params are read, like ``precision: auto``,
so a stage, its cells and its report see the device used, and asking for a GPU that is not there stops at the params
in one line that names the key. A machine without NVIDIA's driver (``/proc/driver/nvidia``) has no GPU for torch to
see, and there the params are resolved without importing torch (seconds a process).

The device is where a cell runs, not what it runs: it is kept out of the cells' run fingerprints, as the CPU's
instruction set is, and recorded with the machine beside every cell (``fedrepro.hardware``, ``fedrepro.ledger``'s
machine class). A GPU gives other bits than a CPU for the same seed; ``configure`` makes one GPU give the same bits
from run to run (docs/reproducibility.md says what is promised where).
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Any

from fedrepro.errors import ConfigError

SETTING = re.compile(r"auto|cpu|cuda(:\d+)?")
DRIVER = Path("/proc/driver/nvidia/version")
GPU_FOLDERS = Path("/proc/driver/nvidia/gpus")
GPU_SHARE_ENV = "FEDREPRO_GPU_SHARE"
"""Environment variable: the share of one GPU a cell's Flower ClientApp asks Ray for (1 = a whole GPU, 0.5 = two cells
on one GPU); the grid sets it for the cells it packs onto one GPU. Not a param: it moves no result."""
CUBLAS_WORKSPACE = ":4096:8"
"""cuBLAS's workspace setting for deterministic results (NVIDIA's cuBLAS notes; torch's reproducibility page): set
before the first cuBLAS call, so ``configure`` sets it in the environment where it is not set already."""


def ray_gpus() -> int | None:
    """The GPUs a Ray started here should offer: none without NVIDIA's driver (so Ray need not look), else Ray's own
    count (None: Ray detects them)."""
    return None if DRIVER.exists() else 0


def gpu_share(device: str) -> float:
    """The share of a GPU a cell on ``device`` asks a Ray worker for: none on the CPU, else ``$FEDREPRO_GPU_SHARE``
    (default a whole GPU)."""
    if not device.startswith("cuda"):
        return 0.0
    raw = os.environ.get(GPU_SHARE_ENV, "").strip() or "1"
    try:
        share = float(raw)
    except ValueError:
        share = -1.0
    if not 0 < share <= 1:
        raise ConfigError(
            f"${GPU_SHARE_ENV} = {raw!r}: expected the share of one GPU a cell takes, above 0 and at most 1"
        )
    return share


def resolve_device(setting: str, key: str = "train.device") -> str:
    """``auto`` -> ``cuda`` where torch sees a GPU, else ``cpu``; ``cuda`` and ``cuda:N`` are checked against the GPUs
    torch sees (a ConfigError naming ``key`` otherwise), except for a stage whose cells run on a Ray cluster
    (``$RAY_ADDRESS``): its nodes have the GPUs, and each checks its own (``configure``); ``cpu`` is kept.

    Torch is asked through NVML (``PYTORCH_NVML_BASED_CUDA_CHECK``), which leaves CUDA uninitialised: a stage forks its
    cell workers after reading its params, and a CUDA runtime initialised before a fork is unusable in the children."""
    if not SETTING.fullmatch(setting):
        raise ConfigError(f"{key} = {setting!r}: expected auto, cpu, cuda or cuda:N")
    if setting == "cpu" or (setting == "auto" and not DRIVER.exists()):
        return "cpu"
    if setting != "auto" and os.environ.get("RAY_ADDRESS", "").strip():
        return setting
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if setting == "auto":
        return "cuda" if count else "cpu"
    index = int(setting.partition(":")[2] or 0)
    if index >= count:
        seen = f"{count} GPU(s)" if count else "no GPU" + ("" if torch.version.cuda else " (this torch is a CPU build)")
        raise ConfigError(
            f"{key} = {setting!r}: torch sees {seen} here; use auto or cpu, or run on a machine with the GPU"
        )
    return setting


def _smi(query: str) -> list[str]:
    """One line per GPU (in nvidia-smi's order) of ``nvidia-smi --query-gpu=<query>``; none without nvidia-smi. A
    subprocess, so asking leaves this process's CUDA uninitialised (see ``resolve_device``)."""
    try:
        found = subprocess.run(
            ["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line.strip() for line in found.stdout.splitlines() if line.strip()] if found.returncode == 0 else []


def visible_gpus() -> list[str]:
    """The GPUs this process may use, as ``CUDA_VISIBLE_DEVICES`` names them (where it is set) or by index, found
    without initialising CUDA: what a stage hands out, one to each cell worker."""
    chosen = os.environ.get("CUDA_VISIBLE_DEVICES")
    if chosen is not None:
        return [name.strip() for name in chosen.split(",") if name.strip() and name.strip() != "-1"]
    count = len(list(GPU_FOLDERS.iterdir())) if GPU_FOLDERS.is_dir() else len(_smi("index"))
    return [str(index) for index in range(count)]


def _listed(device: str, query: str) -> str | None:
    """nvidia-smi's ``query`` for the GPU behind a resolved ``device`` (its index among the visible GPUs)."""
    lines, visible = _smi(query), visible_gpus()
    index = int(device.partition(":")[2] or 0)
    physical = visible[index] if index < len(visible) else str(index)
    return lines[int(physical)] if physical.isdigit() and int(physical) < len(lines) else (lines[0] if lines else None)


def capability(device: str) -> tuple[int, int]:
    """The compute capability of the GPU behind a resolved ``device`` (``(9, 0)``: an H100), read without initialising
    CUDA where nvidia-smi can say it (mixed GPU models under ``CUDA_DEVICE_ORDER=FASTEST_FIRST`` may name another
    GPU's), else from torch."""
    listed = _listed(device, "compute_cap")
    if listed and re.fullmatch(r"\d+\.\d+", listed):
        major, minor = listed.split(".")
        return int(major), int(minor)
    import torch

    return torch.cuda.get_device_capability(torch.device(device))


def memory_bytes(device: str) -> int | None:
    """The memory of the GPU behind a resolved ``device``, without initialising CUDA; None where nvidia-smi is
    missing."""
    listed = _listed(device, "memory.total")
    return int(float(listed) * 2**20) if listed and listed.replace(".", "", 1).isdigit() else None


def bf16_native(device: str) -> bool:
    """Whether bf16 autocast runs on bf16 hardware on this (resolved) GPU device: compute capability 8 (Ampere) and
    later; earlier GPUs emulate it, slower than fp32."""
    return capability(device)[0] >= 8


def configure(device: str) -> None:
    """The settings one GPU needs to give the same bits from run to run, applied before a cell's first CUDA op:
    deterministic algorithms (an op without a deterministic CUDA kernel raises instead of varying), cuBLAS's workspace
    setting, and TF32 off, so ``fp32`` means fp32 on a GPU as on a CPU (``bf16`` is the fast setting). A no-op on the
    CPU, whose kernels are deterministic already."""
    if not device.startswith("cuda"):
        return
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)
    import torch

    if not torch.cuda.is_available() or torch.device(device).index not in (None, *range(torch.cuda.device_count())):
        raise ConfigError(
            f"train.device = {device!r}: torch sees no such GPU on this machine ({os.uname().nodename}); "
            "a cell sent to a node without one cannot train there"
        )
    torch.use_deterministic_algorithms(True)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = False
    torch.cuda.set_device(torch.device(device))


def to_device(batch: Any, device: Any) -> Any:
    """``batch`` (a tensor, or a dict, list or tuple of them) on ``device``; anything else as it is."""
    if hasattr(batch, "to") and hasattr(batch, "device"):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, dict):
        return {key: to_device(value, device) for key, value in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(value, device) for value in batch)
    return batch


def model_device(model: Any) -> Any:
    """The device of ``model``'s first parameter (where a task puts the batches it feeds it)."""
    return next(model.parameters()).device


def describe(device: str) -> dict[str, Any] | None:
    """The GPU behind a resolved ``device`` (name, compute capability, memory, CUDA and driver-facing versions) for
    the machine's record; None on the CPU."""
    if not device.startswith("cuda"):
        return None
    import torch

    props = torch.cuda.get_device_properties(torch.device(device))
    return {
        "name": props.name,
        "capability": f"{props.major}.{props.minor}",
        "memory_gib": round(props.total_memory / 2**30, 1),
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
    }
