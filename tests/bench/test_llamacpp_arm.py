"""The llama.cpp arm's arguments and metric line (its run on the default GGUF is in
test_llamacpp_arm_engine)."""

from __future__ import annotations

from support.llamacpp import default_gguf, need_llama_cpp, run_arm
from vllm_edge.bench.llamacpp import arm as llamacpp_arm


def test_bad_arguments_exit_2_before_loading(tmp_path):
    need_llama_cpp()
    gguf = str(default_gguf())
    proc = run_arm("--gguf", gguf, "--tg-tokens", "1")
    assert proc.returncode == 2 and "--tg-tokens must be at least 2" in proc.stderr
    proc = run_arm("--gguf", str(tmp_path / "none.gguf"))
    assert proc.returncode == 2 and "none.gguf: no such GGUF file" in proc.stderr
    assert "loaded in" not in proc.stderr
    proc = run_arm("--gguf", gguf, "--batch", "4,1000")
    assert proc.returncode == 2 and "--batch 1000: llama.cpp decodes at most 256 sequences" in proc.stderr
    assert "loaded in" not in proc.stderr


def test_metric_line_keeps_speed_key_names():
    result = {"build": "x.gguf (llama.cpp Q4_1)", "load_s": 0.5,
              "rss_file_mb": 90.0, "config": {"use_mmap": True}, "out": "r.json",
              "metrics": {"pp512_tps": {"median": 300.0}, "tg128_tps": {"median": 40.0},
                          "b8_tg_tps": {"median": 150.0}},
              "memory_phases": {"load_peak_rss_anon_mb": 20.0, "bench_peak_rss_anon_mb": 60.0}}
    line = llamacpp_arm.metric_line(result)
    assert line["pp512_tps"] == 300.0 and line["tg128_tps"] == 40.0
    assert line["peak_rss_anon_mb"] == 60.0 and line["load_s"] == 0.5
    assert line["benchmark"] == "speed" and line["engine"] == "llama.cpp"
    assert line["b8_tg_tps"] == 150.0 and "batch" not in line
    assert list(line)[-1] == "out"


def test_the_arms_provenance_names_the_llama_cpp_build():
    # Every llama.cpp arm writes provenance.collect() after loading the library; loading it is
    # all the build's description needs, no model.
    need_llama_cpp()
    import llama_cpp

    from vllm_edge.common import provenance

    block = provenance.collect()["llama_cpp"]
    assert block["llama_cpp_python"] == llama_cpp.__version__
    assert block["system_info"] == llama_cpp.llama_print_system_info().decode().strip()
    cpu = block["features"]["CPU"]
    assert cpu and all(isinstance(v, (int, str)) for v in cpu.values())
    assert block["cpu_backends"] and isinstance(block["amx_kernels"], bool)
    assert "cmake_args" in block and block["cmake_args_source"]
