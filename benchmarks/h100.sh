#!/usr/bin/env bash
# The GPU benchmarks, on a GPU machine with the GPU stack installed (torch, vLLM, DeepSpeed, Ray and the pins of
# benchmarks/gpu-requirements.txt; see benchmarks/README.md and benchmarks/RESULTS.md).
# Stages, each made to finish within 10 minutes:
#   bash benchmarks/h100.sh bench [--shape 7b] [--steps N] [KEY=VALUE ...]  # the RL-step benchmark (benchmarks/rl_step.py)
#                                                  # with config overrides; BENCH_TIMEOUT_S (default 420) bounds it
#   bash benchmarks/h100.sh scale N lora|full [KEY=VALUE ...]  # the scaling curve: `bench` for the 7B shape on N GPUs,
#                                                  # colocated, 3 steps, no standalone reference; LoRA (ZeRO-1) or full
#                                                  # weights (ZeRO-2), LoRA with one memory setting for 80 GB GPUs and
#                                                  # one for H200s (the same setting at every N)
#   bash benchmarks/h100.sh pipelined ROW [--long-tail] [KEY=VALUE ...]  # pipelined RL's rows on 2 GPUs, one a call:
#                                                  # `bench --gpus 2 --no-standalone` (4 steps; asynchronously 1 + s + 3 + s)
#                                                  # as sync-colocated (the default), sync-split, lag1, async1 or async2
#                                                  # (split: 1 rank + 1 engine), or lag1-colocated, async1-colocated,
#                                                  # async2-colocated (2 ranks + 2 engines); BENCH_TIMEOUT_S=560 for the
#                                                  # long tail
#   bash benchmarks/h100.sh families [SHAPE ...]     # one RL step per model family on its real shape (rl_step.py's
#                                                  # FAMILY_SHAPES), one after the other; all of them by default
#   bash benchmarks/h100.sh sl [--shape 32b] [--gpus N] [KEY=VALUE ...]  # SFT steps under ZeRO-3 (benchmarks/sl_step.py)
#   bash benchmarks/h100.sh phase ["K=V K=V" ...]   # the training phase alone: the logprobs op, config variants
#   bash benchmarks/h100.sh profile [KEY=VALUE ...]  # one train step under torch.profiler (benchmarks/train_step_profile.py)
#   bash benchmarks/h100.sh refresh [KEY=VALUE ...]  # where a colocated refresh's time goes (benchmarks/refresh_profile.py)
#   bash benchmarks/h100.sh head-epilogue          # the fused head's forward and backward with their softmax work in the
#                                                  # product's epilogue, against today's (benchmarks/probes/head_epilogue_probe.py)
#   bash benchmarks/h100.sh attention              # a packed micro-batch's attention, today's against SDPA's backends
#                                                  # on the padded sequences (benchmarks/probes/attention_probe.py)
#   bash benchmarks/h100.sh vs-verl [--gpus N] [--steps N] [--side verl|oxrl] [KEY=VALUE ...]  # verl's GRPO trainer
#                                                  # then oxrl's step on rl_step.py's work (benchmarks/vs_verl.py);
#                                                  # VERL_SITE: verl's packages; --side: one side a call, as 3 steps
#                                                  # of both outgrow a 10-minute call
#   bash benchmarks/h100.sh cuda-graphs [VARIANT ...] # the train step with each layer's kernels as CUDA graphs, against
#                                                  # today's compiled layers (benchmarks/probes/cuda_graph_probe.py)
#   bash benchmarks/h100.sh engine [--variants V,V]  # one rollout engine's tokens/s under vLLM's settings, one variant a
#                                                  # GPU at a time (benchmarks/probes/engine_probe.py)
#   bash benchmarks/h100.sh cli                    # `oxrl train sl` and `oxrl train rl` through the CLI
#   bash benchmarks/h100.sh vs-trl [--steps N] [KEY=VALUE ...] [--trl KEY=VALUE ...]
#                                                  # TRL's GRPOTrainer (colocated vLLM) then oxrl's step on rl_step.py's
#                                                  # work (benchmarks/vs_trl.py); BENCH_TIMEOUT_S (default 540) bounds both
# Logs and results go to $OUT (default ./gpu-out).
set -uo pipefail
OUT=${OUT:-gpu-out}; WORK=/tmp/oxrl-gpu; mkdir -p "$OUT" "$WORK"
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . > "$OUT/install.log" 2>&1 || { tail "$OUT/install.log"; exit 1; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/device.txt"
python3 -c "import torch, vllm, deepspeed, ray, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, '| vllm', vllm.__version__, '| deepspeed', deepspeed.__version__, '| ray', ray.__version__, '| transformers', transformers.__version__)" 2>/dev/null | tee "$OUT/versions.txt"

stage=${1:-}; shift || true
if [ "$stage" = scale ]; then
  gpus=$1 weights=$2; shift 2
  mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -n 1)
  case "$weights:$((mib > 100000))" in
    lora:1) set -- lora.enabled=true rollout.gpu_memory_utilization=0.45 train.micro_batch_size=8 train.grad_accum=64 "$@" ;;
    lora:0) set -- lora.enabled=true rollout.gpu_memory_utilization=0.4 train.micro_batch_size=4 train.grad_accum=128 "$@" ;;
    # full weights under ZeRO-2 (oxrl's default): the bf16 weights whole on every GPU, gradients and float32 Adam
    # sharded (16 bytes a parameter in all); a 7B fits 4 H200s so, 1 GPU not at all; deepspeed.zero_stage=3 shards the
    # weights too
    full:*) set -- deepspeed.zero_stage=2 rollout.gpu_memory_utilization=0.3 train.micro_batch_size=4 train.grad_accum=128 "$@" ;;
    *) echo "scale N lora|full, not $weights"; exit 2 ;;
  esac
  stage=bench; set -- --shape 7b --gpus "$gpus" --steps 3 --no-standalone "$@"
