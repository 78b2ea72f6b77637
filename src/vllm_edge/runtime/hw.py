"""Hardware probe: CPU ISA flags and the cores this process may use.

Reads ``/proc/cpuinfo`` under an injectable root so tests can feed captured
snapshots of other machines.
"""

from __future__ import annotations

import os
import platform
from dataclasses import asdict, dataclass, field
from pathlib import Path

# ISA features that decide which kernels vLLM and torch can use.
X86_FLAGS = {
    "avx2": "avx2",
    "avx512": "avx512f",
    "avx512_bf16": "avx512_bf16",
    "avx512_vnni": "avx512_vnni",
    "avx_vnni": "avx_vnni",
    "amx_tile": "amx_tile",
    "amx_bf16": "amx_bf16",
    "amx_int8": "amx_int8",
}
ARM_FLAGS = {"neon": "asimd", "i8mm": "i8mm", "bf16": "bf16", "sve": "sve", "dotprod": "asimddp"}


@dataclass
class CpuInfo:
    arch: str
    model_name: str
    isa: dict[str, bool] = field(default_factory=dict)
    logical_cpus: int = 0
    allowed_cpus: list[int] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def _parse_cpuinfo(text: str) -> tuple[str, set[str], int]:
    model, flags, n = "", set(), 0
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip().lower()
        if key == "processor":
            n += 1
        elif key in ("model name", "cpu model") and not model:
            model = value.strip()
        elif key in ("flags", "features") and not flags:
            flags = set(value.split())
    return model, flags, n


def probe_cpu(root: str | os.PathLike = "/", arch: str | None = None) -> CpuInfo:
    """Probe the CPU. ``root`` points at a captured filesystem snapshot in tests."""
    arch = arch or platform.machine()
    cpuinfo = Path(root, "proc/cpuinfo")
    try:
        text = cpuinfo.read_text()
    except OSError:
        text = ""
    model, flags, n = _parse_cpuinfo(text)
    table = ARM_FLAGS if arch in ("aarch64", "arm64") else X86_FLAGS
    isa = {name: flag in flags for name, flag in table.items()}
    if Path(root).resolve() == Path("/"):
        allowed = sorted(os.sched_getaffinity(0))
    else:
        allowed = list(range(n))
    return CpuInfo(arch=arch, model_name=model or "unknown", isa=isa, logical_cpus=n, allowed_cpus=allowed)
