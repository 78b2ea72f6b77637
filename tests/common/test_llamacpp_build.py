"""The llama.cpp build in provenance: the system-info string parsed, the install record trusted
only for the library it hashed, and the block present exactly when the process loaded llama.cpp
(the real library's is in tests/bench/test_llamacpp_arm.py)."""

from __future__ import annotations

import hashlib
import json
import re
import sys
import types
from pathlib import Path

from vllm_edge.common import llamacpp_build, provenance

REPO = Path(__file__).resolve().parents[2]

# As llama-cpp-python 0.3.36 prints it on an AVX-512 host built without AMX.
X86 = ("CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | BMI2 = 1 | "
       "AVX512 = 1 | AVX512_VBMI = 1 | AVX512_VNNI = 1 | AVX512_BF16 = 1 | LLAMAFILE = 1 | "
       "OPENMP = 1 | REPACK = 1 | ")


def test_the_system_info_string_parses_into_features():
    feats = llamacpp_build.parse_system_info(X86)
    assert list(feats) == ["CPU"]
    assert feats["CPU"]["AVX512_BF16"] == 1 and feats["CPU"]["REPACK"] == 1
    assert "AMX_INT8" not in feats["CPU"] and len(feats["CPU"]) == 14


def test_several_backends_and_non_flag_values():
    text = "CPU : NEON = 1 | ARM_FMA = 1 | SVE = 1 | SVE_CNT = 16 | OPENMP = 1 | BLAS : ACCELERATE = 1 | "
    assert llamacpp_build.parse_system_info(text) == {
        "CPU": {"NEON": 1, "ARM_FMA": 1, "SVE": 1, "SVE_CNT": 16, "OPENMP": 1},
        "BLAS": {"ACCELERATE": 1}}


def test_the_old_flat_format_is_the_cpus():
    feats = llamacpp_build.parse_system_info("AVX = 1 | AVX_VNNI = 0 | AVX2 = 1 | MATMUL_INT8 = 0 | ")
    assert feats == {"CPU": {"AVX": 1, "AVX_VNNI": 0, "AVX2": 1, "MATMUL_INT8": 0}}
    assert llamacpp_build.parse_system_info("") == {}


def _fake_llama_cpp(tmp_path: Path, amx: bool) -> types.ModuleType:
    pkg = tmp_path / "llama_cpp"
    (pkg / "lib").mkdir(parents=True)
    (pkg / "lib" / "libggml-cpu.so").write_bytes(b"\x7fELF..." + (b"ggml_backend_amx_buffer_type" if amx else b""))
    mod = types.ModuleType("llama_cpp")
    mod.__file__ = str(pkg / "__init__.py")
    mod.__version__ = "0.0.0"
    mod.llama_print_system_info = lambda: X86.encode()
    mod.llama_version = lambda: b"0.5.0-dev"
    return mod


def _record(prefix: Path, lib: Path, args: str) -> None:
    (prefix / llamacpp_build.RECORD).write_text(json.dumps(
        {"cmake_args": args, "libggml-cpu.so_sha256": hashlib.sha256(lib.read_bytes()).hexdigest()}))


def test_a_loaded_llama_cpp_puts_its_build_in_the_provenance(tmp_path, monkeypatch):
    mod = _fake_llama_cpp(tmp_path, amx=True)
    monkeypatch.setitem(sys.modules, "llama_cpp", mod)
    monkeypatch.setattr(sys, "prefix", str(tmp_path))
    lib = tmp_path / "llama_cpp" / "lib" / "libggml-cpu.so"
    _record(tmp_path, lib, "-DGGML_NATIVE=OFF -DGGML_AVX2=ON")
    block = provenance.collect()["llama_cpp"]
    assert block["features"]["CPU"]["AVX512"] == 1 and block["system_info"] == X86.strip()
    assert block["llama_cpp"] == "0.5.0-dev" and block["cpu_backends"] == ["libggml-cpu.so"]
    assert block["amx_kernels"] is True
    assert block["cmake_args"] == "-DGGML_NATIVE=OFF -DGGML_AVX2=ON"
    assert block["cmake_args_source"] == llamacpp_build.RECORD
    # a rebuilt library voids the record: its CMAKE_ARGS are no longer known
    lib.write_bytes(b"\x7fELF rebuilt")
    block = provenance.collect()["llama_cpp"]
    assert block["cmake_args"] is None and "another build" in block["cmake_args_source"]
    assert block["amx_kernels"] is False


def test_no_record_and_no_llama_cpp(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "llama_cpp", _fake_llama_cpp(tmp_path, amx=False))
    monkeypatch.setattr(sys, "prefix", str(tmp_path))
    block = provenance.collect()["llama_cpp"]
    assert block["cmake_args"] is None and block["cmake_args_source"].startswith("not recorded")
    monkeypatch.delitem(sys.modules, "llama_cpp")
    assert "llama_cpp" not in provenance.collect()  # nothing loaded, nothing to name