fi
if [ "$stage" = pipelined ]; then
  row=$1; shift
  split="rollout.placement=split run.train_ranks=1 rollout.engines=1 train.grad_accum=32"
  case "$row" in
    sync-colocated) set -- "$@" ;;
    sync-split) set -- "$@" $split ;;
    lag1) set -- "$@" $split rollout.lag=1 ;;
    async1) set -- --steps 6 "$@" $split rollout.max_staleness=1 ;;  # 3 steps measured: after the first 1 + s, before the last s
    async2) set -- --steps 8 "$@" $split rollout.max_staleness=2 ;;
    lag1-colocated) set -- "$@" rollout.lag=1 ;;  # engines sample on the trainers' GPUs while they train
    async1-colocated) set -- --steps 6 "$@" rollout.max_staleness=1 ;;
    async2-colocated) set -- --steps 8 "$@" rollout.max_staleness=2 ;;
    *) echo "pipelined sync-colocated|sync-split|lag1|async1|async2|lag1-colocated|async1-colocated|async2-colocated, not $row"; exit 2 ;;
  esac
  export NCCL_NVLS_ENABLE=0  # NVLink multicast off on hosts of several GPUs
  stage=bench; set -- --gpus 2 --no-standalone "$@"
fi
if [ "$stage" = bench ]; then
  echo "== benchmark: one RL step, phase by phase ($*)"
  rm -f "$WORK/rl_step.json"
  timeout "${BENCH_TIMEOUT_S:-420}" python3 benchmarks/rl_step.py --out "$WORK" --steps 4 "$@" > "$OUT/bench.log" 2>&1
  rc=$?; echo "rc=$rc"; grep -v Capturing "$OUT/bench.log" | tail -n 18; cp "$WORK/rl_step.json" "$OUT/" 2>/dev/null
  # a run cut short keeps its logs in its own folder, beside the stacks a hang (run.hang_timeout_s) wrote
  logs="$WORK/logs"; [ "$rc" = 0 ] || logs=$(ls -td "$WORK"/runs/*/logs 2>/dev/null | head -n 1)
  cp "$logs"/rank0.log "$logs"/engine0.log "$logs"/../stacks.txt "$logs"/../crash.txt "$OUT/" 2>/dev/null
  exit 0
fi

if [ "$stage" = families ]; then
  # One RL step per model family on the smallest registry entry's real shape (rl_step.py's FAMILY_SHAPES), random
  # weights: 2 steps (the first compiles and allocates), 16 prompts x 8 samples of up to 256 tokens, one at a time.
  # Each as its registry entry recommends where trainer and engine fit one 80 GB GPU together; Phi-3.5-mini's full
  # weights with Adam (61 GB) do not beside the engine's copy, so it trains LoRA on the entry's targets. Results:
  # $OUT/families.json (shape -> its rl_step.json) and $OUT/families.log; BENCH_TIMEOUT_S (default 200) bounds each.
  [ $# -gt 0 ] || set -- qwen3-0.6b llama-1b gemma3-1b gemma2-2b phi3-3.8b mistral-7b qwen3.5-27b-16l
  small="train.micro_batch_size=8 train.grad_accum=16 model.gradient_checkpointing=true"
  lora_of() {  # LoRA on the shape's registry entry's own targets
    python3 -c "import sys; sys.path.insert(0, 'benchmarks'); from rl_step import FAMILY_SHAPES
from oxrl_core.model_registry.schema import SHIPPED_DIR, entry_file_name, load_entry
entry = load_entry(SHIPPED_DIR / entry_file_name(FAMILY_SHAPES[sys.argv[1]]['entry']))
print('lora.enabled=true lora.target_modules=[' + ','.join(entry.lora_targets) + ']')" "$1"
  }
  for shape in "$@"; do
    case "$shape" in
      gemma2-2b) extra="$small rollout.gpu_memory_utilization=0.25" ;;  # Adam's states of 2.6B full weights: 42 GB
      phi3-3.8b) extra="$small $(lora_of "$shape")" ;;
      mistral-7b) extra="$small $(lora_of "$shape")" ;;
      qwen3.5-27b-16l) extra="$small $(lora_of "$shape")" ;;
      qwen3-30b-a3b*) extra="$small $(lora_of "$shape")" ;;  # 61 GB of bf16 weights a side: full depth on an H200
      *) extra="" ;;
    esac
    echo "== $shape: $extra" | tee -a "$OUT/families.log"
    timeout "${BENCH_TIMEOUT_S:-200}" python3 benchmarks/rl_step.py --out "$WORK/$shape" --shape "$shape" --steps 2 \
      --no-standalone train.batch_size=128 train.grad_accum=4 rollout.max_tokens=256 $extra >> "$OUT/families.log" 2>&1
    echo "$shape rc=$?" | tee -a "$OUT/families.log"
    rm -rf "$WORK/$shape"/*-shape "$WORK/$shape"/oxrl-tiny-*  # the weights: a 7B's fill the disk in a few runs
  done
  python3 - "$WORK" "$OUT/families.json" "$@" <<'PY'
import json, sys
from pathlib import Path
work, out, shapes = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3:]
found = {s: json.loads((work / s / "rl_step.json").read_text()) for s in shapes if (work / s / "rl_step.json").is_file()}
out.write_text(json.dumps(found, indent=2))
for s, r in found.items():
    gaps = [round(step.get("logprob_gap_abs", float("nan")), 4) for step in r["per_step"]]
    print(f"{s:16s} params {r['params'] / 1e9:6.2f}B  step {r['step_s']:6.1f} s  MFU {r['training_phase_mfu']:.1%}  gap {gaps}")
PY
  exit 0
fi

if [ "$stage" = sl ]; then
  echo "== benchmark: SFT steps ($*)"
  timeout "${BENCH_TIMEOUT_S:-420}" python3 benchmarks/sl_step.py --out "$WORK" "$@" > "$OUT/sl.log" 2>&1
  echo "rc=$?"; tail -n 6 "$OUT/sl.log"; cp "$WORK/sl_step.json" "$OUT/" 2>/dev/null
  cp "$WORK"/logs/rank0.log "$OUT/sl_rank0.log" 2>/dev/null
  exit 0
fi

if [ "$stage" = phase ]; then
  # default variants: the base config; torch.compile; and micro-batch 32. Or give your own, each one quoted argument.
  [ $# -gt 0 ] || set -- base "model.compile=true" "model.compile=true train.micro_batch_size=32 train.grad_accum=16"
  echo "== the training phase alone: the logprobs op, then the variants: $*"
  timeout 540 python3 benchmarks/train_phase.py --out "$WORK" "$@" > "$OUT/train_phase.log" 2>&1
  echo "rc=$?"; grep '^{' "$OUT/train_phase.log"; cp "$WORK/train_phase.json" "$OUT/" 2>/dev/null
  exit 0
fi

if [ "$stage" = profile ]; then
  echo "== one train step under the profiler ($*)"
  timeout 540 python3 benchmarks/train_step_profile.py "$WORK/profile" "$@" > "$OUT/profile.log" 2>&1
  echo "rc=$?"; cp "$WORK/profile/profile.txt" "$OUT/" 2>/dev/null && head -n 4 "$OUT/profile.txt"
  exit 0
fi

if [ "$stage" = vs-trl ]; then
  # trl and accelerate come staged from benchmarks/gpu-requirements.txt; each side runs in its own process, TRL
  # first; the versions each side ran with are in its JSON. Results: $OUT/vs_trl.log (the table) and $OUT/vs_trl/
  budget=${BENCH_TIMEOUT_S:-540}
  echo "== TRL GRPOTrainer vs oxrl: same work, same GPU, one after the other ($*)"
  timeout "$budget" python3 benchmarks/vs_trl.py --out "$WORK/vs_trl" --budget-s $((budget - 20)) "$@" > "$OUT/vs_trl.log" 2>&1
  echo "rc=$?"; tail -n 24 "$OUT/vs_trl.log"
  mkdir -p "$OUT/vs_trl"
  for f in vs_trl.json trl.json oxrl.json prepare.log trl.log oxrl.log; do cp "$WORK/vs_trl/$f" "$OUT/vs_trl/" 2>/dev/null; done
  run=$(ls -td "$WORK"/vs_trl/runs/*/ 2>/dev/null | head -n 1)
  [ -n "$run" ] && cp "$run"logs/rank0.log "$run"logs/engine0.log "$OUT/vs_trl/" 2>/dev/null
  exit 0
