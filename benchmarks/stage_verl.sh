#!/usr/bin/env bash
# verl's packages (benchmarks/verl-requirements.txt) as one tar in parts of at most 50 MiB, .gpu/verl/p0 ... pN (a part
# and the working tree fit one `run` call's transfer), for a GPU host without a package index. Run after the GPU
# stack's own parts are staged under .gpu/. On the host, a part a call (carry .gpu/verl/pK):
#   mkdir -p /root/verl-parts && cp .gpu/verl/pK/* /root/verl-parts/
# and once all are there:
#   mkdir -p /tmp/verl-wheels && cat /root/verl-parts/verl.tar.* | tar x -C /tmp/verl-wheels && python3 -m pip install \
#     -q --no-index --no-deps --target /tmp/verl-site /tmp/verl-wheels/*.whl
# then VERL_SITE=/tmp/verl-site bash benchmarks/h100.sh vs-verl [...]
set -euo pipefail
root=$(git rev-parse --show-toplevel); cache="$root/.gpu-wheels-verl"; out="$root/.gpu/verl"
grep -qx '/.gpu-wheels-verl/' "$root/.git/info/exclude" 2>/dev/null || echo '/.gpu-wheels-verl/' >> "$root/.git/info/exclude"
mkdir -p "$cache"
plat=(--platform manylinux_2_35_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64
      --platform manylinux2014_x86_64)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${plat[@]}" \
  -d "$cache" -r "$root/benchmarks/verl-requirements.txt"
# hydra-core's antlr4 runtime 4.9.3 comes only as source: a pure-Python wheel built here
python3 -m pip wheel -q --no-deps -w "$cache" antlr4-python3-runtime==4.9.3
rm -rf "$out"; mkdir -p "$out"
tar cf - -C "$cache" . | split -b 50M -d -a 2 - "$out/verl.tar."
i=0
for part in "$out"/verl.tar.*; do mkdir -p "$out/p$i"; mv "$part" "$out/p$i/"; i=$((i + 1)); done
du -sh "$out"/p*
