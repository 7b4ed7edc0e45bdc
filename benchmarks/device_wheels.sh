#!/usr/bin/env bash
# The wheels a GPU machine's image lacks (python 3.12, torch 2.11, transformers 5.17, peft, accelerate,
# nvidia-ml-py, psutil, pyarrow are there), downloaded here into .whl/ at the versions .ci/constraints.txt pins,
# for a machine with no package registry. Usage, from the repository root:
#   benchmarks/device_wheels.sh            # trl, datasets and their needs, liger-kernel (about 12 MB)
#   benchmarks/device_wheels.sh --fa4      # also flash-attn-4 and the CuTe DSL (the DSL's library wheel is
#                                          # ~92 MB: split it, see below)
# There, before the first command (the same line in every call: the install goes to /tmp/site, kept while warm):
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
#       .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD
# A wheel over the 64 MiB a call may carry travels in two calls on a warm machine: `split -n 2` it into .whl/parts/,
# carry half each call, `cat` the halves into /tmp/ there and install from /tmp in the second call.
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
pin() { grep -i "^$1==" .ci/constraints.txt | head -n1 | cut -d= -f3; }
names=(trl datasets dill multiprocess xxhash GitPython gitdb smmap pydantic pydantic_core typing-inspection
       annotated-types)
specs=()
for n in "${names[@]}"; do v=$(pin "$n"); [ -n "$v" ] || { echo "no pin for $n in .ci/constraints.txt" >&2; exit 2; }
  specs+=("$n==$v"); done
specs+=("liger-kernel==0.8.5")
[ "${1:-}" = "--fa4" ] && specs+=("flash-attn-4==4.0.0b40" "nvidia-cutlass-dsl==4.8.1")
plat=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64 \
         manylinux_2_34_x86_64 manylinux_2_35_x86_64; do plat+=(--platform "$p"); done
mkdir -p .whl
for s in "${specs[@]}"; do
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${plat[@]}" \
      -d .whl "$s"
done
du -sh .whl