fi

if [ "$stage" = vs-verl ]; then
  # verl and what it needs beside the host's torch and vLLM, installed with `pip install --target $VERL_SITE`; each
  # side runs in its own process, verl first. Results: $OUT/vs_verl.log (the table) and $OUT/vs_verl/
  budget=${BENCH_TIMEOUT_S:-540}
  echo "== verl GRPO vs oxrl: same work, same GPUs, one after the other ($*)"
  timeout "$budget" python3 benchmarks/vs_verl.py --out "$WORK/vs_verl" --budget-s $((budget - 20)) \
    ${VERL_SITE:+--verl-site "$VERL_SITE"} "$@" > "$OUT/vs_verl.log" 2>&1
  echo "rc=$?"; tail -n 24 "$OUT/vs_verl.log"
  mkdir -p "$OUT/vs_verl"
  for f in vs_verl.json verl.json oxrl.json verl_overrides.txt prepare.log verl.log oxrl.log; do cp "$WORK/vs_verl/$f" "$OUT/vs_verl/" 2>/dev/null; done
  exit 0
fi

if [ "$stage" = engine ]; then
  echo "== one rollout engine's tokens/s under vLLM's settings ($*)"
  timeout 560 python3 benchmarks/probes/engine_probe.py --out "$WORK" --gpus "$(nvidia-smi -L | wc -l)" "$@" > "$OUT/engine_probe.log" 2>&1
  echo "rc=$?"; grep -E "tokens/s by sequences" "$OUT/engine_probe.log"
  cp "$WORK/engine_probe.json" "$OUT/" 2>/dev/null; tar czf "$OUT/engine_probe_logs.tgz" -C "$WORK" $(cd "$WORK" && ls engine_probe.*.log)
  exit 0