def test_a_failing_library_is_recorded_not_raised(tmp_path, monkeypatch):
    mod = _fake_llama_cpp(tmp_path, amx=False)
    mod.llama_print_system_info = lambda: (_ for _ in ()).throw(OSError("no symbol"))
    monkeypatch.setitem(sys.modules, "llama_cpp", mod)
    assert provenance.collect()["llama_cpp"] == {"error": "OSError: no symbol"}


def test_install_sh_writes_the_record_provenance_reads(tmp_path, monkeypatch):
    # The record's writer is the Python inside scripts/install.sh: run it as the script would,
    # against a stand-in llama_cpp package, and read its record back.
    script = (REPO / "scripts" / "install.sh").read_text()
    code = re.search(r"<<'PY'\n(.*?)\nPY\n", script, re.S).group(1)
    assert llamacpp_build.RECORD in code
    mod = _fake_llama_cpp(tmp_path, amx=False)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "llama_cpp", raising=False)
    monkeypatch.setattr(sys, "prefix", str(tmp_path))
    monkeypatch.setenv("CMAKE_ARGS", " -DGGML_AMX_TILE=OFF")
    (tmp_path / "llama_cpp" / "__init__.py").write_text("")
    import importlib.metadata as md
    monkeypatch.setattr(md, "version", lambda dist: "0.3.36")
    exec(compile(code, "install.sh", "exec"), {})
    got = llamacpp_build.read_record(tmp_path, Path(mod.__file__).parent / "lib" / "libggml-cpu.so")
    assert got == {"cmake_args": "-DGGML_AMX_TILE=OFF", "cmake_args_source": llamacpp_build.RECORD}


def test_a_build_loaded_through_llama_cpp_lib_path_is_the_one_described(tmp_path, monkeypatch):
    # LLAMA_CPP_LIB_PATH makes llama-cpp-python load another build's libllama (its ggml beside
    # it); the package's own lib/ must not be described in its place, nor its install record.
    mod = _fake_llama_cpp(tmp_path, amx=False)
    _record(tmp_path, tmp_path / "llama_cpp" / "lib" / "libggml-cpu.so", "-DGGML_AVX2=ON")
    other = tmp_path / "other-build"
    other.mkdir()
    (other / "libggml-cpu.so").write_bytes(b"\x7fELF...ggml_backend_amx_buffer_type")
    mod.llama_cpp = types.SimpleNamespace(_lib=types.SimpleNamespace(_name=str(other / "libllama.so")))
    monkeypatch.setitem(sys.modules, "llama_cpp", mod)
    monkeypatch.setattr(sys, "prefix", str(tmp_path))
    block = provenance.collect()["llama_cpp"]
    assert block["amx_kernels"] is True
    assert block["cmake_args"] is None and "another build" in block["cmake_args_source"]
    # a build that carries its own record (install.sh --llamacpp-amx) is described by it
    _record(other, other / "libggml-cpu.so", "-DGGML_NATIVE=ON -DCMAKE_CXX_FLAGS=-fno-dse")
    block = provenance.collect()["llama_cpp"]
    assert block["cmake_args"] == "-DGGML_NATIVE=ON -DCMAKE_CXX_FLAGS=-fno-dse"
    # the package's own library, loaded from its lib/, is described with its record
    mod.llama_cpp = types.SimpleNamespace(_lib=types.SimpleNamespace(
        _name=str(tmp_path / "llama_cpp" / "lib" / "libllama.so")))
    block = provenance.collect()["llama_cpp"]
    assert block["amx_kernels"] is False and block["cmake_args"] == "-DGGML_AVX2=ON"


def test_install_sh_lays_out_the_amx_build_with_its_own_record(tmp_path, monkeypatch):
    # install.sh --llamacpp-amx unpacks a llama-cpp-python wheel's libraries into a directory
    # of their own with a record; run its Python against a stand-in wheel and read it back
    # as provenance would for a process loaded from there.
    import subprocess
    import zipfile

    script = (REPO / "scripts" / "install.sh").read_text()
    code = re.search(r"\"\$amx_dir\.tmp\" <<'PY'\n(.*?)\nPY\n", script, re.S).group(1)
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    with zipfile.ZipFile(wheels / "llama_cpp_python-0.3.36-py3-none-linux_x86_64.whl", "w") as z:
        z.writestr("llama_cpp/__init__.py", "")
        z.writestr("llama_cpp/lib/libllama.so", b"\x7fELF llama")
        z.writestr("llama_cpp/lib/libggml-cpu.so", b"\x7fELF " + llamacpp_build.AMX_SYMBOL)
    out = tmp_path / "llama-cpp-amx.tmp"
    subprocess.run([sys.executable, "-c", code, str(wheels), str(out)], check=True,
                   env={"CMAKE_ARGS": "-DGGML_NATIVE=ON -DCMAKE_CXX_FLAGS=-fno-dse"})
    assert sorted(p.name for p in out.iterdir()) == ["libggml-cpu.so", "libllama.so", llamacpp_build.RECORD]
    assert llamacpp_build.read_record(out, out / "libggml-cpu.so") == {
        "cmake_args": "-DGGML_NATIVE=ON -DCMAKE_CXX_FLAGS=-fno-dse", "cmake_args_source": llamacpp_build.RECORD}
