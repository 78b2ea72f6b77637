"""The CPU probe on captured snapshots."""

from __future__ import annotations

from vllm_edge.common.hw import probe_cpu

SNAPSHOTS = {
    "amx_xeon": ("x86_64", "Intel(R) Xeon(R) Platinum 8480+",
                 "fpu avx avx2 avx512f avx512_bf16 avx512_vnni amx_bf16 amx_tile amx_int8"),
    "zen4": ("x86_64", "AMD Ryzen 9 7950X 16-Core Processor",
             "fpu avx avx2 avx512f avx512_bf16 avx512_vnni"),
    "arm64": ("aarch64", None, "fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics asimddp i8mm bf16"),
}


def _write(root, arch, model, flags, n=4):
    key = "Features" if arch == "aarch64" else "flags"
    blocks = []
    for i in range(n):
        lines = [f"processor\t: {i}"]
        if model:
            lines.append(f"model name\t: {model}")
        lines.append(f"{key}\t\t: {flags}")
        blocks.append("\n".join(lines))
    (root / "proc").mkdir(parents=True)
    (root / "proc" / "cpuinfo").write_text("\n\n".join(blocks) + "\n")


def test_amx_xeon(tmp_path):
    _write(tmp_path, *SNAPSHOTS["amx_xeon"])
    cpu = probe_cpu(tmp_path, arch="x86_64")
    assert cpu.isa["amx_tile"] and cpu.isa["amx_bf16"] and cpu.isa["avx512"]
    assert cpu.logical_cpus == 4 and cpu.allowed_cpus == [0, 1, 2, 3]
    assert "Xeon" in cpu.model_name


def test_zen4(tmp_path):
    _write(tmp_path, *SNAPSHOTS["zen4"])
    cpu = probe_cpu(tmp_path, arch="x86_64")
    assert cpu.isa["avx512_bf16"] and not cpu.isa["amx_tile"]


def test_arm64(tmp_path):
    _write(tmp_path, *SNAPSHOTS["arm64"])
    cpu = probe_cpu(tmp_path, arch="aarch64")
    assert cpu.isa == {"neon": True, "i8mm": True, "bf16": True, "sve": False, "dotprod": True}
    assert cpu.model_name == "unknown"


def test_this_machine():
    cpu = probe_cpu()
    assert cpu.logical_cpus >= 1 and cpu.allowed_cpus


def _write_sysfs(root, caches=(("1", "Data", "48K"), ("1", "Instruction", "32K"), ("2", "Unified", "2048K"),
                               ("3", "Unified", "107520K")), nodes=2):
    base = root / "sys/devices/system/cpu/cpu0/cache"
    for i, (level, kind, size) in enumerate(caches):
        d = base / f"index{i}"
        d.mkdir(parents=True)
        (d / "level").write_text(level + "\n")
        (d / "type").write_text(kind + "\n")
        (d / "size").write_text(size + "\n")
    for n in range(nodes):
        (root / f"sys/devices/system/node/node{n}").mkdir(parents=True)
    (root / "sys/devices/system/node/possible").write_text(f"0-{nodes - 1}\n")


def test_sysfs_caches_and_numa(tmp_path):
    _write(tmp_path, *SNAPSHOTS["amx_xeon"])
    _write_sysfs(tmp_path)
    cpu = probe_cpu(tmp_path, arch="x86_64")
    assert cpu.cache_kib == {"L1d": 48, "L2": 2048, "L3": 107520}
    assert cpu.numa_nodes == 2


def test_missing_sysfs_is_empty(tmp_path):
    _write(tmp_path, *SNAPSHOTS["zen4"])
    cpu = probe_cpu(tmp_path, arch="x86_64")
    assert cpu.cache_kib == {} and cpu.numa_nodes == 0


def test_a_bare_model_name_gets_its_family_so_two_generations_stay_two_hosts(tmp_path):
    """A virtual machine shows "AMD EPYC" for Zen 4 and Zen 5 alike; the artifacts of one must
    not land in the other's folder or table."""
    from vllm_edge.common import provenance

    hosts = []
    for name, family in (("zen4", "25"), ("zen5", "26")):
        root = tmp_path / name
        _write(root, "x86_64", "AMD EPYC", "fpu avx avx2 avx512f avx512_bf16 avx512_vnni", n=2)
        text = (root / "proc" / "cpuinfo").read_text()
        (root / "proc" / "cpuinfo").write_text(text.replace("model name", f"cpu family\t: {family}\nmodel\t\t: 2\nmodel name"))
        cpu = probe_cpu(root, arch="x86_64")
        assert cpu.family == f"{family}/2" and cpu.model_name == "AMD EPYC"
        hosts.append(provenance.host({"cpu": {"model": cpu.model_name, "isa": cpu.isa, "family": cpu.family},
                                      "core_set": [0, 1]}))
    assert hosts == ["AMD EPYC (family 25/2), AVX512-BF16, 2 cores", "AMD EPYC (family 26/2), AVX512-BF16, 2 cores"]
    # a named model is named enough, and a provenance written before the field keeps its label
    assert provenance.host({"cpu": {"model": "Intel(R) Xeon(R) Platinum 8480+", "family": "6/143",
                                    "isa": {"amx_bf16": True}}, "core_set": [0, 1]}) == \
        "Intel Xeon Platinum 8480+, AMX-BF16, 2 cores"
    assert provenance.host({"cpu": {"model": "AMD EPYC", "isa": {"avx512_bf16": True}}, "core_set": [0, 1]}) == \
        "AMD EPYC, AVX512-BF16, 2 cores"