fi

if [ "$stage" = cuda-graphs ]; then
  echo "== the train step, each decoder layer compiled: inductor's default mode against CUDA graphs"
  timeout 540 python3 benchmarks/probes/cuda_graph_probe.py --out "$WORK" "$@" > "$OUT/cuda_graph_probe.log" 2>&1
  echo "rc=$?"; grep '^{' "$OUT/cuda_graph_probe.log"; cp "$WORK/cuda_graph_probe.json" "$OUT/" 2>/dev/null
  exit 0
fi

if [ "$stage" = attention ]; then
  echo "== a packed micro-batch's attention: torch's varlen (today) against SDPA's backends on the padded sequences"
  timeout 300 python3 benchmarks/probes/attention_probe.py --out "$WORK" > "$OUT/attention_probe.log" 2>&1
  echo "rc=$?"; tail -n 3 "$OUT/attention_probe.log"; cp "$WORK/attention_probe.json" "$OUT/" 2>/dev/null
  exit 0
fi

if [ "$stage" = head-epilogue ]; then
  echo "== the fused head, forward and backward: the softmax work after the product (today) or in its epilogue"
  timeout 300 python3 benchmarks/probes/head_epilogue_probe.py --out "$WORK" > "$OUT/head_epilogue_probe.log" 2>&1
  echo "rc=$?"; tail -n 3 "$OUT/head_epilogue_probe.log"; cp "$WORK/head_epilogue_probe.json" "$OUT/" 2>/dev/null
  exit 0
