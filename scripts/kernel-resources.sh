#!/usr/bin/env bash
# Registers, spills and shared memory of every CUDA kernel, for the H200 by default, without a
# GPU: NVRTC and ptxas from PyPI (installed once into target/kernel-tools). Arguments go to
# scripts/kernel_resources.py (--sm 90, --head-dim 256, --gdn-dk 128, --gdn-dv 128, --only RE).
set -euo pipefail
cd "$(dirname "$0")/.."
tools=target/kernel-tools
if [ ! -x "$tools/bin/python" ]; then
  python3 -m venv "$tools"
  "$tools/bin/pip" install --quiet --disable-pip-version-check \
    nvidia-cuda-nvrtc==13.0.88 nvidia-cuda-nvcc==13.0.88
fi
site=$(echo "$PWD"/$tools/lib/python3*/site-packages)
LD_LIBRARY_PATH="$site/nvidia/cu13/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
  "$tools/bin/python" scripts/kernel_resources.py --tools "$site" "$@"
