#!/usr/bin/env bash
# GPU verification on a machine with an NVIDIA GPU (issue 7, item 4):
#   ResNet-50 (batch 1 and 32) and a BERT-base encoder (batch 8, sequence 128), exported from
#   PyTorch, converted by amptool for --target cuda to float32 and float16; float16 is checked
#   against onnxruntime's float32 on the CPU (cosine >= 0.999 on every output) and
#   timed with `amptool bench` (device synchronised after every call) next to PyTorch eager
#   float32 and float16 (autocast) on the same GPU.
#
#   benchmarks/gpu_check.sh                      # all three cases, report in out/gpu_check/
#   benchmarks/gpu_check.sh --cases resnet50-b1 --rounds 3
#   PYTHON=/path/to/python benchmarks/gpu_check.sh   # default: .venv/bin/python, then python3
#
# Needs: an NVIDIA GPU and driver, the CUDA toolkit (nvcc, or NVRTC through cuda-python),
# amptool installed with its test extra and torch (CUDA build). Exit codes: 0 every check
# passed, 1 a float16 output fell below the cosine bound, 3 no GPU / toolchain here.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(dirname "$here")"

if ! command -v nvidia-smi >/dev/null 2>&1; then
    echo "gpu_check: no NVIDIA driver here (nvidia-smi not found); run this on a machine with an NVIDIA GPU" >&2
    exit 3
fi
if ! gpus="$(nvidia-smi --query-gpu=name,compute_cap --format=csv,noheader 2>/dev/null)" || [ -z "$gpus" ]; then
    echo "gpu_check: nvidia-smi sees no GPU; run this on a machine with an NVIDIA GPU" >&2
    exit 3
fi
echo "gpu_check: GPU(s): $(echo "$gpus" | paste -sd ';' -)"

python="${PYTHON:-}"
if [ -z "$python" ]; then
    if [ -x "$repo/.venv/bin/python" ]; then python="$repo/.venv/bin/python"; else python="python3"; fi
fi
if ! "$python" -c "import amptool, torch, onnxruntime" >/dev/null 2>&1; then
    echo "gpu_check: $python cannot import amptool, torch and onnxruntime; run 'make venv' and install torch" >&2
    exit 3
fi
if ! "$python" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" >/dev/null 2>&1; then
    echo "gpu_check: torch in $python has no CUDA (torch.cuda.is_available() is False); install a CUDA build of torch" >&2
    exit 3
fi

cd "$repo"
exec "$python" "$here/gpu_check.py" "$@"
