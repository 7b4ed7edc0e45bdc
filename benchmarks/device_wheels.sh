#!/usr/bin/env bash
# The wheels a GPU machine's image lacks or has too old (python 3.12, torch 2.11, transformers 5.17, peft, accelerate,
# nvidia-ml-py, psutil, pyarrow are there), downloaded here into .whl/ at the versions .ci/constraints.txt pins,
# for a machine with no package registry. Usage, from the repository root:
#   benchmarks/device_wheels.sh            # trl, datasets, transformers and their needs, torchao, liger-kernel
#                                          # (about 28 MB)
#   benchmarks/device_wheels.sh --bnb      # also bitsandbytes (the trl engine's QLoRA) into .whl-bnb/ (43 MB:
#                                          # carry ".whl-bnb" in a call of its own, then install it as .whl)
#   benchmarks/device_wheels.sh --fa4      # also flash-attn-4, its needs and the CuTe DSL for CUDA 13 into
#                                          # .whl-fa4/ (the DSL's CUDA 13 library wheel is ~92 MB: split it, below)
# There, before the first command (the same line in every call: the install goes to /tmp/site, kept while warm):
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
#       .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD
# A call carries at most 64 MiB with the working tree (~9 MB), so with --fa4 the wheels travel in two calls on a
# warm machine (it is released after 30 s idle: make the second call at once). This script leaves them ready:
#   .whl-fa4/part1/  flash-attn-4's small wheels and the first half of the big one (carry ".whl-fa4/part1")
#   .whl-fa4/part2/  the second half (carry ".whl" and ".whl-fa4/part2")
# First call:  mkdir -p /tmp/fa4 && cp .whl-fa4/part1/* /tmp/fa4/
# Second call: cat /tmp/fa4/cu13.part00 .whl-fa4/part2/cu13.part01 > /tmp/fa4/$(cat .whl-fa4/part2/NAME) &&
#              python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
#                  --target /tmp/site .whl/*.whl /tmp/fa4/*.whl &&
#              export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages:$PWD
# (the CuTe DSL puts its `cutlass` package on the path with a .pth file, which a --target folder on PYTHONPATH does
# not run: without the second entry flash-attn-4 imports but its kernels fail with "No module named 'cutlass'")
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
pin() { grep -i "^$1==" .ci/constraints.txt | head -n1 | cut -d= -f3; }
names=(trl datasets dill multiprocess xxhash GitPython gitdb smmap pydantic pydantic_core typing-inspection
       annotated-types torchao)
specs=()
for n in "${names[@]}"; do v=$(pin "$n"); [ -n "$v" ] || { echo "no pin for $n in .ci/constraints.txt" >&2; exit 2; }
  specs+=("$n==$v"); done
specs+=("liger-kernel==0.8.5")
# transformers at the supported lower bound or above (runner/versions.py; the image has 5.17, which preflight
# refuses) with what it needs newer than the image: huggingface_hub 1.31 is the lowest transformers 5.24 takes (its
# own needs are older than 2.x's).
specs+=("transformers==$(pin transformers)" "tokenizers==$(pin tokenizers)" "safetensors==$(pin safetensors)"
        "huggingface_hub==1.31.0" "click==$(pin click)" "hf-xet==$(pin hf-xet)")
plat=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64 \
         manylinux_2_34_x86_64 manylinux_2_35_x86_64; do plat+=(--platform "$p"); done
mkdir -p .whl
for s in "${specs[@]}"; do
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${plat[@]}" \
      -d .whl "$s"
done
du -sh .whl
if [ "${1:-}" = "--bnb" ]; then
  mkdir -p .whl-bnb
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${plat[@]}" \
      -d .whl-bnb bitsandbytes==0.50.2
  du -sh .whl-bnb
  exit 0
fi
[ "${1:-}" = "--fa4" ] || exit 0
# flash-attn-4 and what it needs that the image lacks; the CuTe DSL's libraries for the image's CUDA 13.
grep -qx '/.whl-fa4/' .git/info/exclude 2>/dev/null || echo '/.whl-fa4/' >> .git/info/exclude
rm -rf .whl-fa4 && mkdir -p .whl-fa4/part1 .whl-fa4/part2 .whl-fa4/big
# Pinned at the versions measured in packcheck-h200.md (what flash-attn-4 4.0.0b40 asked for resolved to these).
for s in flash-attn-4==4.0.0b40 nvidia-cutlass-dsl==4.8.1 nvidia-cutlass-dsl-libs-base==4.8.1 \
         nvidia-cutlass-dsl-libs-core==4.8.1 quack-kernels==0.6.5 apache-tvm-ffi==0.1.15.post2 \
         torch-c-dlpack-ext==0.1.5 einops==0.8.2; do
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${plat[@]}" \
      -d .whl-fa4/part1 "$s"
done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${plat[@]}" \
    -d .whl-fa4/big nvidia-cutlass-dsl-libs-cu13==4.8.1
big=$(ls .whl-fa4/big)
split -n 2 -d ".whl-fa4/big/$big" .whl-fa4/big/cu13.part
mv .whl-fa4/big/cu13.part00 .whl-fa4/part1/ && mv .whl-fa4/big/cu13.part01 .whl-fa4/part2/
echo "$big" > .whl-fa4/part2/NAME && rm -rf .whl-fa4/big
du -sh .whl-fa4/part1 .whl-fa4/part2
