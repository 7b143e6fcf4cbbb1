#!/usr/bin/env bash
# The GPU lane: tests/gpu on a GPU machine with the GPU stack installed (torch, vLLM, DeepSpeed, Ray and the pins of
# benchmarks/gpu-requirements.txt; see tests/gpu/RESULTS.md).
#   bash tests/gpu/run.sh [pytest arguments]    # e.g. -k rl; the log goes to $OUT/gpu-tests.log
set -uo pipefail
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . > "$OUT/install.log" 2>&1 || { tail "$OUT/install.log"; exit 1; }
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch, vllm, deepspeed, ray, transformers, peft; print('torch', torch.__version__, '| vllm', vllm.__version__, '| deepspeed', deepspeed.__version__, '| ray', ray.__version__, '| transformers', transformers.__version__, '| peft', peft.__version__)" 2>/dev/null
} | tee "$OUT/device.txt"
python3 -m pytest tests/gpu -v -s -p no:cacheprovider --durations=0 "$@" 2>&1 | tee "$OUT/gpu-tests.log"
exit "${PIPESTATUS[0]}"
