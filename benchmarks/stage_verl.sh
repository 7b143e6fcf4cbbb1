#!/usr/bin/env bash
# verl's packages (benchmarks/verl-requirements.txt) as one part, .gpu/verl/verl.tar (at most 58 MB), for a GPU host
# without a package index. Run after the GPU stack's own parts are staged under .gpu/. On the host, with
# .gpu/verl copied there:
#   mkdir -p /tmp/verl-wheels && tar xf .gpu/verl/verl.tar -C /tmp/verl-wheels && python3 -m pip install -q \
#     --no-index --no-deps --target /tmp/verl-site /tmp/verl-wheels/*.whl
# then VERL_SITE=/tmp/verl-site bash benchmarks/h100.sh vs-verl [...]
set -euo pipefail
root=$(git rev-parse --show-toplevel); cache="$root/.gpu-wheels-verl"; out="$root/.gpu/verl"
grep -qx '/.gpu-wheels-verl/' "$root/.git/info/exclude" 2>/dev/null || echo '/.gpu-wheels-verl/' >> "$root/.git/info/exclude"
mkdir -p "$cache" "$out"
plat=(--platform manylinux_2_35_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64
      --platform manylinux2014_x86_64)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${plat[@]}" \
  -d "$cache" -r "$root/benchmarks/verl-requirements.txt"
# hydra-core's antlr4 runtime 4.9.3 comes only as source: a pure-Python wheel built here
python3 -m pip wheel -q --no-deps -w "$cache" antlr4-python3-runtime==4.9.3
tar cf "$out/verl.tar" -C "$cache" .
du -sh "$out/verl.tar"
