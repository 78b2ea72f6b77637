"""Hardware probe: CPU ISA flags, the cores this process may use, caches and NUMA nodes.

Reads ``/proc/cpuinfo`` and sysfs under an injectable root so tests can feed captured
snapshots of other machines. :func:`profile` is the probe as the weight-path choice sees
it: ``VLLM_EDGE_HW_PROFILE`` (JSON) replaces it.
"""

from __future__ import annotations

import os
import platform
import re
import time
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
    # x86 "cpu family/model" from /proc/cpuinfo ("26/2"), "" where absent: a virtual machine
    # may show a bare "AMD EPYC" for CPU generations that differ in speed
    family: str = ""
    logical_cpus: int = 0
    allowed_cpus: list[int] = field(default_factory=list)
    # cache level name ("L1d", "L2", "L3") -> KiB, as cpu0 sees it; empty when sysfs is absent
    cache_kib: dict[str, int] = field(default_factory=dict)
    numa_nodes: int = 0
    source: str = "probe"  # "probe" or "VLLM_EDGE_HW_PROFILE"

    def to_dict(self) -> dict:
        return asdict(self)


def _parse_cpuinfo(text: str) -> tuple[str, set[str], int, str]:
    model, flags, n, family, number = "", set(), 0, "", ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip().lower()
        if key == "processor":
            n += 1
        elif key in ("model name", "cpu model") and not model:
            model = value.strip()
        elif key in ("flags", "features") and not flags:
            flags = set(value.split())
        elif key == "cpu family" and not family:
            family = value.strip()
        elif key == "model" and not number:
            number = value.strip()
    return model, flags, n, f"{family}/{number}" if family and number else ""


def probe_cpu(root: str | os.PathLike = "/", arch: str | None = None) -> CpuInfo:
    """Probe the CPU. ``root`` points at a captured filesystem snapshot in tests."""
    arch = arch or platform.machine()
    cpuinfo = Path(root, "proc/cpuinfo")
    try:
        text = cpuinfo.read_text()
    except OSError:
        text = ""
    model, flags, n, family = _parse_cpuinfo(text)
    table = ARM_FLAGS if arch in ("aarch64", "arm64") else X86_FLAGS
    isa = {name: flag in flags for name, flag in table.items()}
    if Path(root).resolve() == Path("/"):
        allowed = sorted(os.sched_getaffinity(0))
    else:
        allowed = list(range(n))
    return CpuInfo(arch=arch, model_name=model or "unknown", isa=isa, family=family, logical_cpus=n,
                   allowed_cpus=allowed, cache_kib=_caches(root), numa_nodes=_numa_nodes(root))


def _size_kib(text: str) -> int | None:
    m = re.fullmatch(r"(\d+)([KMG]?)", text.strip())
    if not m:
        return None
    n, unit = int(m.group(1)), m.group(2)
    return {"": n // 1024, "K": n, "M": n * 1024, "G": n * 1024 * 1024}[unit]


def _caches(root: str | os.PathLike) -> dict[str, int]:
    out: dict[str, int] = {}
    for d in sorted(Path(root, "sys/devices/system/cpu/cpu0/cache").glob("index*")):
        try:
            level = (d / "level").read_text().strip()
            kind = (d / "type").read_text().strip()
            size = _size_kib((d / "size").read_text())
        except OSError:
            continue
        if kind == "Instruction" or size is None:
            continue
        out[f"L{level}d" if kind == "Data" else f"L{level}"] = size
    return out


def _numa_nodes(root: str | os.PathLike) -> int:
    return len([p for p in Path(root, "sys/devices/system/node").glob("node[0-9]*") if p.is_dir()])


def profile(root: str | os.PathLike = "/", arch: str | None = None) -> CpuInfo:
    """The probe, or ``VLLM_EDGE_HW_PROFILE`` when set.

    The override is a JSON object with the fields of :class:`CpuInfo`; ``isa`` may be a
    dict or a list of the flag names that are present. Fields it omits keep their probed
    values, except ``isa``: a given ``isa`` replaces the probed one (missing flags are
    false), so a snapshot of another machine never inherits this one's flags.
    """
    from vllm_edge import envs

    probed = probe_cpu(root, arch)
    override = envs.get("VLLM_EDGE_HW_PROFILE")
    if override is None:
        return probed
    if not isinstance(override, dict):
        raise ValueError(f"VLLM_EDGE_HW_PROFILE must be a JSON object, got {type(override).__name__}")
    unknown = set(override) - set(CpuInfo.__dataclass_fields__)
    if unknown:
        raise ValueError(f"VLLM_EDGE_HW_PROFILE: unknown field(s) {sorted(unknown)}; "
                         f"known: {sorted(CpuInfo.__dataclass_fields__)}")
    fields = probed.to_dict()
    fields.update(override)
    if "isa" in override:
        table = ARM_FLAGS if fields["arch"] in ("aarch64", "arm64") else X86_FLAGS
        given = override["isa"]
        present = {k for k, v in given.items() if v} if isinstance(given, dict) else set(given)
        by_flag = {flag: name for name, flag in table.items()}  # raw cpuinfo names work too
        bad = sorted(f for f in present if f not in table and f not in by_flag)
        if bad:
            raise ValueError(f"VLLM_EDGE_HW_PROFILE: unknown isa flag(s) {bad} for {fields['arch']}; "
                             f"known: {sorted(table)}")
        present = {by_flag.get(f, f) for f in present}
        fields["isa"] = {name: name in present for name in table}
    elif fields["arch"] != probed.arch:
        raise ValueError("VLLM_EDGE_HW_PROFILE changes arch but gives no isa; "
                         "give both so this machine's flags are not carried over")
    fields["source"] = "VLLM_EDGE_HW_PROFILE"
    return CpuInfo(**fields)


# --- load on the cores (the grid's pre-flight and doctor's thread advice) ---

def read_cpu_times() -> dict[int, tuple[int, int]]:
    """{cpu: (busy_ticks, total_ticks)} from /proc/stat."""
    out: dict[int, tuple[int, int]] = {}
    with open("/proc/stat") as f:
        for line in f:
            if not line.startswith("cpu") or line.startswith("cpu "):
                continue
            parts = line.split()
            ticks = [int(x) for x in parts[1:]]
            # guest/guest_nice are already counted in user/nice.
            total = sum(ticks[:8])
            idle = ticks[3] + ticks[4]  # idle + iowait
            out[int(parts[0][3:])] = (total - idle, total)
    return out


def sample_cpu_busy(cores: list[int], seconds: float = 1.0) -> dict[int, float]:
    """Percent busy per core over ``seconds``, from two /proc/stat snapshots."""
    a = read_cpu_times()
    time.sleep(seconds)
    b = read_cpu_times()
    out = {}
    for c in cores:
        if c not in a or c not in b:
            continue
        dbusy, dtotal = b[c][0] - a[c][0], b[c][1] - a[c][1]
        out[c] = round(100.0 * dbusy / dtotal, 1) if dtotal > 0 else 0.0
    return out