fi

if [ "$stage" = refresh ]; then
  echo "== a colocated refresh, part by part ($*)"
  timeout 400 python3 benchmarks/refresh_profile.py "$WORK/refresh" "$@" > "$OUT/refresh.log" 2>&1
  echo "rc=$?"; tail -n 9 "$OUT/refresh.log"; cp "$WORK/refresh/refresh_profile.json" "$OUT/" 2>/dev/null
  exit 0
fi

[ "$stage" = cli ] || { echo "usage: bash benchmarks/h100.sh bench [KEY=VALUE ...] | sl [...] | phase | profile | refresh | cuda-graphs | head-epilogue | attention | cli | vs-trl [...]" >&2; exit 2; }
echo "== oxrl train sl (SFT, ZeRO-3, bf16) on the same model"
timeout 100 oxrl train sl --config examples/sft_tiny.yaml model.name_or_path="$WORK/qwen2.5-0.5b-shape" train.steps=10 \
  train.lr=1e-5 run.train_ranks=1 train.grad_accum=2 run.output_dir="$WORK/cli" > "$OUT/sft.log" 2>&1
echo "rc=$?"; tail -n 8 "$OUT/sft.log"

echo "== oxrl train rl --alg cispo (colocated vLLM + DeepSpeed on one GPU)"
timeout 120 oxrl train rl --alg cispo --config "$WORK/rl_step.yaml" train.steps=1 \
  run.name=cli-cispo run.output_dir="$WORK/cli" > "$OUT/rl.log" 2>&1
echo "rc=$?"; tail -n 8 "$OUT/rl.log"
