"""What a result ran on: the CPU's instruction sets and the numeric libraries, recorded beside every cell.

Float results are bit-identical from run to run on one machine, but CPU kernels differ by instruction set
(AMX, AVX-512, AVX2: oneDNN's bf16 matmuls, MKL's fp32 GEMM, torch's own vectorised kernels), so the same seed
gives other bits on another CPU type. A report therefore says which machine(s) its cells ran on, and the
kernel-selecting environment variables that were set (they let one machine run another's kernels).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
from functools import lru_cache
from importlib import metadata
from pathlib import Path

FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "avx512_vnni", "amx_bf16", "amx_int8")
KERNEL_ENV = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS", "MKL_CBWR")
LIBRARIES = ("torch", "numpy", "transformers", "tokenizers", "scikit-learn")


def _cpu() -> tuple[str, list[str]]:
    """The CPU's model name and which of ``FLAGS`` it has (Linux's /proc/cpuinfo; elsewhere the platform's name)."""
    fields: dict[str, str] = {}
    cpuinfo = Path("/proc/cpuinfo")
    for line in cpuinfo.read_text().splitlines() if cpuinfo.exists() else []:
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    flags = set(fields.get("flags", "").split())
    return fields.get("model name", platform.processor() or platform.machine()), [f for f in FLAGS if f in flags]


# oneDNN ISA caps (ONEDNN_MAX_CPU_ISA / DNNL_MAX_CPU_ISA) that leave out the CPU's bf16 instructions
_CAPS_WITHOUT_BF16 = {"SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX512_CORE", "AVX512_CORE_VNNI"}


def native_bf16() -> bool:
    """Whether bf16 matmuls run on bf16 instructions here (AVX-512 BF16 or AMX, not capped off by a kernel
    override). Without them oneDNN emulates bf16 and autocast is slower than fp32, not faster:
    `python bench/bench_bf16_speed.py` measured 11x (tiny BERT) and 25x (MiniLM) slower on a 2-core AVX2 EPYC."""
    _, flags = _cpu()
    caps = {os.environ.get(name, "").upper() for name in ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA")}
    return bool({"avx512_bf16", "amx_bf16"} & set(flags)) and not caps & _CAPS_WITHOUT_BF16


def resolve_precision(precision: str, device: str = "cpu") -> str:
    """``auto`` -> bf16 where it runs on bf16 instructions (of the CPU, or of the resolved GPU ``device``), fp32
    elsewhere; fp32 and bf16 are kept as given."""
    if precision != "auto":
        return precision
    if device.startswith("cuda"):
        from fedrepro.device import bf16_native

        return "bf16" if bf16_native(device) else "fp32"
    return "bf16" if native_bf16() else "fp32"


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


@lru_cache(maxsize=None)
def machine_fingerprint(device: str = "cpu") -> dict:
    """CPU model and the instruction-set flags that pick kernels, torch's chosen CPU capability, the kernel
    environment variables set, the numeric libraries' versions and, for a cell on a GPU ``device``, the GPU
    (``fedrepro.device.describe``); ``id`` is a short digest of all of it."""
    import torch

    model, flags = _cpu()
    info = {
        "cpu": model,
        "isa_flags": flags,
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "kernel_env": {k: os.environ[k] for k in KERNEL_ENV if k in os.environ},
        "libraries": {name: _version(name) for name in LIBRARIES},
        "python": platform.python_version(),
    }
    if device.startswith("cuda"):
        from fedrepro.device import describe as describe_gpu

        info["gpu"] = describe_gpu(device)
    info["id"] = hashlib.sha256(json.dumps(info, sort_keys=True).encode()).hexdigest()[:12]
    return info


def describe(fingerprints: list[dict]) -> str:
    """One line per distinct machine, for a report's setup section."""
    seen = {f["id"]: f for f in fingerprints if f}
    if not seen:
        return "not recorded (cells trained before hardware fingerprints were kept)"
    parts = []
    for f in seen.values():
        env = ", ".join(f"{k}={v}" for k, v in f["kernel_env"].items()) or "no kernel override"
        libs = ", ".join(f"{k} {v}" for k, v in f["libraries"].items() if v)
        gpu = f"{f['gpu']['name']} (CUDA {f['gpu']['cuda']}) with " if f.get("gpu") else ""
        parts.append(
            f"`{f['id']}`: {gpu}{f['cpu']} ({', '.join(f['isa_flags']) or 'no AVX2'}; torch kernels "
            f"{f['torch_cpu_capability']}; {env}); {libs}; Python {f['python']}"
        )
    return "; ".join(parts)
